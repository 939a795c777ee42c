"""Bad input to sequence-parallel attention gets a clear ValueError naming the argument, on every rank alike.

Shards of lengths the layout does not give, a mask with per-position data of the local
instead of the global length, ranks that disagree on heads, a bias tensor, a sequence
shorter than the world, tensors on a device the group's backend cannot move; and the
same call without any process group.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks, shard

from attnlab import masks
from attnlab.distributed import ring_attention, ulysses_attention


def _errors(rank, world):
    g = torch.Generator().manual_seed(0)
    N = 37
    full = torch.randn(1, 2, N, 8, generator=g)
    zig = shard(full, rank, world, "zigzag")  # 17 and 20 positions
    contig = shard(full, rank, world, "contiguous")  # 19 and 18
    for attend in (ring_attention, ulysses_attention):
        # contiguous shards handed to the zigzag layout: the same error on both ranks
        with pytest.raises(ValueError, match=r"q: the ranks hold \[19, 18\] positions but the zigzag layout of "
                                             r"N=37 over 2 ranks gives them \[17, 20\]"):
            attend(contig, contig, contig)
        # document ids of this rank's length instead of the global N
        ids = torch.zeros(1, zig.shape[2], dtype=torch.long)
        with pytest.raises(ValueError, match=r"mask: document ids cover \d+ positions but the call has n_k=37.*"
                                             r"global positions"):
            attend(zig, zig, zig, mask=masks.document(ids))
        with pytest.raises(ValueError, match="bias must be a function"):
            attend(zig, zig, zig, bias=torch.zeros(1, 2, N, N))
        # a device the gloo group cannot move
        meta = torch.empty(1, 2, zig.shape[2], 8, device="meta")
        with pytest.raises(ValueError, match=r"group uses backend 'gloo', which moves cpu tensors, but q is on meta"):
            attend(meta, meta, meta)
    # ranks that disagree on the head count
    heads = 2 if rank == 0 else 4
    x = torch.randn(1, heads, zig.shape[2], 8)
    with pytest.raises(ValueError, match=r"ranks disagree on \(B, H, Hkv, D, Dv\)"):
        ring_attention(x, x, x)
    with pytest.raises(ValueError, match=r"N=1 positions cannot be sharded over 2 ranks"):
        one = torch.randn(1, 2, 1 - rank, 8)
        ring_attention(one, one, one)
    with pytest.raises(ValueError, match=r"k must hold the same positions as q"):
        ring_attention(zig, zig[:, :, :3], zig[:, :, :3])


def test_bad_input_is_a_clear_error_on_every_rank():
    run_ranks(_errors, 2)


def test_without_a_process_group():
    x = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="needs an initialized torch.distributed process group"):
        ring_attention(x, x, x)
    with pytest.raises(ValueError, match=r"this rank's shard: q must have 4 dimensions \(batch, heads, seq, head_dim\)"):
        ring_attention(x[0], x, x)
