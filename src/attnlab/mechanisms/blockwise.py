"""Block-sparse exact attention as a few fused calls: query blocks folded into the head dimension.

Local, Longformer and BigBird attention are exact attention restricted to a few key
blocks per query block. Here the positions are cut into blocks of ``bs``; query block
``i`` becomes one "head" of ``bs`` rows (``(BH, nb, bs, D)``) and the keys it may see are
laid out beside it (``(BH, nb, L, D)``), so one call of
:func:`attnlab.exact.tiles.attend_block` (PyTorch's fused CPU flash kernel, plain torch
elsewhere) computes every block at once: no Python loop over blocks and no score matrix
in memory, forward or backward.

The keys of a query block come in *parts*, one fused call each, merged by log-sum-exp
(:func:`attnlab.exact.tiles.merge_partials`):

* :class:`Band`: the ``K`` consecutive key blocks ``i + lo .. i + lo + K - 1`` (a sliding
  window; Local's own and previous block). A strided view of the padded keys: the
  overlapping windows share memory instead of being copied ``K`` times.
* :class:`Table`: any ``K`` key blocks per query block, gathered (BigBird's table measured
  faster on its own gather-and-SDPA path; see :mod:`attnlab.mechanisms.bigbird`).
* :class:`Shared`: the same ``E`` key positions for every query block (global tokens),
  read through a stride-0 view.

Each part carries a boolean ``tile_mask`` broadcastable to ``(BH, nb, bs, L)`` (the
mechanism's pattern and the user's mask on that part's (query, key) pairs) and may ask
for the fused op's top-left causal triangle instead. The backward is
:func:`attnlab.exact.tiles.attend_block_backward` of each part given the merged (global)
``out`` and ``lse``; each part folds its key gradients back onto positions with a few
large ops (shifted adds, one ``embedding_bag``), never ``index_add_`` along the block
dimension: that runs one small parallel add per listed block, and in a profile of Longformer's
gather-and-SDPA fwd+bwd at N=4096 on the busy 2-core CPU it took 3.2 s of 4.0 s.

The readable path these calls are checked against is
:func:`attnlab.mechanisms.local.block_attention` with ``fused=False`` (gathered key blocks, one batched
SDPA call, autograd through everything) and exact attention under the dense pattern.

Shape legend: BH batch x heads, N queries, M keys, D head dim, Dv value dim, bs block
size, nb query blocks, K key blocks of a part, L keys of a part per query block, E shared keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from ..exact.tiles import attend_block, attend_block_backward, merge_partials


class Band:
    """Key blocks ``i + lo .. i + lo + K - 1`` for query block ``i`` (out-of-range ones read padding).

    The caller's mask must exclude the padding keys (positions ``< 0`` or ``>= M``).
    """

    def __init__(self, lo: int, K: int):
        self.lo, self.K = lo, K

    def pad_blocks(self, nb: int, nbk: int) -> tuple[int, int]:
        """Blocks of padding needed before and after ``nbk`` key blocks for ``nb`` query blocks."""
        return max(0, -self.lo), max(0, nb - 1 + self.lo + self.K - nbk)

    def keys(self, x: Tensor, bs: int, nb: int, lb: int) -> Tensor:
        """``x (BH, P, D)`` padded keys (position p at row ``lb*bs + p``) -> ``(BH, nb, K*bs, D)`` view."""
        s0, s1 = x.stride(0), x.stride(1)
        return x.as_strided((x.shape[0], nb, self.K * bs, x.shape[2]), (s0, bs * s1, s1, x.stride(2)),
                            x.storage_offset() + (lb + self.lo) * bs * s1)  # (BH, nb, K*bs, D)

    def fold(self, g: Tensor, acc: Tensor, bs: int, nb: int, lb: int) -> None:
        """Add the gradient ``g (BH, nb, K*bs, D)`` of :meth:`keys` into ``acc (BH, Pb, bs, D)``."""
        gv = g.view(g.shape[0], nb, self.K, bs, g.shape[-1])  # (BH, nb, K, bs, D)
        for j in range(self.K):
            start = lb + self.lo + j
            acc[:, start : start + nb] += gv[:, :, j]


class Table:
    """Key blocks ``table[i]`` (``(nb, K)``, ``-1`` = none; it then reads block 0, which the mask must exclude)."""

    def __init__(self, table: Tensor):
        self.table = table
        self.K = table.shape[1]
        flat = table.clamp(min=0).reshape(-1)  # (nb*K,)
        # for the backward: slots grouped by the key block they read (one bag per key block)
        order = torch.argsort(flat, stable=True)
        self._order = order  # (nb*K,) slots sorted by key block
        self._flat = flat

    def pad_blocks(self, nb: int, nbk: int) -> tuple[int, int]:
        return 0, 0

    def keys(self, x: Tensor, bs: int, nb: int, lb: int) -> Tensor:
        BH, D = x.shape[0], x.shape[2]
        blocks = x.reshape(BH, -1, bs * D)  # (BH, Pb, bs*D)
        return blocks.index_select(1, self._flat.to(x.device) + lb).view(BH, nb, self.K * bs, D)  # (BH, nb, K*bs, D)

    def fold(self, g: Tensor, acc: Tensor, bs: int, nb: int, lb: int) -> None:
        BH, D = g.shape[0], g.shape[-1]
        nbk = acc.shape[1] - lb
        dev = g.device
        rows = g.reshape(BH * nb * self.K, bs * D)  # (BH*nb*K, bs*D) one row per gathered block
        counts = torch.bincount(self._flat, minlength=nbk)[:nbk].to(dev)  # (nbk,) slots per key block
        per_bh = nb * self.K
        inp = (self._order.to(dev).view(1, -1) + torch.arange(BH, device=dev).view(-1, 1) * per_bh).reshape(-1)
        starts = F.pad(counts.cumsum(0)[:-1], (1, 0))  # (nbk,) first slot of each bag
        offsets = (starts.view(1, -1) + torch.arange(BH, device=dev).view(-1, 1) * per_bh).reshape(-1)  # (BH*nbk,)
        # one bag per (bh, key block): the sum of the gradients of every slot that read it
        summed = F.embedding_bag(inp, rows, offsets, mode="sum")  # (BH*nbk, bs*D)
        acc[:, lb : lb + nbk] += summed.view(BH, nbk, bs, D)


class Shared:
    """The same key positions ``pos (E,)`` for every query block."""

    def __init__(self, pos: Tensor):
        self.pos = pos
        self.K = 0

    def pad_blocks(self, nb: int, nbk: int) -> tuple[int, int]:
        return 0, 0

    def keys(self, x: Tensor, bs: int, nb: int, lb: int) -> Tensor:
        sel = x.index_select(1, self.pos.to(x.device) + lb * bs)  # (BH, E, D)
        return sel.unsqueeze(1).expand(x.shape[0], nb, sel.shape[1], x.shape[2])  # (BH, nb, E, D)

    def fold(self, g: Tensor, acc: Tensor, bs: int, nb: int, lb: int) -> None:
        flat = acc.view(acc.shape[0], -1, acc.shape[-1])  # (BH, Pb*bs, D)
        flat.index_add_(1, self.pos.to(g.device) + lb * bs, g.sum(1).to(flat.dtype))


@dataclass
class BlockPlan:
    """Which keys each query block sees: parts, their masks, and the padding that lines them up.

    Args:
        bs: block size; nb: query blocks (``nb * bs >= q_front + N``).
        q_front: zero rows put before the queries (query ``i`` sits at position ``i + q_front``).
        parts: :class:`Band`, :class:`Table` or :class:`Shared` objects.
        masks: per part, a bool tile broadcastable to ``(BH, nb, bs, L)`` or None (everything).
        causal: per part, also apply the fused op's top-left causal triangle of the ``(bs, L)`` tile.
        scale: score multiplier.
    """

    bs: int
    nb: int
    q_front: int
    parts: list
    masks: list = field(default_factory=list)
    causal: list = field(default_factory=list)
    scale: float = 1.0


class _BlockSparseFn(torch.autograd.Function):
    """``q (BH, N, D)``, ``k (BH, M, D)``, ``v (BH, M, Dv)`` -> ``(BH, N, Dv)`` under a :class:`BlockPlan`."""

    @staticmethod
    def forward(ctx, q, k, v, plan: BlockPlan):
        BH, N, D = q.shape
        M = k.shape[1]
        bs, nb = plan.bs, plan.nb
        nbk = -(-M // bs)
        lb = max([p.pad_blocks(nb, nbk)[0] for p in plan.parts] + [0])
        rb = max([p.pad_blocks(nb, nbk)[1] for p in plan.parts] + [0])
        q_back = nb * bs - plan.q_front - N
        qb = (F.pad(q, (0, 0, plan.q_front, q_back)) if plan.q_front or q_back else q).reshape(BH, nb, bs, D)
        kv_pad = (0, 0, lb * bs, (nbk + rb) * bs - M)
        kp = F.pad(k, kv_pad) if any(kv_pad) else k.contiguous()  # (BH, Pb*bs, D)
        vp = F.pad(v, kv_pad) if any(kv_pad) else v.contiguous()  # (BH, Pb*bs, Dv)
        out = lse = None
        keys = []  # each part's (BH, nb, L, D|Dv) keys and values: views, or gathered once for both passes
        for part, mask, causal in zip(plan.parts, plan.masks, plan.causal):
            kg, vg = part.keys(kp, bs, nb, lb), part.keys(vp, bs, nb, lb)  # (BH, nb, L, D|Dv)
            keys += [kg, vg]
            o, s = attend_block(qb, kg, vg, tile_mask=mask, scale=plan.scale, is_causal=causal)
            out, lse = (o, s) if out is None else merge_partials(out, lse, o, s)
        ctx.save_for_backward(qb, out, lse, *keys)
        ctx.plan, ctx.dims = plan, (N, M, lb, q_back, kp.shape[1])
        return out.reshape(BH, nb * bs, -1)[:, plan.q_front : plan.q_front + N]  # (BH, N, Dv)

    @staticmethod
    def backward(ctx, dout):
        qb, out, lse, *keys = ctx.saved_tensors
        plan = ctx.plan
        N, M, lb, q_back, P = ctx.dims
        BH, nb, bs, D = qb.shape
        do = F.pad(dout, (0, 0, plan.q_front, q_back)) if plan.q_front or q_back else dout
        do = do.reshape(BH, nb, bs, -1)  # (BH, nb, bs, Dv)
        dq = None
        kg0, vg0 = keys[0], keys[1]
        dk = torch.zeros(BH, P // bs, bs, D, dtype=kg0.dtype, device=kg0.device)  # (BH, Pb, bs, D)
        dv = torch.zeros(BH, P // bs, bs, vg0.shape[-1], dtype=vg0.dtype, device=vg0.device)
        for i, (part, mask, causal) in enumerate(zip(plan.parts, plan.masks, plan.causal)):
            kg, vg = keys[2 * i], keys[2 * i + 1]
            gq, gk, gv = attend_block_backward(do, qb, kg, vg, out, lse, tile_mask=mask, scale=plan.scale,
                                               is_causal=causal)
            dq = gq if dq is None else dq + gq
            part.fold(gk, dk, bs, nb, lb)
            part.fold(gv, dv, bs, nb, lb)
        dq = dq.reshape(BH, nb * bs, D)[:, plan.q_front : plan.q_front + N]  # (BH, N, D)
        dk = dk.view(BH, -1, D)[:, lb * bs : lb * bs + M]  # (BH, M, D)
        dv = dv.view(BH, -1, dv.shape[-1])[:, lb * bs : lb * bs + M]  # (BH, M, Dv)
        return dq, dk, dv, None


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, plan: BlockPlan) -> Tensor:
    """Exact attention of ``q (BH, N, D)`` over the keys ``plan`` gives each query block.

    ``k (BH, M, D)``, ``v (BH, M, Dv)`` (same heads as ``q``). Rows that may see no key are
    zeros. Differentiable in ``q``, ``k`` and ``v``.
    """
    if len(plan.masks) != len(plan.parts) or len(plan.causal) != len(plan.parts):
        raise ValueError(f"block_sparse_attention: {len(plan.parts)} parts need as many masks and causal flags, "
                         f"got {len(plan.masks)} and {len(plan.causal)}")
    return _BlockSparseFn.apply(q, k, v, plan)


__all__ = ["Band", "BlockPlan", "Shared", "Table", "block_sparse_attention"]
