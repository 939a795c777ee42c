"""Ring attention: exact attention over a sequence sharded across processes.

Liu, Zaharia and Abbeel, 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context". Each of the ``P`` ranks holds its shard of the queries, keys and
values (a :class:`~attnlab.distributed.layout.SequenceLayout` says which positions). The
key/value shards travel around the ring of ranks, ``P`` steps (fewer when the mask lets
the ring stop early); at each step every rank attends its queries to the visiting block
with :func:`attnlab.exact.tiles.attend_block`, and merges the partial ``(out, lse)`` by
log-sum-exp (:func:`~attnlab.exact.tiles.merge_partials`), which gives exactly one
softmax over all keys. The next block's transfer (``batch_isend_irecv``) is posted before
the current block is computed, so communication overlaps compute.

Backward: every rank walks the ring again with its rows' *global* ``out`` and ``lse``;
:func:`~attnlab.exact.tiles.attend_block_backward` gives each block's share of ``dq``
(kept) and its ``dk``/``dv`` (accumulated in float32 into a buffer that travels with the
block, one step behind it so its transfer also overlaps compute, and is finally sent to
the block's owner).

Masks and bias functions are evaluated at global positions (a mask that carries
per-position data, such as document ids or padding lengths, must describe the whole
sequence). Tiles the mask classifies EMPTY are skipped (see
:mod:`attnlab.distributed.schedule`). Fully masked rows give zeros and ``lse = -inf``.

Per rank: time O(B H N^2 D / P) for a dense mask (zigzag balances a causal one), memory
O(B H (N / P) D) besides the fused kernel's tiles; communication 2 (P - 1) key/value
shards forward, twice that backward. Shape legend: ``B`` batch, ``H`` query heads,
``Hkv`` key/value heads (``G = H / Hkv`` query heads per key/value head), ``n`` local
positions, ``N`` global positions, ``D`` head dim, ``Dv`` value head dim.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..exact.call import make_call
from ..exact.chunked import bias_leaves
from ..exact.tiles import attend_block, attend_block_backward, merge_partials, reduce_to, tile_backward
from ..masks import Mask
from .checks import check_inputs, resolve
from .comm import GroupInfo, exchange
from .layout import SequenceLayout
from .schedule import Piece, RingPlan, granule_kinds, plan_ring

__all__ = ["ring_attention"]

_KV, _GRAD, _HOME = 0, 1, 2  # message tags: the travelling key/value block, its gradient, the final return


class _Ctx:
    """What forward and backward share: sizes, the plan, and the tile builders of one call."""

    def __init__(self, info: GroupInfo, plan: RingPlan, mask: Mask | None, bias_fn, scale: float,
                 B: int, H: int, Hkv: int, D: int, Dv: int, device: torch.device):
        self.info, self.plan, self.mask, self.bias_fn, self.scale = info, plan, mask, bias_fn, scale
        self.B, self.H, self.Hkv, self.G, self.D, self.Dv = B, H, Hkv, H // Hkv, D, Dv
        self.device = device
        lay = plan.layout
        self.N = lay.length
        self.qpos = lay.positions(plan.rank, device=device)
        self.kpos = {r: lay.positions(r, device=device) for r in range(lay.world)}

    def length(self, rank: int) -> int:
        return self.plan.layout.shard_length(rank)

    # -- packing a key/value block into one message ----------------------------------------------
    def kv_numel(self, rank: int) -> tuple[int, int]:
        n = self.length(rank)
        return self.B * self.Hkv * n * self.D, self.B * self.Hkv * n * self.Dv

    def unpack(self, flat: Tensor, rank: int) -> tuple[Tensor, Tensor]:
        """``(B, Hkv, n, D)`` and ``(B, Hkv, n, Dv)`` views of a packed block of ``rank``."""
        nk, _ = self.kv_numel(rank)
        n = self.length(rank)
        return flat[:nk].view(self.B, self.Hkv, n, self.D), flat[nk:].view(self.B, self.Hkv, n, self.Dv)

    def empty_block(self, rank: int, dtype: torch.dtype) -> Tensor:
        return torch.empty(sum(self.kv_numel(rank)), dtype=dtype, device=self.device)

    # -- tiles at global positions ----------------------------------------------------------------
    def _stack(self, t: Tensor, rows: int, cols: int) -> Tensor:
        """A tile broadcastable to ``(B, H, rows, cols)`` as the fused call's ``(B, Hkv, G*rows, cols)``."""
        if self.G == 1:
            return t
        return t.expand(self.B, self.H, rows, cols).reshape(self.B, self.Hkv, self.G * rows, cols)

    def _index(self, piece: Piece, src: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        (a, b), (c, d) = piece.rows, piece.cols
        return (torch.arange(self.B, device=self.device).view(-1, 1, 1, 1),
                torch.arange(self.H, device=self.device).view(1, -1, 1, 1),
                self.qpos[a:b].view(1, 1, -1, 1), self.kpos[src][c:d].view(1, 1, 1, -1))

    def mask_tile(self, piece: Piece, src: int) -> Tensor | None:
        if not piece.partial:
            return None
        b, h, q, k = self._index(piece, src)
        if "b" not in self.mask.depends:
            b = b[:1]
        if "h" not in self.mask.depends:
            h = h[:, :1]
        allowed = self.mask.allows(b, h, q, k, self.N, self.N)  # (B|1, H|1, rows, cols)
        return self._stack(allowed, q.shape[2], k.shape[3])

    def bias_tile(self, piece: Piece, src: int) -> Tensor | None:
        """The bias function's tile (with its autograd graph when grad is enabled)."""
        if self.bias_fn is None:
            return None
        b, h, q, k = self._index(piece, src)
        return self.bias_fn(b, h, q, k)  # broadcastable to (B, H, rows, cols)

    def rows(self, x: Tensor, piece: Piece) -> Tensor:
        """Rows ``piece.rows`` of ``(B, Hkv, G, n, F)`` as ``(B, Hkv, G*rows, F)``."""
        a, b = piece.rows
        return x[:, :, :, a:b].reshape(self.B, self.Hkv, self.G * (b - a), x.shape[-1])


def _ring_forward(c: _Ctx, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``out (B, H, n, Dv)`` in q's dtype and ``lse (B, H, n)`` (float32; float64 for float64 inputs)."""
    info, plan = c.info, c.plan
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    n = q.shape[2]
    q5 = q.view(c.B, c.Hkv, c.G, n, c.D)  # (B, Hkv, G, n, D)
    out = torch.zeros(c.B, c.Hkv, c.G, n, c.Dv, dtype=acc, device=c.device)
    lse = torch.full((c.B, c.Hkv, c.G, n), float("-inf"), dtype=acc, device=c.device)
    block = torch.cat([k.reshape(-1), v.reshape(-1)])  # this rank's keys and values, one message
    right, left = (info.rank + 1) % info.world, (info.rank - 1) % info.world
    for s in range(plan.steps):
        src = plan.source(s)
        pending = nxt = None
        if s + 1 < plan.steps:  # post the next block's transfer, then compute on this one
            nxt = c.empty_block(plan.source(s + 1), q.dtype)
            pending = exchange(info, [(block, right, _KV)], [(nxt, left, _KV)])
        ks, vs = c.unpack(block, src)
        for piece in plan.pieces[s]:
            (a, b), (c0, c1) = piece.rows, piece.cols
            bias = c.bias_tile(piece, src)
            o, l = attend_block(c.rows(q5, piece), ks[:, :, c0:c1], vs[:, :, c0:c1], tile_mask=c.mask_tile(piece, src),
                                bias_tile=None if bias is None else c._stack(bias.detach(), b - a, c1 - c0),
                                scale=c.scale)
            o = o.view(c.B, c.Hkv, c.G, b - a, c.Dv)  # (B, Hkv, G, rows, Dv)
            l = l.view(c.B, c.Hkv, c.G, b - a).to(acc)
            out[:, :, :, a:b], lse[:, :, :, a:b] = merge_partials(out[:, :, :, a:b], lse[:, :, :, a:b], o, l)
        if pending is not None:
            pending.wait()
            block = nxt
    return out.view(c.B, c.H, n, c.Dv).to(q.dtype), lse.view(c.B, c.H, n)


def _leaf_tile_backward(c: _Ctx, dob, qb, kb, vb, ob, lb, allowed, bias: Tensor, leaves, dleaves):
    """One block's gradients by the formula (:func:`attnlab.exact.tiles.tile_backward`), plus the
    gradient of the bias function's leaves: the fused and native backwards return no score
    gradient, which the leaves (a T5 table) need (``dbias = dS``)."""
    ad = torch.float64 if qb.dtype == torch.float64 else torch.float32
    rows, cols = bias.shape[2], bias.shape[3]
    do = dob.to(ad)
    delta = (do * ob.to(ad)).sum(-1, keepdim=True)  # (B, Hkv, G*rows, 1)
    dq, dk, dv, ds = tile_backward(do, qb.to(ad), kb.to(ad), vb.to(ad), delta, lb.to(ad), allowed,
                                   c._stack(bias.detach().to(ad), rows, cols), c.scale)
    ds4 = ds.view(c.B, c.H, rows, cols)  # (B, H, rows, cols)
    grads = torch.autograd.grad(bias, leaves, reduce_to(ds4, bias.shape).to(bias.dtype), allow_unused=True)
    for acc_g, g in zip(dleaves, grads):
        if g is not None:
            acc_g += g
    return dq, dk, dv


def _ring_backward(c: _Ctx, q, k, v, out, lse, dout, leaves: tuple[Tensor, ...]):
    info, plan = c.info, c.plan
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    n = q.shape[2]
    q5, o5, do5 = (x.view(c.B, c.Hkv, c.G, n, x.shape[-1]) for x in (q, out, dout))  # (B, Hkv, G, n, F)
    l4 = lse.view(c.B, c.Hkv, c.G, n)
    dq = torch.zeros(c.B, c.Hkv, c.G, n, c.D, dtype=acc, device=c.device)
    dleaves = [torch.zeros_like(x) for x in leaves]
    block = torch.cat([k.reshape(-1), v.reshape(-1)])
    right, left = (info.rank + 1) % info.world, (info.rank - 1) % info.world
    passed = None  # the gradient of the block held at the previous step, on its way to the right
    for s in range(plan.steps):
        src = plan.source(s)
        sends, recvs = [], []
        nxt = incoming = None
        if s + 1 < plan.steps:
            nxt = c.empty_block(plan.source(s + 1), q.dtype)
            sends.append((block, right, _KV))
            recvs.append((nxt, left, _KV))
        if passed is not None:  # the left neighbour's gradient of the block we hold now
            incoming = c.empty_block(src, acc)
            sends.append((passed, right, _GRAD))
            recvs.append((incoming, left, _GRAD))
        pending = exchange(info, sends, recvs) if sends else None
        ks, vs = c.unpack(block, src)
        grad = torch.zeros(sum(c.kv_numel(src)), dtype=acc, device=c.device)
        dks, dvs = c.unpack(grad, src)
        for piece in plan.pieces[s]:
            (a, b), (c0, c1) = piece.rows, piece.cols
            qb, ob, dob = c.rows(q5, piece), c.rows(o5, piece), c.rows(do5, piece)
            lb = l4[:, :, :, a:b].reshape(c.B, c.Hkv, c.G * (b - a))
            kb, vb = ks[:, :, c0:c1], vs[:, :, c0:c1]
            allowed = c.mask_tile(piece, src)
            if leaves:
                with torch.enable_grad():
                    bias = c.bias_tile(piece, src)
                g_q, g_k, g_v = _leaf_tile_backward(c, dob, qb, kb, vb, ob, lb, allowed, bias, leaves, dleaves)
            else:
                bias = c.bias_tile(piece, src)
                g_q, g_k, g_v = attend_block_backward(
                    dob, qb, kb, vb, ob, lb, tile_mask=allowed,
                    bias_tile=None if bias is None else c._stack(bias, b - a, c1 - c0), scale=c.scale)
            dq[:, :, :, a:b] += g_q.view(c.B, c.Hkv, c.G, b - a, c.D).to(acc)
            dks[:, :, c0:c1] += g_k.to(acc)
            dvs[:, :, c0:c1] += g_v.to(acc)
        if pending is not None:
            pending.wait()
        if incoming is not None:
            grad += incoming
        passed = grad
        if nxt is not None:
            block = nxt
    # ``passed`` now holds every rank's share of the gradient of rank (r - S + 1)'s block: send it home
    home, mine_from = plan.source(plan.steps - 1), (info.rank + plan.steps - 1) % info.world
    if home == info.rank:
        mine = passed
    else:
        mine = c.empty_block(info.rank, acc)
        exchange(info, [(passed, home, _HOME)], [(mine, mine_from, _HOME)]).wait()
    dk, dv = c.unpack(mine, info.rank)
    return (dq.view(c.B, c.H, n, c.D).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), tuple(dleaves))


class _RingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c, *leaves):
        with torch.no_grad():
            out, lse = _ring_forward(c, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse, *leaves)
        ctx.c = c
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, *leaves = ctx.saved_tensors
        with torch.no_grad():
            dq, dk, dv, dleaves = _ring_backward(ctx.c, q, k, v, out, lse, dout.contiguous(), tuple(leaves))
        return (dq, dk, dv, None, *dleaves)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, mask=None, bias=None, scale: float | None = None,
                   group=None, layout: str | SequenceLayout = "zigzag",
                   return_lse: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Exact attention over a sequence sharded across the ranks of ``group`` (a collective).

    Every rank calls it with its own shard; the result is this rank's shard of
    ``attnlab.attention(q_full, k_full, v_full, mask=mask, bias=bias, scale=scale)``.

    Args:
        q: ``(B, H, n, D)`` this rank's queries: the positions the layout gives it (cut a
            full sequence with :func:`attnlab.distributed.shard_sequence`).
        k: ``(B, Hkv, n, D)``; v: ``(B, Hkv, n, Dv)`` the keys and values of the same
            positions (``H`` a multiple of ``Hkv``: grouped-query heads).
        mask: an :class:`attnlab.masks.Mask` over the *global* ``N x N`` positions
            (causal, sliding window, padding, document, prefix, and their combinations).
        bias: a function ``bias(b, h, q_idx, kv_idx)`` of global index tensors (e.g.
            ``ALiBi(H).bias_fn(N, N)``, ``T5RelativeBias(H).bias_fn(N, N)``); gradients of
            tensors it reads (a T5 table) are this rank's share: sum them over the ranks.
        scale: multiplier of ``q k^T`` (default ``1/sqrt(D)``).
        group: the process group the sequence is sharded over (default: the default group).
        layout: ``"zigzag"`` (default; balances causal masks), ``"contiguous"``, or a
            :class:`~attnlab.distributed.layout.SequenceLayout`.
        return_lse: also return the rows' log-sum-exp.

    Returns:
        ``out (B, H, n, Dv)`` (fully masked rows are zeros), and with ``return_lse`` also
        ``lse (B, H, n)`` (natural log, float32 (float64 for float64 inputs), ``-inf`` on fully masked rows; not
        differentiable).

    Raises:
        ValueError: a malformed shard (naming the argument), shard lengths the layout does
            not give (the same error on every rank), a mask in local instead of global
            positions, a group whose backend cannot move the tensors' device.

    The backward pass is a collective too: every rank must call it.
    """
    check_inputs(q, k, v)
    info, lay, m = resolve(q, k, v, mask, bias, group, layout, "ring_attention")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    plan = plan_ring(granule_kinds(m, lay), lay, info.rank, bias is not None)
    c = _Ctx(info, plan, m, bias, scale, q.shape[0], q.shape[1], k.shape[1], q.shape[3], v.shape[3], q.device)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    leaves = bias_leaves(make_call(q, k, v, bias=bias)) if bias is not None else ()
    if torch.is_grad_enabled() and (leaves or any(t.requires_grad for t in (q, k, v))):
        out, lse = _RingFn.apply(q, k, v, c, *leaves)
    else:
        with torch.no_grad():
            out, lse = _ring_forward(c, q, k, v)
    return (out, lse) if return_lse else out
