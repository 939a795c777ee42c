"""The ``regroup`` backend: a grid mask that is a pure reshape, run as a batch of small dense attentions.

Axial, same-frame and same-position masks, and block / grid (MaxViT) masks whose sizes
divide the grid, split the ``N`` positions into ``G`` groups of ``S = N / G`` positions that
see each other and nothing else (:mod:`attnlab.masks.structured`). Their attention is
``G`` independent dense attentions: this backend views and permutes q, k and v into
``(B * G, H, S, D)`` (:class:`attnlab.masks.Regrouping`), hands that to
:func:`attnlab.attention` without a mask (SDPA's fused kernel, as ``auto`` picks), and
permutes the output back. Key-only parts of the mask (``grid & masks.padding(...)``: videos
with fewer real frames) travel along as the groups' key masks. It computes the function of
the ``math`` backend; autograd differentiates through the permutes and the inner call.

Why a backend rather than tiles: ``chunked`` skips the EMPTY tiles of these masks, but a
column, a time line or a grid group is strided over the sequence, so few tiles are empty or
full and most are PARTIAL (a mask per tile); regrouped, every group is one dense block with
no mask at all. As a backend it enrolls in ``auto``, ``explain``, ``attnlab info`` and the
conformance grid, and leaves the tiled kernels untouched. Time O(B H N S D) instead of
O(B H N^2 D); memory O(B H N D) for the permuted copies plus the inner call's.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` = ``M`` positions,
``G`` groups, ``S`` positions per group, ``D`` / ``Dv`` head dims.
"""

from __future__ import annotations

import torch

from ..masks import Mask, Regrouping, conjuncts
from .call import AttentionCall
from .registry import Backend, register_backend

#: the cost of moving one element through a permuted copy, in flop-equivalents at SDPA speed
#: (q, k, v in, the output back: four copies; and about the fixed cost of the inner call)
_COPY_COST = 2.0
_CALL_COST = 2.0e5


def plan(mask: Mask | None) -> tuple[Regrouping | None, list[Mask], str | None]:
    """``(regrouping, key-only parts, None)`` when ``mask`` is one regroupable grid mask and key masks; else a reason."""
    if mask is None:
        return None, [], "no mask: nothing to regroup (sdpa serves it)"
    grids, keys = [], []
    for part in conjuncts(mask):
        if callable(getattr(part, "regrouping", None)):  # the grid masks of attnlab.masks.structured
            grids.append(part)
        elif part.depends <= {"b", "k"}:
            keys.append(part)
        else:
            return None, [], f"mask part {part!r} is neither a grid mask nor a key mask"
    if len(grids) != 1:
        return None, [], (f"needs exactly one grid mask (axial, same_frame, same_position, block_2d, grid_2d), "
                          f"got {len(grids)}")
    regroup = grids[0].regrouping()
    if regroup is None:
        return None, [], f"{grids[0]!r} is not a pure reshape (its window or grid size does not divide the shape)"
    return regroup, keys, None


@register_backend
class RegroupBackend(Backend):
    """Exact attention under a grid mask that is a pure reshape (:class:`attnlab.masks.Regrouping`):
    the positions are regrouped into independent groups (rows, columns, frames, windows), and
    each group is one small dense attention of a batched SDPA call."""

    name = "regroup"
    summary = "grid masks that are pure reshapes (axial, frames, divisible windows) as a batch of small attentions"

    def supports(self, call: AttentionCall) -> str | None:
        if call.mask is not None:
            try:
                call.mask.validate(call.N, call.M)
            except ValueError as e:  # the mask does not fit this call: the mask's own words
                return str(e)
        _, _, why = plan(call.mask)
        if why is not None:
            return why
        if call.return_weights:
            return "does not return the weights (return_weights=True needs 'math')"
        if call.has_bias():
            return "a score bias is indexed by global positions; regrouping does not carry it"
        if call.dropout_p > 0:
            return "dropout: the counter-based stream is indexed by global positions; regrouping does not carry it"
        if call.N != call.M:
            return f"grid masks are self-attention (N == M), got N={call.N}, M={call.M}"
        return None

    def estimate(self, call: AttentionCall) -> float:
        regroup, _, _ = plan(call.mask)
        assert regroup is not None
        work = 2.0 * call.B * call.H * call.N * regroup.size * (call.D + call.Dv)  # the groups' products
        copies = call.B * (2 * call.H * call.D + 2 * call.Hkv * call.D + call.Hkv * call.Dv)
        return (work + _COPY_COST * copies * call.N + _CALL_COST) * (2.5 if call.needs_grad else 1.0)

    def note(self, call: AttentionCall) -> str | None:
        regroup, _, _ = plan(call.mask)
        assert regroup is not None
        return f"{regroup.groups} groups of {regroup.size} positions, one dense attention each"

    def forward(self, call: AttentionCall):
        from .op import attention  # the inner call dispatches like any other

        regroup, keys, _ = plan(call.mask)
        assert regroup is not None
        q, k, v = (regroup.split(t) for t in (call.q, call.k, call.v))  # (B * G, H | Hkv, S, D | Dv)
        inner = None
        if keys:
            keep = torch.ones(1, call.M, dtype=torch.bool, device=call.device)
            for part in keys:  # (B'|1, 1, 1, M) each
                keep = keep & part.dense(call.N, call.M, device=call.device, batch=call.B)[:, 0, 0]
            inner = regroup.split_keys(keep, call.B)  # (B * G, 1, 1, S)
        out = attention(q, k, v, mask=inner, scale=call.scale)  # (B * G, H, S, Dv)
        return regroup.merge(out, call.B), None  # (B, H, N, Dv)
