"""The tests' one helper module: random q/k/v, tolerances per dtype, oracles and behavioural checks.

``tests/`` is on ``sys.path`` (pytest puts the folder of the root ``conftest.py`` there),
so any test imports it as ``from helpers import rand_qkv, tol``. Keep it free of test
functions. Sections:

* inputs: :func:`rand_qkv`, :func:`smooth_sequences`;
* tolerances: :data:`TOLERANCES` (one kernel against its oracle), :data:`LOOSE_TOLERANCES`
  (compositions: a mechanism against exact attention under its pattern), :func:`tol`,
  :data:`TOL`, :data:`PARITY_TOL` (a pretrained model against ``transformers``); low precision
  is judged against plain PyTorch's own error (:func:`assert_low_precision_error`);
* the attention grid: :data:`ATTENTION_CASES` (awkward sizes and mask kinds), :func:`case_id`,
  :func:`make_mask`; graphs: :func:`random_edges` (isolated nodes, multi-edges, self-loops);
* oracles, re-stated independently of attnlab's code: :func:`naive_attention`,
  :func:`exact`, :func:`reference`, :func:`kernel_direct`, :func:`causal_cumsum_naive`;
* behavioural checks: :func:`assert_no_future_leak`, :func:`future_change`,
  :func:`check_padding_invariance`, :func:`gradcheck`, :func:`check_low_precision`,
  :func:`assert_linear_cost`, :func:`tensor_peak_bytes`;
* tiny training: :func:`train_losses` on two toy tasks, :func:`assert_loss_falls`.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries,
``M`` keys, ``D`` head dim, ``Dv`` value dim.
"""

from __future__ import annotations

import copy
import math
import os
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attnlab
from attnlab import masks
from attnlab.bench.suite import Case
from attnlab.mechanisms import Mechanism

# -- inputs ---------------------------------------------------------------------------------------


def fetched(name: str):
    """The folder of data set ``name`` (:func:`attnlab.data.locate`); the test is skipped, naming the
    fetch command, when it is not fetched (a fresh clone has none until ``attnlab data fetch``)."""
    import pytest

    from attnlab.data import MissingDataError, locate

    try:
        return locate(name)
    except MissingDataError:
        pytest.skip(f"the {name} data set is not fetched: attnlab data fetch {name} (or --from DIR)")


def rand_qkv(B: int = 1, H: int = 2, N: int = 8, D: int = 8, *, M: int | None = None, Hkv: int | None = None,
             Dv: int | None = None, dtype: torch.dtype = torch.float64, gen: torch.Generator | None = None,
             seed: int = 0, scale: float = 1.0, requires_grad: bool = False,
             draw_dtype: torch.dtype | None = torch.float64,
             device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
    """Random ``q (B, H, N, D)``, ``k (B, Hkv, M, D)``, ``v (B, Hkv, M, Dv)`` on ``device``.

    Drawn on the CPU from ``gen`` when given, else from a generator seeded with ``seed``,
    in ``draw_dtype`` and then cast to ``dtype`` (float64 draws give every dtype the same
    numbers, rounded; ``draw_dtype=None`` draws in ``dtype`` itself, which gives other
    numbers for the same seed). ``M``, ``Hkv``, ``Dv`` default to ``N``, ``H``, ``D``;
    ``scale`` multiplies q and k (smaller scores: approximations are closer to exact).
    """
    g = gen if gen is not None else torch.Generator().manual_seed(seed)
    M = N if M is None else M
    Hkv = H if Hkv is None else Hkv
    Dv = D if Dv is None else Dv
    draw = dtype if draw_dtype is None else draw_dtype
    q = torch.randn(B, H, N, D, generator=g, dtype=draw) * scale
    k = torch.randn(B, Hkv, M, D, generator=g, dtype=draw) * scale
    v = torch.randn(B, Hkv, M, Dv, generator=g, dtype=draw)
    q, k, v = q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def smooth_sequences(B: int, H: int, N: int, D: int, gen: torch.Generator, freqs: int = 3,
                     dtype: torch.dtype = torch.float64) -> Tensor:
    """``(B, H, N, D)`` sequences that vary slowly with position: random mixes of the
    first ``freqs`` Fourier modes, so the ``N x D`` matrix has rank ``2 freqs + 1``.

    On such inputs pooling positions (landmarks, projected rows) loses little, and
    loses less the more rows are kept."""
    t = torch.linspace(0, 1, N, dtype=dtype)
    modes = [torch.ones_like(t)]
    for i in range(1, freqs + 1):
        modes += [torch.sin(2 * math.pi * i * t), torch.cos(2 * math.pi * i * t)]
    basis = torch.stack(modes, dim=-1)  # (N, r)
    coef = torch.randn(B, H, basis.shape[-1], D, generator=gen, dtype=dtype)
    return basis @ coef  # (B, H, N, D)


# -- tolerances -----------------------------------------------------------------------------------

#: (rtol, atol) of one kernel against its float64 oracle, per dtype
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 2e-6),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}

#: (rtol, atol) of compositions (a mechanism against exact attention under its pattern, gradients)
LOOSE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-10),
    torch.float32: (1e-4, 2e-5),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (5e-3, 5e-3),
}


def tol(dtype: torch.dtype, loose: bool = False) -> dict[str, float]:
    """``dict(rtol=..., atol=...)`` for ``torch.testing.assert_close`` in ``dtype``."""
    rtol, atol = (LOOSE_TOLERANCES if loose else TOLERANCES)[dtype]
    return {"rtol": rtol, "atol": atol}


#: ``TOL[dtype]``: the loose tolerances as keyword dicts (compositions of kernels)
TOL: dict[torch.dtype, dict[str, float]] = {dt: tol(dt, loose=True) for dt in LOOSE_TOLERANCES}

#: float32 parity of a whole pretrained model with ``transformers``' implementation of it
PARITY_TOL: dict[str, float] = {"rtol": 1e-5, "atol": 1e-5}


def rel_err(a: Tensor, b: Tensor) -> float:
    """Relative Frobenius error ``|a - b| / |b|``."""
    return ((a - b).norm() / b.norm()).item()


def assert_low_precision_error(got: Tensor, plain: Tensor, ref: Tensor, factor: float = 2.0) -> None:
    """``got``'s largest error against the float64 ``ref`` is at most ``factor`` times plain PyTorch's (``plain``).

    Plain PyTorch's rows that are all masked are NaN; they count as the zeros attnlab returns.
    The floor of 4 units in the last place of the dtype at ``ref``'s scale keeps exact zeros fair.
    """
    ref64 = ref.double()
    err = (got.double() - ref64).abs().max().item()
    base = (torch.nan_to_num(plain.double(), nan=0.0) - ref64).abs().max().item()
    floor = 4 * torch.finfo(got.dtype).eps * max(1.0, ref64.abs().max().item())
    assert err <= factor * base + floor, f"{got.dtype}: error {err:.3g} vs plain torch's {base:.3g}"


# -- the attention grid ---------------------------------------------------------------------------

#: awkward sizes for exact attention against its oracle: ``(B, H, Hkv, N, M, D, Dv, mask kind)``
ATTENTION_CASES: list[tuple[int, int, int, int, int, int, int, str]] = [
    (1, 1, 1, 1, 1, 40, 40, "none"),
    (1, 1, 1, 1, 1, 40, 40, "causal"),
    (2, 9, 9, 97, 97, 59, 59, "causal"),
    (2, 9, 3, 97, 61, 40, 40, "random"),
    (2, 6, 2, 33, 97, 64, 24, "padding"),
    (2, 6, 2, 33, 97, 64, 64, "padding_empty"),
    (1, 6, 1, 97, 33, 64, 64, "causal"),  # N > M: the first rows see no key
    (1, 2, 2, 1, 97, 40, 40, "causal"),  # one query over a cache of 97
    (2, 6, 2, 97, 97, 40, 59, "window"),
    (2, 6, 1, 97, 97, 40, 40, "global"),
    (2, 2, 2, 61, 97, 59, 59, "document"),
    (1, 9, 3, 97, 97, 40, 40, "prefix_lm"),
    (2, 6, 6, 17, 97, 40, 40, "key_mask"),
    (2, 6, 2, 97, 40, 9, 9, "random_bool"),
    (1, 2, 1, 1025, 1025, 64, 64, "causal"),
    (1, 1, 1, 1025, 97, 40, 40, "window"),
    (1, 2, 2, 97, 1025, 40, 40, "none"),
]


def case_id(case: tuple) -> str:
    """The test id of one of :data:`ATTENTION_CASES`, e.g. ``B2H9kv3N97M61D40Dv40-random``."""
    B, H, Hkv, N, M, D, Dv, kind = case
    return f"B{B}H{H}kv{Hkv}N{N}M{M}D{D}Dv{Dv}-{kind}"


def make_mask(kind: str, B: int, H: int, N: int, M: int, g: torch.Generator):
    """A mask of the named kind for these sizes (None for "none"); random kinds draw from ``g``."""
    if kind == "none":
        return None
    if kind == "causal":
        return masks.causal()
    if kind == "window":
        return masks.sliding_window(5, 2)
    if kind == "padding":
        return masks.padding(torch.randint(0, M + 1, (B,), generator=g).tolist()[:-1] + [max(1, M // 2)])
    if kind == "padding_empty":
        return masks.padding([0] + [M] * (B - 1))
    if kind == "global":
        return masks.sliding_window(2, 2) | masks.global_tokens([0, M // 2])
    if kind == "document":
        return masks.document(torch.randint(0, 3, (B, M), generator=g).sort(-1).values) & masks.causal()
    if kind == "prefix_lm":
        return masks.prefix_lm(min(4, M))
    if kind == "key_mask":
        return masks.key_mask(torch.rand(B, M, generator=g) > 0.3)
    if kind == "random":  # per-head random, with fully masked rows
        a = torch.rand(B, H, N, M, generator=g) > 0.5
        a[:, :, :: max(1, N // 3)] = False
        return masks.dense(a)
    if kind == "random_bool":  # a plain bool tensor, broadcast over heads
        a = torch.rand(B, 1, N, M, generator=g) > 0.3
        a[0, 0, 0] = False
        return a
    raise AssertionError(kind)


# -- graphs -----------------------------------------------------------------------------------------


def random_edges(num_src: int, num_dst: int | None = None, edges: int | None = None, *, seed: int = 0,
                 isolated: int = 1, duplicates: int = 2, self_loops: bool | None = True) -> Tensor:
    """A random ``(2, E)`` edge list (row 0 sources, row 1 targets) with the awkward cases on purpose.

    The first ``isolated`` targets get no incoming edge (kept below ``num_dst``), ``duplicates``
    edges appear twice (a multigraph), and ``self_loops`` True adds ``i -> i`` for a few nodes,
    False removes every self-loop, None leaves the random draw as it is. ``edges`` defaults to
    three per target.
    """
    num_dst = num_src if num_dst is None else num_dst
    g = torch.Generator().manual_seed(seed)
    n = 3 * num_dst if edges is None else edges
    iso = min(isolated, num_dst - 1)
    src = torch.randint(0, num_src, (n,), generator=g)
    dst = torch.randint(iso, num_dst, (n,), generator=g) if num_dst > iso else torch.zeros(n, dtype=torch.long)
    if self_loops:
        loops = torch.arange(iso, max(iso, min(num_src, num_dst)))[:3]  # none when every shared id is isolated
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    elif self_loops is False:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    if duplicates and src.numel():
        pick = torch.randint(0, src.numel(), (duplicates,), generator=g)
        src, dst = torch.cat([src, src[pick]]), torch.cat([dst, dst[pick]])
    perm = torch.randperm(src.numel(), generator=g)  # not sorted by target: the kernels must sort
    return torch.stack([src[perm], dst[perm]])


# -- oracles --------------------------------------------------------------------------------------


def repeat_heads(x: Tensor, H: int) -> Tensor:
    """Grouped-query expansion ``(B, Hkv, L, D) -> (B, H, L, D)``."""
    return x.repeat_interleave(H // x.shape[1], dim=1)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, scale: float | None = None) -> Tensor:
    """The textbook formula in plain torch, entirely in the inputs' dtype.

    ``allowed`` is a bool tensor broadcastable to ``(B, H, N, M)``. Rows with no allowed
    key give NaN, as plain softmax does; this is the yardstick for low-precision error,
    not an oracle.
    """
    k = repeat_heads(k, q.shape[1])  # (B, H, M, D)
    v = repeat_heads(v, q.shape[1])  # (B, H, M, Dv)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, N, M)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1) @ v  # (B, H, N, Dv)


def exact(q: Tensor, k: Tensor, v: Tensor, mask=None) -> Tensor:
    """Exact softmax attention (the ``math`` backend)."""
    return attnlab.attention(q, k, v, mask=mask, backend="math")


def reference(q: Tensor, k: Tensor, v: Tensor, **kw) -> Tensor:
    """The float64 oracle (the ``reference`` backend), on float64 copies of every tensor argument."""
    bias = kw.get("bias")
    if isinstance(bias, torch.Tensor):
        kw["bias"] = bias.double()
    return attnlab.attention(q.double(), k.double(), v.double(), backend="reference", **kw)


def kernel_direct(qf: Tensor, kf: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """The kernelized formula the O(N^2) way: ``A = phi(Q) phi(K)^T``, ``A V / A 1``.

    Causal is bottom-right aligned (query ``i`` sees keys ``<= i + M - N``); rows that
    see nothing are zero.
    """
    H, N, M = qf.shape[1], qf.shape[2], kf.shape[2]
    a = qf @ repeat_heads(kf, H).transpose(-1, -2)  # (B, H, N, M)
    if causal:
        a = a * torch.ones(N, M, dtype=a.dtype).tril(M - N)
    den = a.sum(-1, keepdim=True)
    return (a @ repeat_heads(v, H)) / torch.where(den == 0, torch.ones_like(den), den)  # (B, H, N, Dv)


def causal_cumsum_naive(qf: Tensor, kf: Tensor, v: Tensor) -> Tensor:
    """Causal kernel attention by full prefix sums ``(B, H, N, m, Dv)`` (N == M only)."""
    H = qf.shape[1]
    kf, v = repeat_heads(kf, H), repeat_heads(v, H)
    kv = torch.cumsum(kf[..., :, None] * v[..., None, :], dim=2)  # (B, H, N, m, Dv)
    z = torch.cumsum(kf, dim=2)  # (B, H, N, m)
    num = (qf[..., None] * kv).sum(-2)  # (B, H, N, Dv)
    den = (qf * z).sum(-1, keepdim=True)  # (B, H, N, 1)
    return num / den


# -- behavioural checks ---------------------------------------------------------------------------


def assert_no_future_leak(fn, q: Tensor, k: Tensor, v: Tensor, *, perturb_q: bool = False) -> None:
    """Causal check: changing keys/values after position ``t`` leaves outputs ``0..t`` unchanged.

    ``fn(q, k, v) -> out``; square self-attention (N == M). With ``perturb_q`` the
    queries after ``t`` are perturbed too (for shared-QK mechanisms whose keys are q).
    The later outputs must change (the perturbation reached them).
    """
    N = q.shape[2]
    base = fn(q, k, v)
    for t in sorted({0, N // 3, N // 2, N - 2}):
        if t < 0 or t >= N - 1:
            continue
        g = torch.Generator().manual_seed(t + 1)
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        k2[:, :, t + 1 :] = torch.randn(k2[:, :, t + 1 :].shape, generator=g, dtype=k.dtype) * 3
        v2[:, :, t + 1 :] = torch.randn(v2[:, :, t + 1 :].shape, generator=g, dtype=v.dtype) * 3
        if perturb_q:
            q2[:, :, t + 1 :] = torch.randn(q2[:, :, t + 1 :].shape, generator=g, dtype=q.dtype) * 3
        out = fn(q2, k2, v2)
        torch.testing.assert_close(out[:, :, : t + 1], base[:, :, : t + 1], **TOL[q.dtype])
        assert not torch.allclose(out[:, :, t + 1 :], base[:, :, t + 1 :])


def future_change(mech: Mechanism, q: Tensor, k: Tensor, v: Tensor, mask, gen: torch.Generator) -> list[float]:
    """Perturb keys and values after each cut position; return, per cut, the largest
    change of the outputs of queries that may not see them (causal, N == M)."""
    out = mech(q, k, v, mask)
    N = q.shape[2]
    changes = []
    for cut in (0, N // 3, N - 2):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, cut + 1:] += 3 * torch.randn(k2[:, :, cut + 1:].shape, generator=gen, dtype=k.dtype)
        v2[:, :, cut + 1:] += 3 * torch.randn(v2[:, :, cut + 1:].shape, generator=gen, dtype=v.dtype)
        out2 = mech(q, k2, v2, mask)
        changes.append((out2[:, :, : cut + 1] - out[:, :, : cut + 1]).abs().max().item())
    return changes


def check_padding_invariance(mech: Mechanism, q: Tensor, k: Tensor, v: Tensor, lengths: list[int], **tol_) -> None:
    """A padded batch (key padding mask; self-attention) equals each row run alone on its
    unpadded length, and garbage in padded keys/values changes nothing."""
    mask = attnlab.masks.padding(lengths)
    out = mech(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(lengths):
        k2[b, :, n:] = 1e3
        v2[b, :, n:] = -1e3
    torch.testing.assert_close(mech(q, k2, v2, mask), out, **tol_)
    for b, n in enumerate(lengths):
        alone = mech(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(out[b : b + 1, :, :n], alone, **tol_)


def gradcheck(fn, inputs: tuple[Tensor, ...]) -> bool:
    """``torch.autograd.gradcheck`` (float64 inputs) on one thread: many tiny calls."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.autograd.gradcheck(fn, tuple(t.requires_grad_() for t in inputs))
    finally:
        torch.set_num_threads(threads)


def check_low_precision(mech: Mechanism, q: Tensor, k: Tensor, v: Tensor, mask=None, factor: float = 3.0) -> None:
    """In bfloat16 and float16 the mechanism's error against itself in float64 stays within
    ``factor`` times plain exact attention's error in that dtype (against float64)."""
    ref = mech.double()(q, k, v, mask)
    exact64 = exact(q, k, v, mask)
    for dt in (torch.bfloat16, torch.float16):
        low = copy.deepcopy(mech).to(dt)
        out = low(q.to(dt), k.to(dt), v.to(dt), mask)
        assert out.dtype == dt
        base = rel_err(exact(q.to(dt), k.to(dt), v.to(dt), mask).double(), exact64)
        err = rel_err(out.double(), ref)
        assert err <= factor * base, f"{dt}: error {err:.3g} vs exact attention's {base:.3g}"


def assert_linear_cost(mech: Mechanism, n: int = 4096, D: int = 64, H: int = 8, lo: float = 1.6, hi: float = 2.6,
                       **kw) -> None:
    """``cost()`` is positive and grows about linearly (O(N), not O(N^2)) over two doublings of N."""
    costs = [mech.cost(m, m, D, H, **kw) for m in (n, 2 * n, 4 * n)]
    for c in costs:
        assert c.flops > 0 and c.bytes > 0
    for a, b in zip(costs, costs[1:]):
        assert lo <= b.flops / a.flops <= hi, (a, b)
        assert lo <= b.bytes / a.bytes <= hi, (a, b)


class TensorPeak(TorchDispatchMode):
    """Peak bytes of the CPU tensors created inside the ``with`` block: a tracemalloc for torch ops.

    Every op's new output storage counts from its creation until the tensor that first
    held it is collected. Exact and deterministic, unlike the process RSS, which a long
    test process's freed heap hides. Views that outlive their base are not counted
    (a lower bound in that case).
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._owners: dict[int, weakref.finalize] = {}

    def _free(self, key: int, nbytes: int) -> None:
        if self._owners.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor) and t.device.type == "cpu" and t.layout == torch.strided:
                storage = t.untyped_storage()  # (a sparse tensor's own storage is its parts', counted there)
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes == 0 or key in self._owners:
                    continue  # in place, a view, or already counted
                self._owners[key] = weakref.finalize(t, self._free, key, nbytes)
                self.live += nbytes
                self.peak = max(self.peak, self.live)
        return out


def tensor_peak_bytes(fn) -> int:
    """Peak bytes of the tensors ``fn()`` creates (see :class:`TensorPeak`)."""
    with TensorPeak() as peak:
        fn()
    return peak.peak


# -- tiny training ----------------------------------------------------------------------------------


class TinyModel(nn.Module):
    """Embedding (+ learned positions) -> q/k/v projections -> mechanism -> output head (+ residual)."""

    def __init__(self, mechanism: Mechanism, vocab: int = 8, dim: int = 32, heads: int = 4, seq_len: int = 32,
                 classes: int | None = None):
        super().__init__()
        self.heads, self.mechanism = heads, mechanism
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.5)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, classes or vocab)

    def forward(self, tokens: Tensor, mask=None) -> Tensor:
        B, N = tokens.shape
        x = self.emb(tokens) + self.pos[:N]  # (B, N, dim)
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, dh)
        y = self.mechanism(q, k, v, mask)  # (B, H, N, dh)
        y = y.transpose(1, 2).reshape(B, N, -1)  # (B, N, dim)
        return self.head(y + x)  # (B, N, vocab or classes)


def _first_token_batch(gen: torch.Generator, B: int, N: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Every position predicts the first token (visible to every query, also under a causal mask)."""
    tokens = torch.randint(0, vocab, (B, N), generator=gen)
    return tokens, tokens[:, :1].expand(-1, N)


def _class_token_batch(gen: torch.Generator, B: int, N: int, vocab: int, classes: int = 4) -> tuple[Tensor, Tensor]:
    """Each sequence has a class ``y``; half its tokens are the class token, the rest noise; every position predicts y."""
    y = torch.randint(0, classes, (B, 1), generator=gen)
    noise = torch.randint(classes, vocab, (B, N), generator=gen)
    signal = torch.rand(B, N, generator=gen) < 0.5
    return torch.where(signal, y.expand(B, N), noise), y.expand(B, N)


def train_losses(mechanism: Mechanism, steps: int = 30, seq_len: int = 24, causal: bool = False, seed: int = 0,
                 lr: float = 3e-2, task: str = "first_token", mask=None) -> list[float]:
    """Train :class:`TinyModel` with ``mechanism`` for ``steps`` Adam steps; return the losses.

    ``task``: ``"first_token"`` (every position predicts the first token; vocabulary 8) or
    ``"class_token"`` (every position predicts the sequence's class, half its tokens; vocabulary 12).
    ``mask`` defaults to ``causal()`` when ``causal`` else None.
    """
    if task not in ("first_token", "class_token"):
        raise ValueError(f"task must be 'first_token' or 'class_token', got {task!r}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is faster, and the test machine is shared
    try:
        torch.manual_seed(seed)
        vocab = 8 if task == "first_token" else 12
        model = TinyModel(mechanism, vocab=vocab, seq_len=seq_len, classes=None if task == "first_token" else 4)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(seed)
        if mask is None and causal:
            mask = attnlab.masks.causal()
        losses = []
        for _ in range(steps):
            if task == "first_token":
                tokens, target = _first_token_batch(gen, 16, seq_len, vocab)
            else:
                tokens, target = _class_token_batch(gen, 16, seq_len, vocab)
            logits = model(tokens, mask)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


def assert_loss_falls(losses: list[float], factor: float = 0.8) -> None:
    """Mean of the last 5 losses is below ``factor`` times the mean of the first 5."""
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < factor * first, f"loss did not fall: first5 {first:.4f}, last5 {last:.4f}"


# -- bench runs -----------------------------------------------------------------------------------

#: the RunOptions fields of a bench run small enough for a unit test
BENCH_TINY = {"lengths": (64, 128), "repeats": 1, "budget_s": 0.05, "ceiling_size": 128, "copy_mb": 4,
              "progress": False, "echo": False}


@dataclass(frozen=True)
class UnitCase(Case):
    """A case of a test's own suite: a name and no shape (a subclass sets the test suite's ``suite``)."""

    mask: ClassVar[str] = "none"
    N: ClassVar[int] = 1
    B: ClassVar[int] = 1
    H: ClassVar[int] = 1
    D: ClassVar[int] = 1

    name: str
    kind: str
    mode: str
    fail: bool = False


def bench_options(out_dir, **fields):
    """A tiny :class:`attnlab.bench.RunOptions` writing into ``out_dir`` (``fields`` override :data:`BENCH_TINY`)."""
    from attnlab.bench import RunOptions

    # a result cache of its own: a test measures what it asks for, never another test's cached case
    fields.setdefault("cache_dir", os.path.join(str(out_dir), "result-cache"))
    return RunOptions(out_dir=str(out_dir), **{**BENCH_TINY, **fields})


def check_bench_outputs(res: dict, out: str) -> None:
    """The files of a finished bench run: results.json equal to ``res`` and valid, plots inlined, verdicts shown."""
    import json
    import os
    import re

    from attnlab.bench import validate

    for f in ("results.json", "report.md", "report.html"):
        assert os.path.getsize(os.path.join(out, f)) > 0, f
    with open(os.path.join(out, "results.json")) as f:
        on_disk = json.load(f)
    assert validate(on_disk) == []
    assert on_disk["cases"] == json.loads(json.dumps(res["cases"]))
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    assert pngs == sorted(res["plots"]) and set(res["key_plots"]) <= set(pngs)
    with open(os.path.join(out, "report.html")) as f:
        page = f.read()
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,[A-Za-z0-9+/=]+"', page)) == len(pngs)
    assert "http://" not in page and "https://" not in page
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    for p in pngs:
        assert f"({p})" in md
    for v in res["verdicts"]:
        assert v["text"] in md


def check_bench_figures(res: dict) -> None:
    """Every ok case has positive, finite figures; every other case has a reason."""
    for c in res["cases"]:
        if c["status"] == "ok":
            assert c["reason"] is None
            assert c["time_s"] > 0 and math.isfinite(c["time_s"])
            assert c["times_s"] and all(t > 0 and math.isfinite(t) for t in c["times_s"])
            assert c["peak_bytes"] is not None and c["peak_bytes"] >= 0
            if c["flops"] is not None:
                assert c["flops"] > 0 and c["gflops"] > 0 and math.isfinite(c["gflops"])
                assert c["frac_of_ceiling"] > 0
            if c["mode"] == "fwd" and c["kind"] not in ("layer",):
                assert c["error"] is not None and 0 <= c["error"] < float("inf")
        else:
            assert c["reason"], f"{c['name']} {c['status']} without a reason"
    for k, v in res["ceilings"]["matmul_gflops"].items():
        assert v is not None and v > 0 and math.isfinite(v), k
    assert res["ceilings"]["copy_gbps"] > 0
