"""Test helpers for the kernelized / low-rank mechanisms (Linformer, Performer, linear, Nyström).

Imported by ``test_linformer.py``, ``test_performer.py``, ``test_linear.py`` and
``test_nystrom.py`` (which put this folder on ``sys.path``). Independent re-statements
of the formulas live here so the tests never check a mechanism against its own code.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import attnlab
from attnlab.mechanisms import Mechanism


def rel_err(a: Tensor, b: Tensor) -> float:
    """Relative Frobenius error ``|a - b| / |b|``."""
    return ((a - b).norm() / b.norm()).item()


def rand_qkv(
    B: int, H: int, Hkv: int, N: int, M: int, D: int, Dv: int, gen: torch.Generator,
    dtype: torch.dtype = torch.float64, scale: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Random ``q (B, H, N, D)``, ``k (B, Hkv, M, D)``, ``v (B, Hkv, M, Dv)``."""
    q = torch.randn(B, H, N, D, generator=gen, dtype=dtype) * scale
    k = torch.randn(B, Hkv, M, D, generator=gen, dtype=dtype) * scale
    v = torch.randn(B, Hkv, M, Dv, generator=gen, dtype=dtype)
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


def exact(q: Tensor, k: Tensor, v: Tensor, mask=None) -> Tensor:
    """Exact softmax attention (the ``math`` backend)."""
    return attnlab.attention(q, k, v, mask=mask, backend="math")


def repeat_heads(x: Tensor, H: int) -> Tensor:
    """Grouped-query expansion ``(B, Hkv, L, D) -> (B, H, L, D)``."""
    return x.repeat_interleave(H // x.shape[1], dim=1)


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
    out = (a @ repeat_heads(v, H)) / torch.where(den == 0, torch.ones_like(den), den)
    return out


def causal_cumsum_naive(qf: Tensor, kf: Tensor, v: Tensor) -> Tensor:
    """Causal kernel attention by full prefix sums ``(B, H, N, m, Dv)`` (N == M only)."""
    H = qf.shape[1]
    kf, v = repeat_heads(kf, H), repeat_heads(v, H)
    kv = torch.cumsum(kf[..., :, None] * v[..., None, :], dim=2)  # (B, H, N, m, Dv)
    z = torch.cumsum(kf, dim=2)  # (B, H, N, m)
    num = (qf[..., None] * kv).sum(-2)  # (B, H, N, Dv)
    den = (qf * z).sum(-1, keepdim=True)  # (B, H, N, 1)
    return num / den


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


def check_padding_invariance(mech: Mechanism, q: Tensor, k: Tensor, v: Tensor, lengths: list[int], **tol) -> None:
    """A padded batch (key padding mask; self-attention) equals each row run alone on its
    unpadded length, and garbage in padded keys/values changes nothing."""
    mask = attnlab.masks.padding(lengths)
    out = mech(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(lengths):
        k2[b, :, n:] = 1e3
        v2[b, :, n:] = -1e3
    torch.testing.assert_close(mech(q, k2, v2, mask), out, **tol)
    for b, n in enumerate(lengths):
        alone = mech(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(out[b : b + 1, :, :n], alone, **tol)


def check_cost_linear(mech: Mechanism, **kw) -> None:
    """``cost`` is positive and grows about linearly in the sequence length."""
    costs = [mech.cost(n, n, 64, 8, **kw) for n in (4096, 8192, 16384)]
    for c in costs:
        assert c.flops > 0 and c.bytes > 0
    for a, b in zip(costs, costs[1:]):
        assert 1.7 <= b.flops / a.flops <= 2.3, (a, b)
        assert 1.7 <= b.bytes / a.bytes <= 2.3, (a, b)


class TinyModel(nn.Module):
    """Embedding (+ learned positions) -> q/k/v projections -> mechanism -> output head."""

    def __init__(self, mechanism: Mechanism, vocab: int = 8, dim: int = 32, heads: int = 4, seq_len: int = 24):
        super().__init__()
        self.heads, self.mechanism = heads, mechanism
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.5)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: Tensor, mask=None) -> Tensor:
        B, N = tokens.shape
        x = self.emb(tokens) + self.pos[:N]  # (B, N, dim)
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, dh)
        y = self.mechanism(q, k, v, mask)  # (B, H, N, dh)
        y = y.transpose(1, 2).reshape(B, N, -1)  # (B, N, dim)
        return self.head(y + x)  # (B, N, vocab)


def train_losses(mechanism: Mechanism, steps: int = 30, seq_len: int = 24, causal: bool = False,
                 seed: int = 0, lr: float = 3e-2) -> list[float]:
    """Train :class:`TinyModel` on "every position predicts the first token" (position 0 is
    visible to every query, also under a causal mask); return the losses."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is faster, and the test machine is shared
    try:
        torch.manual_seed(seed)
        vocab = 8
        model = TinyModel(mechanism, vocab=vocab, seq_len=seq_len)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(seed)
        mask = attnlab.masks.causal() if causal else None
        losses = []
        for _ in range(steps):
            tokens = torch.randint(0, vocab, (16, seq_len), generator=gen)
            target = tokens[:, :1].expand(-1, seq_len)
            logits = model(tokens, mask)
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))
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
    import copy

    ref = mech.double()(q, k, v, mask)
    exact64 = exact(q, k, v, mask)
    for dt in (torch.bfloat16, torch.float16):
        low = copy.deepcopy(mech).to(dt)
        out = low(q.to(dt), k.to(dt), v.to(dt), mask)
        assert out.dtype == dt
        base = rel_err(exact(q.to(dt), k.to(dt), v.to(dt), mask).double(), exact64)
        err = rel_err(out.double(), ref)
        assert err <= factor * base, f"{dt}: error {err:.3g} vs exact attention's {base:.3g}"
