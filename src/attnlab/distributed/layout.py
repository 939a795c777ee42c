"""How a sequence of ``N`` positions is cut into per-rank shards, and the helpers that cut and join.

A layout splits the ``N`` positions into ``C`` chunks of consecutive positions and gives
each of the ``P`` ranks some of them, concatenated in chunk order:

* ``contiguous``: ``C = P``, rank ``r`` holds chunk ``r``.
* ``zigzag`` (the default): ``C = 2P``, rank ``r`` holds chunks ``r`` and ``2P - 1 - r``.
  Under a causal mask the early chunk of a rank sees few keys and the late one many, so
  every rank gets the same amount of work (with ``contiguous`` the last rank does ``2P - 1``
  times the work of the first).

Chunk sizes. Chunks are made of whole *granules* of ``granule`` positions (256 by default,
fewer for short sequences: about ``N / C``); the ``u = ceil(N / granule)`` granules are dealt
out as evenly as possible, earlier chunks taking the one extra, and the very last granule
of the sequence is cut short at ``N``. So ``N`` need not be divisible by ``P``: shards then
differ in length (by at most a granule plus the short tail), every rank knows every
rank's length from ``(N, P)`` alone, and the tile grid of a mask (granule x granule
tiles, see :mod:`attnlab.distributed.schedule`) lines up with every chunk boundary.

Shape legend: ``N`` positions of the full sequence, ``P`` ranks, ``C`` chunks, ``n`` a
rank's shard length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

__all__ = ["GRANULE", "LAYOUTS", "SequenceLayout", "make_layout", "shard_sequence", "unshard_sequence"]

#: the default granule: chunk sizes are multiples of it, and ring attention classifies
#: mask tiles of granule x granule positions (large enough that the per-tile Python cost is
#: small next to a 256-row fused kernel call, small enough to skip most of a causal diagonal)
GRANULE = 256
LAYOUTS = ("zigzag", "contiguous")


@dataclass(frozen=True)
class SequenceLayout:
    """The cut of an ``N``-position sequence into ``world`` shards (see the module docstring).

    Attributes:
        kind: ``"zigzag"`` or ``"contiguous"``.
        world: number of ranks ``P``.
        length: number of positions ``N`` of the full sequence.
        granule: positions per granule (chunks are whole granules but the last); default
            ``min(256, ceil(N / C))`` (``floor(N / C)`` where that would leave a rank empty).
    """

    kind: str
    world: int
    length: int
    granule: int | None = None

    def __post_init__(self):
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout kind must be one of {LAYOUTS}, got {self.kind!r}")
        for name, val, least in (("world", self.world, 1), ("length", self.length, 1)):
            if not isinstance(val, int) or isinstance(val, bool) or val < least:
                raise ValueError(f"layout {name} must be an int >= {least}, got {val!r}")
        if self.granule is not None and (not isinstance(self.granule, int) or isinstance(self.granule, bool)
                                         or self.granule < 1):
            raise ValueError(f"layout granule must be a positive int or None, got {self.granule!r}")
        if self.length < self.world:
            raise ValueError(f"layout length must be >= world: N={self.length} positions cannot be sharded over "
                             f"{self.world} ranks")
        empty = [r for r in range(self.world) if self.shard_length(r) == 0]
        if empty:
            raise ValueError(f"layout granule={self.granule} leaves rank(s) {empty} without positions for "
                             f"N={self.length} over {self.world} ranks; use a smaller granule")

    @property
    def chunks(self) -> int:
        """Number of chunks ``C`` (``2P`` for zigzag, ``P`` for contiguous)."""
        return 2 * self.world if self.kind == "zigzag" else self.world

    @property
    def grain(self) -> int:
        """The granule in use (``granule``, or its default for this ``N`` and ``C``)."""
        if self.granule is not None:
            return self.granule
        g = min(GRANULE, math.ceil(self.length / self.chunks))
        if math.ceil(self.length / g) < self.chunks:  # tiny N: fewer granules than chunks would leave a rank empty
            g = max(1, self.length // self.chunks)
        return g

    @property
    def granules(self) -> int:
        """Number of granules ``u = ceil(N / grain)`` (the last may be short)."""
        return math.ceil(self.length / self.grain)

    @cached_property
    def _bounds(self) -> list[int]:
        c, u = self.chunks, self.granules
        edges, acc = [0], 0
        for i in range(c):
            acc += u // c + (1 if i < u % c else 0)
            edges.append(min(acc * self.grain, self.length))
        return edges

    def chunk(self, i: int) -> tuple[int, int]:
        """``(start, stop)`` global positions of chunk ``i`` (possibly empty for tiny ``N``)."""
        return self._bounds[i], self._bounds[i + 1]

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """The chunk indices rank ``rank`` holds, in the order its shard concatenates them."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world - 1}], got {rank!r}")
        if self.kind == "zigzag":
            return rank, 2 * self.world - 1 - rank
        return (rank,)

    def ranges(self, rank: int) -> list[tuple[int, int]]:
        """Non-empty ``(start, stop)`` global ranges of ``rank``'s shard, in local order."""
        out = [self.chunk(i) for i in self.chunks_of(rank)]
        return [(a, b) for a, b in out if b > a]

    def shard_length(self, rank: int) -> int:
        """Number of positions ``n`` rank ``rank`` holds."""
        return sum(b - a for a, b in self.ranges(rank))

    def positions(self, rank: int, device=None) -> Tensor:
        """Global positions of ``rank``'s shard in local order, int64 ``(n,)``."""
        parts = [torch.arange(a, b, device=device) for a, b in self.ranges(rank)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)

    def granules_of(self, rank: int) -> list[tuple[int, int, int]]:
        """``(global granule index, local start, local stop)`` of each granule of ``rank``'s shard."""
        out, local = [], 0
        g = self.grain
        for a, b in self.ranges(rank):
            for s in range(a, b, g):
                e = min(s + g, b)
                out.append((s // g, local + s - a, local + e - a))
            local += b - a
        return out


def make_layout(layout: str | SequenceLayout, world: int, length: int) -> SequenceLayout:
    """A :class:`SequenceLayout` for ``world`` ranks and ``length`` positions.

    ``layout`` is a kind (``"zigzag"``/``"contiguous"``) or a layout, which must then match
    ``world`` and ``length`` (ValueError naming the mismatch otherwise).
    """
    if isinstance(layout, SequenceLayout):
        if layout.world != world or layout.length != length:
            raise ValueError(f"layout is for world={layout.world}, length={layout.length} but the call has "
                             f"world={world}, length={length}")
        return layout
    if not isinstance(layout, str):
        raise ValueError(f"layout must be one of {LAYOUTS} or a SequenceLayout, got {type(layout).__name__}")
    return SequenceLayout(layout, world, length)


def shard_sequence(x: Tensor, rank: int, world: int, *, layout: str | SequenceLayout = "zigzag",
                   dim: int = 2) -> Tensor:
    """Rank ``rank``'s shard of the full sequence ``x`` along ``dim`` (a copy).

    Args:
        x: any tensor whose dimension ``dim`` holds the ``N`` positions (for attention
            inputs ``(B, H, N, D)``, ``dim=2``; for a layer's input ``(B, N, E)``, ``dim=1``).
        rank, world: this rank and the number of ranks ``P``.
        layout: ``"zigzag"``, ``"contiguous"`` or a :class:`SequenceLayout` for ``N``.

    Returns:
        ``x`` with dimension ``dim`` cut to the shard's ``n`` positions, in local order.
    """
    lay = make_layout(layout, world, x.shape[dim])
    parts = [x.narrow(dim, a, b - a) for a, b in lay.ranges(rank)]
    return torch.cat(parts, dim=dim) if len(parts) != 1 else parts[0].clone()


def unshard_sequence(shards: list[Tensor] | tuple[Tensor, ...], *, layout: str | SequenceLayout = "zigzag",
                     dim: int = 2) -> Tensor:
    """The full sequence from every rank's shard (``shards[r]`` from rank ``r``), along ``dim``.

    The inverse of :func:`shard_sequence`: ``N`` is the sum of the shard lengths, and each
    shard must have the length the layout gives its rank (ValueError otherwise).
    """
    world = len(shards)
    if world == 0:
        raise ValueError("shards must hold one tensor per rank, got none")
    n = sum(int(s.shape[dim]) for s in shards)
    lay = make_layout(layout, world, n)
    pieces: dict[int, Tensor] = {}
    for r, s in enumerate(shards):
        if s.shape[dim] != lay.shard_length(r):
            raise ValueError(f"shards[{r}] holds {s.shape[dim]} positions along dim {dim} but the {lay.kind} layout "
                             f"of N={n} over {world} ranks gives rank {r} {lay.shard_length(r)}")
        local = 0
        for a, b in lay.ranges(r):
            pieces[a] = s.narrow(dim, local, b - a)
            local += b - a
    return torch.cat([pieces[a] for a in sorted(pieces)], dim=dim)
