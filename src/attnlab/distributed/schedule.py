"""Which blocks each rank computes at each step of the ring, from the mask's tile classes.

At step ``s`` of the ring, rank ``r`` holds the keys and values of rank ``(r - s) mod P``.
The mask is classified once on the global granule grid (``Mask.block_kinds(N, N, g, g)``:
EMPTY, PARTIAL or FULL per ``g x g`` tile of global positions; the layout's chunk
boundaries fall on granule boundaries, so every tile lies inside one chunk pair). For
each local query granule the visiting key granules are walked: EMPTY tiles are skipped,
runs of FULL tiles become one fused call without a mask, runs of PARTIAL tiles one call
with a small mask tile evaluated at global positions. Query granules with the same runs
are stacked into one call. The ring stops after the last step at which any rank has a
non-empty tile (a sliding window over a contiguous layout needs only the neighbours).

Everything here is a pure function of ``(mask, layout, rank)``, so every rank computes the
same step count without communicating.

Shape legend: ``N`` positions, ``P`` ranks, ``g`` granule, ``u = ceil(N / g)`` granules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..masks import EMPTY, FULL, PARTIAL, Mask
from .layout import SequenceLayout

__all__ = ["Piece", "RingPlan", "granule_kinds", "plan_ring"]

#: widest key run (positions) of a call that materializes a mask or bias tile, and the most
#: query rows stacked into such a call: a 256 x 1024 tile per (batch, head) keeps the
#: additive mask the fused kernel reads at 1 MiB per (B, H) slice in float32
MATERIALIZED_KEYS = 1024
MATERIALIZED_ROWS = 256


@dataclass(frozen=True)
class Piece:
    """One fused call: local query rows ``rows`` against the visiting shard's local keys ``cols``.

    ``partial`` says the call needs a mask tile (False: every pair of the block is allowed).
    """

    rows: tuple[int, int]
    cols: tuple[int, int]
    partial: bool


@dataclass(frozen=True)
class RingPlan:
    """One rank's work: ``steps`` ring steps, ``pieces[s]`` the calls of step ``s``.

    Attributes:
        layout: the sequence layout.
        rank: the rank this plan is for.
        steps: ring steps ``S`` every rank takes (the same on all ranks).
        pieces: per step, the calls this rank makes (possibly none).
    """

    layout: SequenceLayout
    rank: int
    steps: int
    pieces: tuple[tuple[Piece, ...], ...]

    def source(self, step: int) -> int:
        """The rank whose keys and values this rank holds at ``step``."""
        return (self.rank - step) % self.layout.world

    @property
    def computed_positions(self) -> int:
        """Query x key positions this rank computes (its share of the work)."""
        return sum((p.rows[1] - p.rows[0]) * (p.cols[1] - p.cols[0]) for ps in self.pieces for p in ps)


def granule_kinds(mask: Mask | None, layout: SequenceLayout) -> Tensor:
    """``(u, u)`` int8 tile kinds of ``mask`` on the global granule grid (FULL everywhere without a mask).

    A tile is EMPTY or FULL only when it is so for every batch row and head (the mask is
    then evaluated per batch and head inside PARTIAL tiles).
    """
    u, n, g = layout.granules, layout.length, layout.grain
    if mask is None:
        return torch.full((u, u), FULL, dtype=torch.int8)
    raw = mask.block_kinds(n, n, g, g, device="cpu")  # (B'|1, H'|1, u|1, u|1)
    raw = raw.expand(raw.shape[0], raw.shape[1], u, u)
    lo, hi = raw.amin(dim=(0, 1)), raw.amax(dim=(0, 1))
    return torch.where(hi == EMPTY, EMPTY, torch.where(lo == FULL, FULL, PARTIAL)).to(torch.int8)


def _runs(kinds: list[int], cols: list[tuple[int, int]], materialize_full: bool) -> tuple[tuple[int, int, int], ...]:
    """Non-empty ``(c0, c1, kind)`` key runs of one query granule (local key positions)."""
    out: list[tuple[int, int, int]] = []
    for kind, (c0, c1) in zip(kinds, cols):
        if kind == EMPTY:
            continue
        wide = kind == PARTIAL or materialize_full
        if out and out[-1][2] == kind and out[-1][1] == c0 and (not wide or c1 - out[-1][0] <= MATERIALIZED_KEYS):
            out[-1] = (out[-1][0], c1, kind)
        else:
            out.append((c0, c1, kind))
    return tuple(out)


def plan_ring(kinds: Tensor, layout: SequenceLayout, rank: int, has_bias: bool) -> RingPlan:
    """The ring plan of ``rank`` from the global ``kinds`` (:func:`granule_kinds`).

    ``has_bias``: the calls read a bias tile, so FULL runs are bounded like PARTIAL ones.
    """
    world = layout.world
    own = {r: layout.granules_of(r) for r in range(world)}
    idx = {r: torch.tensor([g for g, _, _ in own[r]], dtype=torch.long) for r in range(world)}

    def block(r: int, src: int) -> Tensor:
        return kinds.index_select(0, idx[r]).index_select(1, idx[src])  # (q granules of r, k granules of src)

    # the ring runs until the last step at which some rank has a non-empty tile
    steps = 1
    for s in range(world):
        if any(bool((block(r, (r - s) % world) != EMPTY).any()) for r in range(world) if own[r]
               and own[(r - s) % world]):
            steps = s + 1
    pieces = []
    for s in range(steps):
        src = (rank - s) % world
        if not own[rank] or not own[src]:
            pieces.append(())
            continue
        sub = block(rank, src).tolist()
        cols = [(a, b) for _, a, b in own[src]]
        rows = [(a, b) for _, a, b in own[rank]]
        step: list[Piece] = []
        group_rows: tuple[int, int] | None = None
        group_runs: tuple[tuple[int, int, int], ...] = ()
        for (a, b), row in zip(rows, sub):
            runs = _runs(row, cols, has_bias)
            capped = has_bias or any(kind == PARTIAL for _, _, kind in runs)
            if (group_rows is not None and runs == group_runs and group_rows[1] == a
                    and (not capped or b - group_rows[0] <= MATERIALIZED_ROWS)):
                group_rows = (group_rows[0], b)
                continue
            if group_rows is not None:
                step.extend(Piece(group_rows, (c0, c1), kind == PARTIAL) for c0, c1, kind in group_runs)
            group_rows, group_runs = (a, b), runs
        if group_rows is not None:
            step.extend(Piece(group_rows, (c0, c1), kind == PARTIAL) for c0, c1, kind in group_runs)
        pieces.append(tuple(step))
    return RingPlan(layout, rank, steps, tuple(pieces))
