"""A mask as the native kernel reads it: per-row key intervals, a tile table and bit tiles.

Most masks say, for every query row, one interval of keys: causal, sliding window, padding,
a key prefix, documents in contiguous runs, prefix-LM and their ``&``
(:meth:`attnlab.masks.Mask.row_interval`). The kernel walks only the key tiles of a row
block's intervals, and inside a tile only each row's own columns, so these masks cost
nothing to evaluate and the work is the allowed area (plus the tiles' ragged edges).

What an interval cannot say (global tokens, ``|`` of non-touching parts, dense masks,
documents that recur) is the *rest* of the mask: the ``&`` of the conjuncts that have no
interval. It is classified into tiles as :meth:`~attnlab.masks.Mask.block_kinds` does:
EMPTY tiles are skipped, FULL tiles read nothing, and each PARTIAL tile gets a bit tile,
``BLOCK_Q x BLOCK_K`` bits evaluated by the mask's own ``allows`` (vectorized over all such
tiles at once). Tiles that the intervals already empty get no bits.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys, ``Bi``/``Bt``/``Ht`` 1 or
``B``/``B``/``H`` (what the mask depends on), ``nqb``/``nkb`` query/key tiles, ``P`` bit tiles.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import masks as masks_mod
from ..masks import EMPTY, FULL, PARTIAL, Mask

__all__ = ["BLOCK_K", "BLOCK_Q", "KernelMask", "kernel_mask", "visible_pairs"]

#: the kernel's tile: query rows x keys (oneDNN's float32 brgemm runs at its peak from 64 x 64 x 64 on,
#: 250-270 GFLOP/s on one Zen 5 core for every shape from 64 to 256)
BLOCK_Q = 64
BLOCK_K = 64
#: bit tiles evaluated per ``allows`` call (bounds its temporaries to about 100 MiB)
_TILES_PER_PASS = 2048


@dataclass(frozen=True)
class KernelMask:
    """The native kernel's mask inputs (None where the mask needs none).

    Attributes:
        lo, hi: int32 ``(Bi, N)``: row ``i`` may see keys ``lo <= k < hi`` at most.
        tiles: int32 ``(Bt, Ht, nqb, nkb)``: -1 FULL, -2 EMPTY, ``p >= 0`` bit tile ``p``.
        bits: uint8 ``(P, BLOCK_Q, BLOCK_K / 8)``: bit ``j % 8`` of byte ``j // 8`` of row ``i``.
        visible: the (query, key) pairs the kernel computes per (batch row, head), about (from the
            intervals, else from the tiles), for cost estimates; NaN from :func:`kernel_mask` inside
            ``torch.compile`` tracing (reading a tensor's value there would break the graph).
    """

    lo: Tensor | None = None
    hi: Tensor | None = None
    tiles: Tensor | None = None
    bits: Tensor | None = None
    visible: float = 0.0

    def args(self) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
        return self.lo, self.hi, self.tiles, self.bits


def _intervals(parts: list[Mask], N: int, M: int, device) -> tuple[Tensor | None, Tensor | None, list[Mask]]:
    """The intersection of the parts' row intervals ``(Bi, N)`` and the parts that have none."""
    lo = hi = None
    rest = []
    for part in parts:
        iv = part.row_interval(N, M, device)
        if iv is None:
            rest.append(part)
            continue
        lo_p, hi_p = (t.clamp(0, M) for t in iv)
        lo, hi = (lo_p, hi_p) if lo is None else (torch.maximum(lo, lo_p), torch.minimum(hi, hi_p))
    if lo is not None:
        lo, hi = (t.contiguous() for t in torch.broadcast_tensors(lo, hi))
    return lo, hi, rest


def _interval_empty(lo: Tensor, hi: Tensor, N: int, M: int) -> Tensor:
    """``(Bi, 1, nqb, nkb)`` True where no row of the query tile reaches the key tile by its interval."""
    nqb, nkb = math.ceil(N / BLOCK_Q), math.ceil(M / BLOCK_K)
    pad = nqb * BLOCK_Q - N
    seen = lo < hi
    qlo = torch.where(seen, lo, M)
    qhi = torch.where(seen, hi, 0)
    qlo = torch.nn.functional.pad(qlo, (0, pad), value=M).view(-1, nqb, BLOCK_Q).amin(-1)  # (Bi, nqb)
    qhi = torch.nn.functional.pad(qhi, (0, pad), value=0).view(-1, nqb, BLOCK_Q).amax(-1)
    k0 = torch.arange(nkb, device=lo.device) * BLOCK_K
    k1 = torch.clamp(k0 + BLOCK_K, max=M)
    empty = (qhi[..., None] <= k0) | (qlo[..., None] >= k1)  # (Bi, nqb, nkb)
    return empty.unsqueeze(1)


def _pack(allowed: Tensor) -> Tensor:
    """``(P, BQ, BK)`` bool -> ``(P, BQ, BK / 8)`` uint8, key ``j`` at bit ``j % 8`` of byte ``j // 8``."""
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=allowed.device)
    x = allowed.view(allowed.shape[0], allowed.shape[1], allowed.shape[2] // 8, 8).to(torch.uint8) * weights
    return x.sum(-1, dtype=torch.uint8)


def _bit_tiles(rest: Mask, kinds: Tensor, N: int, M: int) -> tuple[Tensor, Tensor]:
    """The tile table and the bit tiles of ``rest`` for tile kinds ``(Bt, Ht, nqb, nkb)``."""
    table = torch.full(kinds.shape, -1, dtype=torch.int32, device=kinds.device)
    table[kinds == EMPTY] = -2
    where = (kinds == PARTIAL).nonzero()  # (P, 4): b, h, query tile, key tile
    table[tuple(where.t())] = torch.arange(where.shape[0], dtype=torch.int32, device=kinds.device)
    rows = torch.arange(BLOCK_Q, device=kinds.device)
    cols = torch.arange(BLOCK_K, device=kinds.device)
    bits = []
    for w in where.split(_TILES_PER_PASS):
        b, h = w[:, 0].view(-1, 1, 1), w[:, 1].view(-1, 1, 1)
        q = torch.clamp(w[:, 2].view(-1, 1, 1) * BLOCK_Q + rows.view(1, -1, 1), max=N - 1)  # (p, BQ, 1)
        k = torch.clamp(w[:, 3].view(-1, 1, 1) * BLOCK_K + cols.view(1, 1, -1), max=M - 1)  # (p, 1, BK)
        allowed = rest.allows(b, h, q, k, N, M).expand(w.shape[0], BLOCK_Q, BLOCK_K)
        bits.append(_pack(allowed.contiguous()))
    packed = torch.cat(bits) if bits else torch.zeros(0, BLOCK_Q, BLOCK_K // 8, dtype=torch.uint8,
                                                      device=kinds.device)
    return table.contiguous(), packed


#: per mask (weakly held), per (N, M): :func:`visible_pairs` (``auto`` costs a call on two backends that ask)
_VISIBLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def visible_pairs(mask: Mask, N: int, M: int) -> float:
    """About how many (query, key) pairs the kernel computes per (batch row, head) under ``mask``.

    The area of the conjuncts' row intervals when there are some, else the FULL and PARTIAL tiles of
    :meth:`~attnlab.masks.Mask.block_kinds` times the tile's size: a cost estimate that never evaluates
    the mask inside a tile (what :func:`kernel_mask` does for its bit tiles), cached per mask and shape.
    """
    try:
        cached = _VISIBLE.setdefault(mask, {})
    except TypeError:  # not weakly referable: computed each time
        cached = {}
    if (N, M) in cached:
        return cached[(N, M)]
    mask.validate(N, M)
    lo, hi, rest = _intervals(masks_mod.conjuncts(mask), N, M, None)
    if lo is not None:
        visible = float((hi - lo).clamp(min=0).sum()) / lo.shape[0]
    else:
        part = functools.reduce(lambda a, b: a & b, rest)
        kinds = part.block_kinds(N, M, BLOCK_Q, BLOCK_K)  # (B'|1, H'|1, nqb|1, nkb|1)
        nqb, nkb = math.ceil(N / BLOCK_Q), math.ceil(M / BLOCK_K)
        per_tile = (nqb // kinds.shape[2]) * (nkb // kinds.shape[3])  # a kinds dim of 1 stands for all tiles
        visible = float((kinds != EMPTY).sum(dim=(-1, -2)).amax()) * per_tile * BLOCK_Q * BLOCK_K
    cached[(N, M)] = visible
    return visible


def kernel_mask(mask: Mask | None, N: int, M: int, device=None) -> KernelMask:
    """Translate ``mask`` for a call of ``N`` queries and ``M`` keys (see the module docstring)."""
    if mask is None:
        return KernelMask(visible=float(N * M))
    mask.validate(N, M)
    lo, hi, rest = _intervals(masks_mod.conjuncts(mask), N, M, device)
    tracing = torch.compiler.is_compiling()  # no tensor read inside a compiled graph: no visible count there
    if tracing:
        visible = math.nan
    else:
        visible = float((hi - lo).clamp(min=0).sum()) / lo.shape[0] if lo is not None else float(N * M)
    if not rest:
        return KernelMask(lo.to(torch.int32), hi.to(torch.int32), visible=visible)
    part = functools.reduce(lambda a, b: a & b, rest)
    nqb, nkb = math.ceil(N / BLOCK_Q), math.ceil(M / BLOCK_K)
    kinds = part.block_kinds(N, M, BLOCK_Q, BLOCK_K, device=device)  # (B'|1, H'|1, nqb|1, nkb|1)
    kinds = kinds.expand(kinds.shape[0], kinds.shape[1], nqb, nkb)
    if lo is not None:
        kinds = torch.where(_interval_empty(lo, hi, N, M), torch.tensor(EMPTY, dtype=kinds.dtype, device=kinds.device),
                            kinds)
    tiles, bits = _bit_tiles(part, kinds, N, M)
    if lo is None and not tracing:
        full = (kinds == FULL).sum(dim=(-1, -2)).amax()
        part_tiles = (kinds == PARTIAL).sum(dim=(-1, -2)).amax()
        visible = float(full + part_tiles) * BLOCK_Q * BLOCK_K
    return KernelMask(None if lo is None else lo.to(torch.int32), None if hi is None else hi.to(torch.int32),
                      tiles, bits, visible)
