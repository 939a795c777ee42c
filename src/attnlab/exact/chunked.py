"""The ``chunked`` backend: online softmax over (query-block, key-block) tiles.

The algorithm of FlashAttention (Dao et al., 2022, "FlashAttention: Fast and
Memory-Efficient Exact Attention with IO-Awareness") written in plain torch. For each
query block it walks the key blocks, keeping a running row maximum ``m``, normalizer
``l`` and output accumulator, so the N x M score matrix never exists. It computes the
same function as the ``math`` backend (the readable picture it is tested against).

* Tiles the mask classifies EMPTY are skipped; FULL tiles never evaluate the mask;
  only PARTIAL tiles build a small boolean tile.
* A custom autograd function saves ``out`` and the row log-sum-exp and recomputes the
  tiles in backward, so training memory is O(B H (N + M) D) too.
* Bias tensors (with gradient) and bias functions (evaluated per tile; gradients of
  parameters they close over are accumulated by a nested backward), grouped-query
  heads, and counter-based dropout (regenerated identically in backward).

On CPU in float32 the whole call goes to attnlab's native kernel (:mod:`attnlab.exact.native`)
whenever it is built and serves the call; otherwise two paths compute the tiles. The
**fused** path (CPU, float32/bfloat16) hands each query block's non-empty key runs to :func:`attnlab.exact.tiles.attend_block`
(PyTorch's fused CPU flash kernel): a run of FULL tiles is one call without a mask,
a run of PARTIAL tiles one call with its small mask; the partial ``(out, lse)`` are
merged by log-sum-exp, and the backward hands each run, with the rows' global ``out``
and ``lse``, to the fused backward. The **plain** path is the tile loop in plain torch
below; it serves what the fused op cannot: float64 and float16, CUDA tensors, dropout,
a bias tensor or bias function whose parameters need gradients, or a fused op that is
missing or failed its numerical check (:func:`fused_reason` says which).

Time O(B H N M D) for dense masks, proportional to the non-empty tiles otherwise.
Shape legend: B batch, H heads, Hkv kv heads, G = H / Hkv, N queries, M keys, D dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..masks import EMPTY, FULL, PARTIAL
from . import native
from .call import AttentionCall, dropout_scale_tile, index_grid
from .registry import Backend, register_backend
from .tiles import attend_block, attend_block_backward, fused_status, reduce_to, tile_backward
from .torch_math import acc_dtype

LOG2E = 1.4426950408889634

#: candidate tile shapes (block_q, block_k); the planner picks the cheapest
_CANDIDATES = ((128, 1024), (256, 512), (256, 256), (128, 512), (128, 256), (128, 128), (64, 256), (64, 128), (32, 128))
#: largest tile in elements (B * H * block_q * block_k)
_TILE_BUDGET = 1 << 21
#: planner cost constants, fitted on a 2-core x86 CPU (B=1, H=8, D=64, N=4096): seconds
#: per score element per feature (D + Dv), per tile, and the extra factor of partial tiles
_SEC_PER_ELEM_FEATURE = 1.0 / 6.5e10
_SEC_PER_TILE = 1.2e-4
_PARTIAL_FACTOR = 1.5
#: widest key block the backward pass uses
_BACKWARD_MAX_BLOCK_K = 256


@dataclass
class TilePlan:
    """How ``chunked`` will walk a call: block sizes and the kind of every tile."""

    block_q: int
    block_k: int
    kinds: list[list[int]]  # [query block][key block] -> EMPTY / PARTIAL / FULL
    est_seconds: float
    #: the fused path's whole call is one causal call (a pure causal mask, N == M, no grouped heads)
    whole_causal: bool = False

    @property
    def computed_fraction(self) -> float:
        """Fraction of tiles that are computed (not skipped)."""
        flat = [x for row in self.kinds for x in row]
        return sum(x != EMPTY for x in flat) / max(1, len(flat))


def _collapse(kinds: Tensor) -> list[list[int]]:
    """Reduce ``(B', H', nqb, nkb)`` kinds to one kind per tile (EMPTY/FULL only if for all)."""
    lo = kinds.amin(dim=(0, 1))
    hi = kinds.amax(dim=(0, 1))
    out = torch.where(hi == EMPTY, EMPTY, torch.where(lo == FULL, FULL, PARTIAL))
    return out.cpu().tolist()


def plan_tiles(
    call: AttentionCall, block_q: int | None = None, block_k: int | None = None, backward: bool = False
) -> TilePlan:
    """Choose block sizes for ``call`` and classify its tiles.

    With explicit ``block_q``/``block_k`` only that shape is classified; otherwise each
    candidate is costed (computed tile area times a per-element cost, partial tiles
    dearer, plus per-tile overhead) and the cheapest is kept.
    """
    bh = call.B * call.H
    feats = call.D + call.Dv
    if block_q is not None or block_k is not None:
        cands = [(block_q or 128, block_k or 512)]
    else:
        cands = [(bq, bk) for bq, bk in _CANDIDATES if bh * bq * bk <= _TILE_BUDGET] or [_CANDIDATES[-1]]
        if backward:
            # the backward keeps five tile-sized temporaries: narrow key blocks measured
            # 1.7x faster than 1024-wide ones at N=4096 (B=1, H=8, D=64)
            cands = [(bq, bk) for bq, bk in cands if bk <= _BACKWARD_MAX_BLOCK_K] or cands
    best = None
    for bq, bk in cands:
        bq_, bk_ = min(bq, call.N), min(bk, call.M)
        if call.mask is None:
            nqb, nkb = math.ceil(call.N / bq_), math.ceil(call.M / bk_)
            kinds = [[FULL] * nkb for _ in range(nqb)]
        else:
            raw = call.mask.block_kinds(call.N, call.M, bq_, bk_, device="cpu")  # (B'|1, H'|1, nqb|1, nkb|1)
            nqb, nkb = math.ceil(call.N / bq_), math.ceil(call.M / bk_)
            kinds = _collapse(raw.expand(raw.shape[0], raw.shape[1], nqb, nkb))
        n_full = sum(x == FULL for row in kinds for x in row)
        n_part = sum(x == PARTIAL for row in kinds for x in row)
        area = (n_full + _PARTIAL_FACTOR * n_part) * bq_ * bk_ * bh
        est = area * feats * _SEC_PER_ELEM_FEATURE + (n_full + n_part) * _SEC_PER_TILE
        if best is None or est < best.est_seconds:
            best = TilePlan(bq_, bk_, kinds, est)
        if call.mask is None:
            break
    assert best is not None
    return best


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


#: consecutive FULL tiles are merged into one wider product up to this many elements
_MERGE_BUDGET = 1 << 20


def _segments(kinds: list[int], ranges: list[tuple[int, int]], merge: int) -> list[tuple[int, int, int]]:
    """Non-empty ``(start, stop, kind)`` runs along one tile row/column.

    EMPTY tiles are dropped, PARTIAL tiles kept alone, and up to ``merge`` consecutive
    FULL tiles fused into one (fewer, larger matrix products).
    """
    out: list[tuple[int, int, int]] = []
    run = 0
    for kind, (a, b) in zip(kinds, ranges):
        if kind == FULL and out and out[-1][2] == FULL and run < merge and out[-1][1] == a:
            out[-1] = (out[-1][0], b, FULL)
            run += 1
        elif kind != EMPTY:
            out.append((a, b, kind))
            run = 1
    return out


class TileWalker:
    """Per-call tile helpers shared by forward and backward (and the streamed attention statistics)."""

    def __init__(self, call: AttentionCall, plan: TilePlan):
        self.call, self.plan = call, plan
        self.qr = _ranges(call.N, plan.block_q)
        self.kr = _ranges(call.M, plan.block_k)
        self.ad = acc_dtype(call.dtype)
        self.merge = max(1, _MERGE_BUDGET // (call.B * call.H * plan.block_q * plan.block_k))

    def row(self, i: int) -> list[tuple[int, int, int]]:
        """Key segments ``(k0, k1, kind)`` query block ``i`` must visit."""
        return _segments(self.plan.kinds[i], self.kr, self.merge)

    def column(self, j: int) -> list[tuple[int, int, int]]:
        """Query segments ``(q0, q1, kind)`` that visit key block ``j``."""
        return _segments([row[j] for row in self.plan.kinds], self.qr, self.merge)

    def scores2(self, q2: Tensor, kt: Tensor, q0: int, q1: int, k0: int, k1: int, kind: int) -> Tensor:
        """Scores of a tile in the log2 domain: ``(q k^T * scale + bias) * log2(e)``, masked.

        ``q2`` is the query block ``q0:q1`` pre-scaled by ``scale * log2(e)``,
        ``(B, Hkv, G, bq, D)``; ``kt`` the key block ``k0:k1`` transposed,
        ``(B, Hkv, 1, D, bk)``. Returns ``(B, Hkv, G, bq, bk)`` in the accumulation dtype.
        """
        c = self.call
        s = torch.matmul(q2, kt)  # (B, Hkv, G, bq, bk)
        if s.dtype != self.ad:
            s = s.to(self.ad)
        if c.has_bias():
            bias = c.bias_tile(q0, q1, k0, k1)  # broadcastable to (B, H, bq, bk)
            s = s.view(c.B, c.H, q1 - q0, k1 - k0).add_(bias.to(self.ad), alpha=LOG2E)  # (B, H, bq, bk)
            s = s.view(c.B, c.Hkv, c.G, q1 - q0, k1 - k0)  # (B, Hkv, G, bq, bk)
        if kind == PARTIAL:
            allowed = c.mask.tile(q0, q1, k0, k1, c.N, c.M, device=c.device)  # (B'|1, H'|1, bq, bk)
            s4 = s.view(c.B, c.H, q1 - q0, k1 - k0)  # (B, H, bq, bk)
            s4.masked_fill_(~allowed, float("-inf"))
        return s

    def dropout_scale(self, q0: int, q1: int, k0: int, k1: int) -> Tensor:
        """``keep / (1 - p)`` for a tile, ``(B, Hkv, G, bq, bk)``."""
        c = self.call
        return dropout_scale_tile(c, q0, q1, k0, k1, self.ad).view(c.B, c.Hkv, c.G, q1 - q0, k1 - k0)


_Tiles = TileWalker  # the old private name


def tiled_forward(call: AttentionCall, plan: TilePlan) -> tuple[Tensor, Tensor]:
    """The plain tile loop: ``out (B, H, N, Dv)`` and ``lse2 (B, Hkv, G, N, 1)`` (log2-domain, +inf on empty rows)."""
    c, t = call, _Tiles(call, plan)
    ad = t.ad
    q = c.q.view(c.B, c.Hkv, c.G, c.N, c.D)  # (B, Hkv, G, N, D)
    kt = c.k.unsqueeze(2).transpose(-1, -2)  # (B, Hkv, 1, D, M)
    v = c.v.unsqueeze(2)  # (B, Hkv, 1, M, Dv)
    out = torch.empty(c.B, c.Hkv, c.G, c.N, c.Dv, dtype=c.dtype, device=c.device)
    lse2 = torch.empty(c.B, c.Hkv, c.G, c.N, 1, dtype=ad, device=c.device)
    q2all = q * (c.scale * LOG2E)  # (B, Hkv, G, N, D), pre-scaled for exp2
    guard = c.has_bias()  # a -inf bias can empty a row inside a FULL tile
    for i, (q0, q1) in enumerate(t.qr):
        q2 = q2all[:, :, :, q0:q1]  # (B, Hkv, G, bq, D)
        m = torch.full((c.B, c.Hkv, c.G, q1 - q0, 1), float("-inf"), dtype=ad, device=c.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(c.B, c.Hkv, c.G, q1 - q0, c.Dv, dtype=ad, device=c.device)
        for k0, k1, kind in t.row(i):
            s = t.scores2(q2, kt[..., k0:k1], q0, q1, k0, k1, kind)  # (B, Hkv, G, bq, bk)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            if kind == PARTIAL or guard:
                m_ref = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows that saw nothing yet
            else:
                m_ref = m_new
            s.sub_(m_ref).exp2_()  # p, unnormalized
            alpha = torch.exp2(m - m_ref)  # rescales what was accumulated
            l.mul_(alpha).add_(s.sum(-1, keepdim=True))
            if c.dropout_p > 0:
                s.mul_(t.dropout_scale(q0, q1, k0, k1))
            acc.mul_(alpha)
            acc.add_(torch.matmul(s.to(c.dtype), v[:, :, :, k0:k1]).to(ad))  # (B, Hkv, G, bq, Dv)
            m = m_new
        empty = l == 0
        out[:, :, :, q0:q1] = (acc / l.masked_fill(empty, 1.0)).masked_fill(empty, 0.0).to(c.dtype)
        lse2[:, :, :, q0:q1] = (m + torch.log2(l)).masked_fill(empty, float("inf"))
    return out.view(c.B, c.H, c.N, c.Dv), lse2


_forward = tiled_forward  # the old private name


def _grouped(t: Tensor | None, c: AttentionCall) -> Tensor | None:
    """A tile broadcastable to ``(B, H, bq, bk)`` as ``(B|1, Hkv|1, G|1, bq, bk)``."""
    if t is None:
        return None
    while t.dim() < 4:
        t = t.unsqueeze(0)
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.expand(t.shape[0], c.H, t.shape[2], t.shape[3]).reshape(t.shape[0], c.Hkv, c.G, t.shape[2], t.shape[3])


def _backward(call: AttentionCall, plan: TilePlan, out: Tensor, lse2: Tensor, dout: Tensor, leaves: tuple = ()):
    """The plain tiles' backward: :func:`attnlab.exact.tiles.tile_backward` on every non-empty tile."""
    c, t = call, _Tiles(call, plan)
    ad = t.ad
    q = c.q.view(c.B, c.Hkv, c.G, c.N, c.D).to(ad)  # (B, Hkv, G, N, D)
    k = c.k.unsqueeze(2).to(ad)  # (B, Hkv, 1, M, D)
    v = c.v.unsqueeze(2).to(ad)  # (B, Hkv, 1, M, Dv)
    do = dout.reshape(c.B, c.Hkv, c.G, c.N, c.Dv).to(ad)  # (B, Hkv, G, N, Dv)
    delta = (do * out.view(c.B, c.Hkv, c.G, c.N, c.Dv).to(ad)).sum(-1, keepdim=True)  # (B, Hkv, G, N, 1)
    # natural-log lse, -inf on rows that see nothing (the forward's log2 lse is +inf there)
    lse = torch.where(lse2 == float("inf"), float("-inf"), lse2 / LOG2E).squeeze(-1)  # (B, Hkv, G, N)
    dq = torch.zeros(c.B, c.Hkv, c.G, c.N, c.D, dtype=ad, device=c.device)
    dk = torch.zeros(c.B, c.Hkv, 1, c.M, c.D, dtype=ad, device=c.device)
    dv = torch.zeros(c.B, c.Hkv, 1, c.M, c.Dv, dtype=ad, device=c.device)
    dbias = torch.zeros(c.bias.shape, dtype=ad, device=c.device) if c.bias is not None and c.bias.requires_grad else None
    dleaves = [torch.zeros_like(x) for x in leaves]  # gradients of the tensors a bias function reads
    for j, (k0, k1) in enumerate(t.kr):
        for q0, q1, kind in t.column(j):
            allowed = c.mask.tile(q0, q1, k0, k1, c.N, c.M, device=c.device) if kind == PARTIAL else None
            bias = c.bias_tile(q0, q1, k0, k1) if c.has_bias() else None
            keep = t.dropout_scale(q0, q1, k0, k1) if c.dropout_p > 0 else None
            g_q, g_k, g_v, ds = tile_backward(
                do[:, :, :, q0:q1], q[:, :, :, q0:q1], k[:, :, :, k0:k1], v[:, :, :, k0:k1], delta[:, :, :, q0:q1],
                lse[:, :, :, q0:q1], _grouped(allowed, c), _grouped(None if bias is None else bias.detach().to(ad), c),
                c.scale, keep)
            dq[:, :, :, q0:q1] += g_q
            dk[:, :, :, k0:k1] += g_k
            dv[:, :, :, k0:k1] += g_v
            ds4 = ds.view(c.B, c.H, q1 - q0, k1 - k0)  # (B, H, bq, bk)
            if dbias is not None:
                rows = slice(q0, q1) if dbias.shape[2] != 1 else slice(None)
                cols = slice(k0, k1) if dbias.shape[3] != 1 else slice(None)
                dbias[:, :, rows, cols] += reduce_to(ds4, dbias[:, :, rows, cols].shape)
            if leaves:
                with torch.enable_grad():
                    bt = c.bias_fn(*index_grid(c.B, c.H, q0, q1, k0, k1, c.device))
                grads = torch.autograd.grad(
                    bt, leaves, reduce_to(ds4, bt.shape).to(bt.dtype), retain_graph=True, allow_unused=True
                )
                for acc_g, g in zip(dleaves, grads):
                    if g is not None:
                        acc_g += g
    dq = dq.view(c.B, c.H, c.N, c.D).to(c.dtype)
    dk = dk.squeeze(2).to(c.dtype)
    dv = dv.squeeze(2).to(c.dtype)
    return dq, dk, dv, (dbias.to(c.bias.dtype) if dbias is not None else None), tuple(dleaves)


def bias_leaves(call: AttentionCall) -> tuple[Tensor, ...]:
    """The leaf tensors requiring grad that ``call.bias_fn`` reads (e.g. a T5 bias table).

    Found by evaluating the function on a one-element grid and walking its autograd
    graph. They become inputs of the autograd function, so gradients reach them through
    the ordinary autograd machinery (``backward()`` and ``torch.autograd.grad`` alike).
    """
    if call.bias_fn is None or not torch.is_grad_enabled():
        return ()
    with torch.enable_grad():
        probe = call.bias_fn(*index_grid(call.B, call.H, 0, 1, 0, 1, call.device))
    if not isinstance(probe, Tensor) or probe.grad_fn is None:
        return (probe,) if isinstance(probe, Tensor) and probe.requires_grad else ()
    leaves: list[Tensor] = []
    seen: set = set()
    stack = [probe.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if var is not None:
            if not any(var is x for x in leaves):
                leaves.append(var)
            continue
        stack.extend(f for f, _ in node.next_functions)
    return tuple(leaves)


# -- the fused path -----------------------------------------------------------------------------

#: query rows per fused call when a mask splits the key range
FUSED_BLOCK_Q = 256
#: key columns per tile when classifying a mask for the fused path
FUSED_BLOCK_K = 256
_FUSED_DTYPES = (torch.float32, torch.bfloat16)


def fused_reason(call: AttentionCall) -> str | None:
    """None when ``call`` runs on the fused per-block path; else why it takes the plain tiles."""
    why = fused_status()
    if why is not None:
        return why
    if call.device.type != "cpu":
        return "the fused per-block path runs on CPU; other devices take the plain tiles"
    if call.dtype not in _FUSED_DTYPES:
        return f"{call.dtype} runs on the plain tiles (the fused op's accumulation is checked for float32/bfloat16)"
    if call.D != call.Dv:
        return f"value head dim {call.Dv} differs from the query/key head dim {call.D} (the fused op needs them equal)"
    if call.dropout_p > 0:
        return "dropout: the fused op cannot reproduce attnlab's counter-based dropout stream"
    if call.bias is not None and call.bias.requires_grad:
        return "a bias tensor that needs gradients (the fused backward returns none for it)"
    if call.bias_fn is not None and bias_leaves(call):
        return "a bias function whose parameters need gradients"
    return None


def fused_plan(call: AttentionCall) -> TilePlan:
    """The fused path's tiles: one call without a mask or with a pure causal one, else 256 x 256 tiles."""
    if call.mask is None:
        return TilePlan(call.N, call.M, [[FULL]], 0.0)
    if call.mask.is_causal(call.N, call.M) and call.G == 1:
        # the fused op's own causal mode: it skips the upper triangle and reads no mask
        return TilePlan(call.N, call.M, [[PARTIAL]], 0.0, whole_causal=True)
    return plan_tiles(call, min(FUSED_BLOCK_Q, call.N), min(FUSED_BLOCK_K, call.M))


#: fused path cost model in the registry's units (flop-equivalents at SDPA speed): the fused
#: op's speed relative to one SDPA call, the extra cost of a PARTIAL run (building its mask),
#: and the fixed cost of one call (Python, slicing, the merge), measured on a 2-core x86 CPU
_FUSED_EFFICIENCY = 0.9
_FUSED_PARTIAL_FACTOR = 1.3
_FUSED_CALL_COST = 4.0e6


def fused_estimate(call: AttentionCall) -> float:
    """Cost of ``call`` on the fused path: computed tile area plus a fixed cost per fused call."""
    plan = fused_plan(call)
    area, calls = 0.0, 0
    if plan.whole_causal:
        area, calls = call.N * (call.M + 1) / 2, 1
    else:
        kr = _ranges(call.M, plan.block_k)
        for i, (q0, q1) in enumerate(_ranges(call.N, plan.block_q)):
            for k0, k1, kind in _runs(plan.kinds[i] if call.mask is not None else [FULL] * len(kr), kr):
                area += (q1 - q0) * (k1 - k0) * (_FUSED_PARTIAL_FACTOR if kind == PARTIAL else 1.0)
                calls += 1
    work = 2.0 * call.B * call.H * area * (call.D + call.Dv) / _FUSED_EFFICIENCY + calls * _FUSED_CALL_COST
    return work * (2.5 if call.needs_grad else 1.0)  # the fused backward recomputes the block


def _runs(kinds: list[int], ranges: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Non-empty ``(k0, k1, kind)`` runs of one tile row: consecutive tiles of one kind merged."""
    out: list[tuple[int, int, int]] = []
    for kind, (a, b) in zip(kinds, ranges):
        if kind == EMPTY:
            continue
        if out and out[-1][2] == kind and out[-1][1] == a:
            out[-1] = (out[-1][0], b, kind)
        else:
            out.append((a, b, kind))
    return out


def _stack_rows(t: Tensor, c: AttentionCall, bq: int) -> Tensor:
    """A tile ``(B'|1, H'|1, bq, w)`` laid out like the stacked queries ``(B, Hkv, G*bq, w)``.

    Kept broadcastable where it can be: a tile the same for every head stays ``(B'|1, 1, ., w)``
    (repeated G times along the rows for grouped-query heads), so the fused op reads one copy
    for all heads instead of H.
    """
    if t.dim() < 4:
        t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    if t.shape[1] == 1:  # the same for every head
        return t if c.G == 1 or t.shape[2] == 1 else t.repeat(1, 1, c.G, 1)  # (B'|1, 1, G*bq|1, w)
    t = t.expand(t.shape[0], c.H, bq, t.shape[3])
    return t.reshape(t.shape[0], c.Hkv, c.G * bq, t.shape[3])


#: one fused call of a query block: keys ``k0:k1``, the block's causal mode, its boolean tile or None
_Call = tuple[int, int, bool, "Tensor | None"]


def _row_calls(c: AttentionCall, plan: TilePlan, i: int, q0: int, q1: int, kr: list[tuple[int, int]]) -> list[_Call]:
    """The fused calls of query block ``i``: runs of same-kind tiles, with a causal diagonal split off.

    A square tile on the diagonal (bottom-right aligned, as attnlab's causal mask) whose
    allowed entries all lie in its lower triangle runs in the fused op's causal mode, which
    skips the upper triangle: 1.5x less work on that tile, and no mask at all when the tile
    is exactly the triangle (pure causal, or causal within one document). Grouped-query
    heads stack G query heads on the rows, which the op's triangle would misalign: they keep
    the mask.
    """
    if plan.whole_causal:
        return [(0, c.M, True, None)]
    kinds = plan.kinds[i] if c.mask is not None else [FULL] * len(kr)
    d0 = q0 + (c.M - c.N)  # the key position of query q0
    d1 = d0 + (q1 - q0)
    calls: list[_Call] = []
    for k0, k1, kind in _runs(kinds, kr):
        if kind == FULL:
            calls.append((k0, k1, False, None))
            continue
        if c.G == 1 and k0 <= d0 and d1 <= k1 and d0 >= 0:
            diag = c.mask.tile(q0, q1, d0, d1, c.N, c.M, device=c.device)  # (B'|1, H'|1, bq, bq)
            upper = torch.ones(q1 - q0, q1 - q0, dtype=torch.bool, device=c.device).triu(1)
            if not bool((diag & upper).any()):
                if k0 < d0:
                    calls.append((k0, d0, False, c.mask.tile(q0, q1, k0, d0, c.N, c.M, device=c.device)))
                exact = bool((diag | upper).all())  # the tile is the whole triangle: no mask needed
                calls.append((d0, d1, True, None if exact else diag))
                if d1 < k1:
                    calls.append((d1, k1, False, c.mask.tile(q0, q1, d1, k1, c.N, c.M, device=c.device)))
                continue
        calls.append((k0, k1, False, c.mask.tile(q0, q1, k0, k1, c.N, c.M, device=c.device)))
    return calls


def _call_inputs(c: AttentionCall, q0: int, q1: int, k0: int, k1: int, tile: Tensor | None):
    """``(tile_mask, bias_tile)`` of one fused call, laid out like the stacked queries (None where not needed)."""
    allowed = _stack_rows(tile, c, q1 - q0) if tile is not None else None
    bias = _stack_rows(c.bias_tile(q0, q1, k0, k1), c, q1 - q0) if c.has_bias() else None
    return allowed, bias


def _block_rows(x: Tensor, c: AttentionCall, q0: int, q1: int) -> Tensor:
    """Rows ``q0:q1`` of ``(B, H, N, F)`` as ``(B, Hkv, G*bq, F)``."""
    x5 = x.view(c.B, c.Hkv, c.G, x.shape[2], x.shape[3])
    return x5[:, :, :, q0:q1].reshape(c.B, c.Hkv, c.G * (q1 - q0), x.shape[3])


def _fused_forward(call: AttentionCall, plan: TilePlan) -> tuple[Tensor, Tensor]:
    """``out (B, H, N, Dv)`` and ``lse (B, H, N)`` (natural log, float32; -inf on empty rows)."""
    c = call
    qr, kr = _ranges(c.N, plan.block_q), _ranges(c.M, plan.block_k)
    if len(qr) == 1 and len(calls := _row_calls(c, plan, 0, 0, c.N, kr)) == 1:
        # one fused call (no mask, or a pure causal one): its result is the answer, no copy into
        # an output buffer (at N=65,536 that copy alone is 128 MiB of the fwd+bwd peak)
        k0, k1, causal, tile = calls[0]
        allowed, bias = _call_inputs(c, 0, c.N, k0, k1, tile)
        o, l = attend_block(_block_rows(c.q, c, 0, c.N), c.k[:, :, k0:k1], c.v[:, :, k0:k1], tile_mask=allowed,
                            bias_tile=bias, scale=c.scale, is_causal=causal)
        return o.reshape(c.B, c.H, c.N, c.Dv), l.reshape(c.B, c.H, c.N)
    out = torch.empty(c.B, c.H, c.N, c.Dv, dtype=c.dtype, device=c.device)
    lse = torch.full((c.B, c.H, c.N), float("-inf"), dtype=torch.float32, device=c.device)
    for i, (q0, q1) in enumerate(qr):
        qb = _block_rows(c.q, c, q0, q1)  # (B, Hkv, G*bq, D)
        acc_o = acc_l = None
        for k0, k1, causal, tile in _row_calls(c, plan, i, q0, q1, kr):
            allowed, bias = _call_inputs(c, q0, q1, k0, k1, tile)
            o, l = attend_block(qb, c.k[:, :, k0:k1], c.v[:, :, k0:k1], tile_mask=allowed, bias_tile=bias,
                                scale=c.scale, is_causal=causal)
            if acc_o is None:
                acc_o, acc_l = o.float(), l
            else:  # log-sum-exp merge in float32
                new_l = torch.logaddexp(acc_l, l)
                ref = new_l.masked_fill(torch.isneginf(new_l), 0.0)
                acc_o = torch.exp(acc_l - ref)[..., None] * acc_o + torch.exp(l - ref)[..., None] * o.float()
                acc_l = new_l
        rows = slice(q0, q1)
        if acc_o is None:  # every key of this block row is masked
            out[:, :, rows] = 0
            continue
        out[:, :, rows] = acc_o.reshape(c.B, c.H, q1 - q0, c.Dv).to(c.dtype)
        lse[:, :, rows] = acc_l.reshape(c.B, c.H, q1 - q0)
    return out, lse


def _fused_backward(call: AttentionCall, plan: TilePlan, out: Tensor, lse: Tensor, dout: Tensor):
    c = call
    qr, kr = _ranges(c.N, plan.block_q), _ranges(c.M, plan.block_k)
    if len(qr) == 1 and len(calls := _row_calls(c, plan, 0, 0, c.N, kr)) == 1 and calls[0][:2] == (0, c.M):
        # one fused call: the op's gradients are the answer, no float32 accumulators beside them
        k0, k1, causal, tile = calls[0]
        allowed, bias = _call_inputs(c, 0, c.N, k0, k1, tile)
        g_q, g_k, g_v = attend_block_backward(
            _block_rows(dout, c, 0, c.N), _block_rows(c.q, c, 0, c.N), c.k, c.v, _block_rows(out, c, 0, c.N),
            lse.reshape(c.B, c.Hkv, c.G * c.N), tile_mask=allowed, bias_tile=bias, scale=c.scale, is_causal=causal)
        return g_q.reshape(c.B, c.H, c.N, c.D), g_k, g_v
    dq = torch.zeros(c.B, c.H, c.N, c.D, dtype=torch.float32, device=c.device)
    dk = torch.zeros(c.B, c.Hkv, c.M, c.D, dtype=torch.float32, device=c.device)
    dv = torch.zeros(c.B, c.Hkv, c.M, c.Dv, dtype=torch.float32, device=c.device)
    for i, (q0, q1) in enumerate(qr):
        qb, ob, dob = (_block_rows(x, c, q0, q1) for x in (c.q, out, dout))
        lb = lse.view(c.B, c.Hkv, c.G, c.N)[:, :, :, q0:q1].reshape(c.B, c.Hkv, c.G * (q1 - q0))
        dqb = None
        for k0, k1, causal, tile in _row_calls(c, plan, i, q0, q1, kr):
            allowed, bias = _call_inputs(c, q0, q1, k0, k1, tile)
            g_q, g_k, g_v = attend_block_backward(dob, qb, c.k[:, :, k0:k1], c.v[:, :, k0:k1], ob, lb,
                                                  tile_mask=allowed, bias_tile=bias, scale=c.scale,
                                                  is_causal=causal)
            dqb = g_q.float() if dqb is None else dqb.add_(g_q.float())
            dk[:, :, k0:k1] += g_k.float()
            dv[:, :, k0:k1] += g_v.float()
        if dqb is not None:
            dq[:, :, q0:q1] = dqb.reshape(c.B, c.H, q1 - q0, c.D)
    return dq.to(c.dtype), dk.to(c.dtype), dv.to(c.dtype)


class _FusedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, call, plan):
        out, lse = _fused_forward(call, plan)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.call, ctx.plan = call, plan
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, bias, out, lse = ctx.saved_tensors
        c = ctx.call
        call = AttentionCall(q=q.detach(), k=k.detach(), v=v.detach(), mask=c.mask,
                             bias=bias.detach() if bias is not None else None, bias_fn=c.bias_fn, scale=c.scale,
                             dropout_p=0.0, dropout_seed=c.dropout_seed, return_weights=False)
        dq, dk, dv = _fused_backward(call, ctx.plan, out, lse, dout.contiguous())
        return dq, dk, dv, None, None, None


class _ChunkedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, call, plan, explicit, *leaves):
        out, lse2 = _forward(call, plan)
        ctx.save_for_backward(q, k, v, bias, out, lse2)
        ctx.call, ctx.plan, ctx.explicit, ctx.leaves = call, plan, explicit, leaves
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, bias, out, lse2 = ctx.saved_tensors
        call = ctx.call
        # rebuild the call around the saved tensors (the originals may carry versions)
        call = AttentionCall(
            q=q.detach(), k=k.detach(), v=v.detach(), mask=call.mask,
            bias=bias.detach().requires_grad_(bias.requires_grad) if bias is not None else None,
            bias_fn=call.bias_fn, scale=call.scale, dropout_p=call.dropout_p,
            dropout_seed=call.dropout_seed, return_weights=False,
        )
        plan = ctx.plan if ctx.explicit else plan_tiles(call, backward=True)
        dq, dk, dv, dbias, dleaves = _backward(call, plan, out, lse2, dout.contiguous(), ctx.leaves)
        return (dq, dk, dv, dbias, None, None, None, *dleaves)


def chunked_attention(call: AttentionCall, block_q: int | None = None, block_k: int | None = None) -> Tensor:
    """Run the tiled kernel on a validated call (explicit block sizes are for tests of the torch paths).

    The native kernel serves the call when :func:`attnlab.exact.native.call_reason` allows it,
    else the fused per-block path when :func:`fused_reason` allows it, else the plain tiles.
    """
    if block_q is None and block_k is None and native.call_reason(call) is None:
        return native.native_attention(call)
    if fused_reason(call) is None:
        plan = fused_plan(call) if block_q is None and block_k is None else plan_tiles(call, block_q, block_k)
        if call.needs_grad:
            return _FusedFn.apply(call.q, call.k, call.v, call.bias, call, plan)
        with torch.no_grad():
            return _fused_forward(call, plan)[0]
    plan = plan_tiles(call, block_q, block_k)
    # the tiled kernel reads contiguous per-head rows
    call = AttentionCall(
        q=call.q.contiguous(), k=call.k.contiguous(), v=call.v.contiguous(), mask=call.mask,
        bias=call.bias, bias_fn=call.bias_fn, scale=call.scale, dropout_p=call.dropout_p,
        dropout_seed=call.dropout_seed, return_weights=False,
    )
    leaves = bias_leaves(call)
    if call.needs_grad or leaves:
        explicit = block_q is not None or block_k is not None
        return _ChunkedFn.apply(call.q, call.k, call.v, call.bias, call, plan, explicit, *leaves)
    with torch.no_grad():
        out, _ = _forward(call, plan)
    return out


@register_backend
class ChunkedBackend(Backend):
    """The ``chunked`` backend: online softmax over tiles, empty tiles skipped, its own backward (see the module docstring)."""

    name = "chunked"
    summary = "online-softmax tiles in plain torch; skips empty tiles; O(N) memory fwd+bwd"

    def supports(self, call: AttentionCall) -> str | None:
        if call.return_weights:
            return "does not materialize the weights (return_weights=True needs 'math')"
        return None

    def note(self, call: AttentionCall) -> str | None:
        why_native = native.call_reason(call)
        if why_native is None:
            return "native kernel (attnlab's C++ kernel on oneDNN's micro-GEMM)"
        # the kernel's own failure is the native backend's reason; name only what this call needs
        not_native = "" if why_native == native.status() else f"; not the native kernel: {why_native}"
        why = fused_reason(call)
        if why is None:
            return f"fused per-block path (PyTorch's CPU flash kernel per key run, merged by log-sum-exp){not_native}"
        return f"plain torch tiles: {why}{not_native}"

    def estimate(self, call: AttentionCall) -> float:
        if native.call_reason(call) is None:
            return native.native_estimate(call)
        if fused_reason(call) is None:
            return fused_estimate(call)
        # convert the planner's seconds into the registry's units (flop-equivalents at
        # SDPA speed): SDPA's CPU kernel runs about 2.2e11 flop/s on the reference machine
        est = plan_tiles(call).est_seconds * 2.2e11
        # its backward recomputes every tile in plain torch: relatively dearer than SDPA's
        return est * 1.5 if call.needs_grad else est

    def forward(self, call: AttentionCall):
        return chunked_attention(call), None
