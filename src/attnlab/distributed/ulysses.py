"""Ulysses attention: all-to-all from sequence shards to head shards, attention, and back.

Jacobs et al., 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
Extreme Long Sequence Transformer Models". Each of the ``P`` ranks holds ``n`` positions
of all ``H`` heads. One ``all_to_all_single`` (which gloo implements, with unequal splits)
gives rank ``r`` all ``N`` positions of heads ``r H/P .. (r+1) H/P - 1``; any exact attnlab
backend (:func:`attnlab.attention`) then runs on full sequences, so every mask and bias
works exactly as in one process (evaluated at global positions, with head indices shifted
to the global head numbers); a second all-to-all brings the output back to sequence shards.

Needs ``H`` divisible by ``P``. Key/value heads are sharded the same way when ``Hkv`` is
divisible by ``P``, else repeated to ``H`` heads first (more traffic, the same result).

Per rank: time O(B H N^2 D / P) (the chosen backend's), memory that of the backend on
``H / P`` heads of the full sequence; communication 4 all-to-alls of a shard forward
(q, k, v, out), as many backward. Shape legend: ``B`` batch, ``H`` query heads, ``Hkv``
key/value heads, ``n`` local positions, ``N`` global positions, ``D``/``Dv`` head dims.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import Tensor

from ..exact import attention
from ..masks import Mask
from .checks import check_inputs, resolve
from .comm import STATS, GroupInfo, agree_shapes, group_info
from .layout import SequenceLayout, make_layout

__all__ = ["heads_to_sequence", "sequence_to_heads", "ulysses_attention"]


class _Exchange:
    """The split sizes and position order of one sequence <-> heads exchange."""

    def __init__(self, info: GroupInfo, lay: SequenceLayout, device: torch.device):
        self.info, self.lay = info, lay
        self.lengths = [lay.shard_length(r) for r in range(lay.world)]
        order = torch.cat([lay.positions(r, device=device) for r in range(lay.world)])  # global position of each
        # layout-ordered row; None when the layout order is the global order (contiguous)
        same = bool(torch.equal(order, torch.arange(lay.length, device=device)))
        self.order = None if same else order
        self.inverse = None if same else torch.argsort(order)


def _to_heads(ex: _Exchange, x: Tensor) -> Tensor:
    """``(B, Hx, n_r, F)`` -> ``(B, Hx/P, N, F)``: this rank's head group, every position, global order."""
    P = ex.info.world
    B, Hx, n, F = x.shape
    h = Hx // P
    send = x.reshape(B, P, h, n, F).transpose(0, 1).contiguous()  # (P, B, h, n, F): head group i for rank i
    recv = torch.empty(sum(B * h * m * F for m in ex.lengths), dtype=x.dtype, device=x.device)
    if P == 1:
        recv.copy_(send.view(-1))
    else:
        t0 = time.perf_counter()
        dist.all_to_all_single(recv, send.view(-1), [B * h * m * F for m in ex.lengths], [B * h * n * F] * P,
                               group=ex.info.group)
        STATS.seconds += time.perf_counter() - t0
        STATS.bytes_sent += send.numel() * send.element_size() * (P - 1) // P
    parts, at = [], 0
    for m in ex.lengths:
        parts.append(recv[at: at + B * h * m * F].view(B, h, m, F))  # (B, h, n_i, F) from rank i
        at += B * h * m * F
    full = torch.cat(parts, dim=2)  # (B, h, N, F) in layout order (rank 0's positions first)
    return full if ex.inverse is None else full.index_select(2, ex.inverse)


def _to_sequence(ex: _Exchange, y: Tensor) -> Tensor:
    """``(B, h, N, F)`` of this rank's head group -> ``(B, h P, n_r, F)``: every head, this rank's positions."""
    P, r = ex.info.world, ex.info.rank
    B, h, _, F = y.shape
    n = ex.lengths[r]
    lay_order = y if ex.order is None else y.index_select(2, ex.order)  # (B, h, N, F) in layout order
    send = torch.cat([part.reshape(-1) for part in torch.split(lay_order, ex.lengths, dim=2)])
    recv = torch.empty(P * B * h * n * F, dtype=y.dtype, device=y.device)
    if P == 1:
        recv.copy_(send)
    else:
        t0 = time.perf_counter()
        dist.all_to_all_single(recv, send, [B * h * n * F] * P, [B * h * m * F for m in ex.lengths],
                               group=ex.info.group)
        STATS.seconds += time.perf_counter() - t0
        STATS.bytes_sent += (send.numel() - ex.lengths[ex.info.rank] * B * h * F) * send.element_size()
    return recv.view(P, B, h, n, F).transpose(0, 1).reshape(B, P * h, n, F)  # (B, H, n, F)


class _AllToAll(torch.autograd.Function):
    """One of the two all-to-alls (``there``: :func:`_to_heads` or :func:`_to_sequence`) as an autograd function:
    its backward is the other one (``back``) on the gradient."""

    @staticmethod
    def forward(ctx, x, ex, there, back):
        ctx.ex, ctx.back = ex, back
        return there(ex, x)

    @staticmethod
    def backward(ctx, g):
        return ctx.back(ctx.ex, g.contiguous()), None, None, None


def _seq_to_heads(x: Tensor, ex: _Exchange) -> Tensor:
    return _AllToAll.apply(x, ex, _to_heads, _to_sequence)


def _heads_to_seq(y: Tensor, ex: _Exchange) -> Tensor:
    return _AllToAll.apply(y, ex, _to_sequence, _to_heads)


def sequence_to_heads(x: Tensor, *, group=None, layout: str | SequenceLayout = "zigzag",
                      length: int | None = None) -> Tensor:
    """``(B, H, n, F)`` sequence shards -> ``(B, H/P, N, F)`` head shards (a differentiable collective).

    Rank ``r`` receives heads ``r H/P .. (r+1) H/P - 1`` of all ``N`` positions, in global
    order. ``length`` is ``N`` (default: the sum of the ranks' ``n``, found by one small
    all-gather). ``H`` must be divisible by the group size.
    """
    info = group_info(group, x.device, "sequence_to_heads")
    if x.ndim != 4 or x.shape[1] % info.world != 0:
        raise ValueError(f"x must be (B, H, n, F) with H divisible by the world size {info.world}, "
                         f"got shape {tuple(x.shape)}")
    if length is None:
        length = sum(r[0] for r in agree_shapes(info, [x.shape[2]], x.device))
    ex = _Exchange(info, make_layout(layout, info.world, length), x.device)
    if x.shape[2] != ex.lengths[info.rank]:
        raise ValueError(f"x holds {x.shape[2]} positions but the {ex.lay.kind} layout of N={length} gives rank "
                         f"{info.rank} {ex.lengths[info.rank]}")
    return _seq_to_heads(x.contiguous(), ex)


def heads_to_sequence(y: Tensor, *, group=None, layout: str | SequenceLayout = "zigzag") -> Tensor:
    """``(B, H/P, N, F)`` head shards -> ``(B, H, n, F)`` sequence shards: the inverse of :func:`sequence_to_heads`."""
    info = group_info(group, y.device, "heads_to_sequence")
    if y.ndim != 4:
        raise ValueError(f"y must be (B, H/P, N, F), got shape {tuple(y.shape)}")
    ex = _Exchange(info, make_layout(layout, info.world, y.shape[2]), y.device)
    return _heads_to_seq(y.contiguous(), ex)


class _HeadSlice(Mask):
    """A mask that reads the head index, seen from a rank holding heads ``h0 ..``: local head ``h`` is ``h0 + h``."""

    def __init__(self, inner: Mask, h0: int, heads: int):
        self.inner, self.h0, self.heads = inner, h0, heads

    @property
    def depends(self):  # type: ignore[override]
        return self.inner.depends

    @property
    def batch_size(self):
        return self.inner.batch_size

    @property
    def num_heads(self):
        return self.heads

    def validate(self, n_q, n_k):
        self.inner.validate(n_q, n_k)

    def allows(self, b, h, q, k, n_q, n_k):
        return self.inner.allows(b, h + self.h0, q, k, n_q, n_k)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        kinds = self.inner.block_kinds(n_q, n_k, block_q, block_k, device)  # (B', H'|1, nqb, nkb)
        return kinds if kinds.shape[1] == 1 else kinds[:, self.h0: self.h0 + self.heads]

    def to(self, device):
        return _HeadSlice(self.inner.to(device), self.h0, self.heads)

    def __repr__(self):
        return f"heads({self.h0}..{self.h0 + self.heads - 1} of {self.inner!r})"


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, *, mask=None, bias=None, scale: float | None = None,
                      group=None, layout: str | SequenceLayout = "zigzag", backend: str = "auto") -> Tensor:
    """Exact attention over a sequence sharded across ``group``, by head-sharding all-to-all (a collective).

    Every rank calls it with its own shard; the result is this rank's shard of
    ``attnlab.attention(q_full, k_full, v_full, mask=mask, bias=bias, scale=scale)``.

    Args:
        q: ``(B, H, n, D)`` this rank's queries, ``H`` divisible by the group size ``P``.
        k: ``(B, Hkv, n, D)``; v: ``(B, Hkv, n, Dv)`` keys and values of the same positions.
        mask: an :class:`attnlab.masks.Mask` over the global ``N x N`` positions.
        bias: a function ``bias(b, h, q_idx, kv_idx)`` of global index tensors (global head numbers).
        scale: multiplier of ``q k^T`` (default ``1/sqrt(D)``).
        group: the process group (default: the default group).
        layout: how the sequence is sharded (see :func:`attnlab.distributed.shard_sequence`).
        backend: the :func:`attnlab.attention` backend run on the ``H/P`` heads (``"auto"``).

    Returns:
        ``out (B, H, n, Dv)``, this rank's positions; fully masked rows are zeros.

    Raises:
        ValueError: ``H`` not divisible by ``P``, malformed or mis-sized shards, a mask in
            local positions, a group whose backend cannot move the tensors' device.
    """
    check_inputs(q, k, v)
    info, lay, m = resolve(q, k, v, mask, bias, group, layout, "ulysses_attention")
    P, r = info.world, info.rank
    H, Hkv = q.shape[1], k.shape[1]
    if H % P != 0:
        raise ValueError(f"q: ulysses_attention shards the heads over the ranks, but H={H} query heads are not "
                         f"divisible by the world size {P}; use ring_attention, or a head count divisible by {P}")
    if Hkv % P != 0:  # key/value heads cannot be split evenly: give every query head its own copy
        k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, n, D)
        v = v.repeat_interleave(H // Hkv, dim=1)  # (B, H, n, Dv)
    ex = _Exchange(info, lay, q.device)
    qh, kh, vh = (_seq_to_heads(t.contiguous(), ex) for t in (q, k, v))  # (B, H/P or Hkv/P, N, F)
    h0 = r * (H // P)
    if m is not None and "h" in m.depends:
        m = _HeadSlice(m, h0, H // P)
    fn = None
    if bias is not None:
        def fn(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, _inner=bias) -> Tensor:
            if h.ndim == 4 and h.shape[1] > 1:
                # one head at a time: bias modules check that a grid of heads spans all H they were built for
                return torch.cat([_inner(b, h[:, j: j + 1] + h0, qi, ki) for j in range(h.shape[1])], dim=1)
            return _inner(b, h + h0, qi, ki)
    out = attention(qh, kh, vh, mask=m, bias=fn, scale=scale, backend=backend)  # (B, H/P, N, Dv)
    return _heads_to_seq(out.contiguous(), ex)  # (B, H, n, Dv)
