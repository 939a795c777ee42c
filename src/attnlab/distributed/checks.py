"""Validation shared by ring and Ulysses attention, done alike on every rank.

A sequence-parallel call that fails on one rank and proceeds on another deadlocks, so every
check that depends on another rank's data runs after one small all-gather of every rank's
shapes (:func:`resolve`), and raises the same ValueError on all ranks.
"""

from __future__ import annotations

from torch import Tensor

from ..exact.call import check_qkv
from ..masks import as_mask
from .comm import agree_shapes, group_info
from .layout import make_layout

__all__ = ["check_inputs", "resolve"]


def check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """This rank's ``q (B, H, n, D)``, ``k (B, Hkv, n, D)``, ``v (B, Hkv, n, Dv)`` are well-formed shards."""
    check_qkv(q, k, v, who="this rank's shard", allow_empty=True)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"k must hold the same positions as q (self-attention over one sharded sequence), got "
                         f"{k.shape[2]} key positions and {q.shape[2]} query positions on this rank")


def resolve(q: Tensor, k: Tensor, v: Tensor, mask, bias, group, layout, what: str):
    """Validate a sequence-parallel call on every rank alike; ``(info, layout, mask)`` for it.

    One small all-gather shares every rank's shapes, so a bad shard (a length the layout
    does not give that rank, ranks that disagree on heads) raises the same ValueError on
    every rank. The mask is checked against the global length ``N``.
    """
    info = group_info(group, q.device, what)
    B, H, n, D = q.shape
    mine = [n, B, H, k.shape[1], D, v.shape[3]]
    rows = agree_shapes(info, mine, q.device)
    if any(r[1:] != mine[1:] for r in rows):
        raise ValueError(f"q, k, v: ranks disagree on (B, H, Hkv, D, Dv): "
                         f"{[tuple(r[1:]) for r in rows]} (rank by rank)")
    lengths = [r[0] for r in rows]
    N = sum(lengths)
    if N < info.world:
        raise ValueError(f"q: a sequence of N={N} positions cannot be sharded over {info.world} ranks (N >= P)")
    lay = make_layout(layout, info.world, N)
    want = [lay.shard_length(r) for r in range(info.world)]
    if lengths != want:
        raise ValueError(f"q: the ranks hold {lengths} positions but the {lay.kind} layout of N={N} over "
                         f"{info.world} ranks gives them {want}; cut the shards with "
                         f"attnlab.distributed.shard_sequence(x, rank, world, layout={lay.kind!r})")
    m = as_mask(mask, "mask")
    if m is not None:
        try:
            m.validate(N, N)
        except ValueError as e:
            raise ValueError(f"mask: {e}. {what} evaluates masks at global positions, so a mask's per-position "
                             f"data (document ids, padding lengths) must cover all N={N} positions, not this "
                             f"rank's {n}") from None
        if m.batch_size is not None and m.batch_size not in (1, B):
            raise ValueError(f"mask is for batch size {m.batch_size} but q has batch size {B}")
        if m.num_heads is not None and m.num_heads not in (1, H):
            raise ValueError(f"mask is for {m.num_heads} heads but q has {H} heads")
        m = m.to(q.device)
    if bias is not None and not callable(bias):
        raise ValueError(f"bias must be a function (b, h, q_idx, kv_idx) -> bias of global indices "
                         f"(e.g. ALiBi(H).bias_fn(N, N)), got {type(bias).__name__}: a bias tensor would be the "
                         "full (B, H, N, N) score matrix that sharding avoids")
    return info, lay, m
