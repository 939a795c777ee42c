"""Ulysses attention on 2 and 4 gloo ranks equals the single-process op; its all-to-all round trip is exact.

Masks at global positions (one that reads the head index too), a bias function with
global head numbers, key/value heads divisible by P (sharded) and not (repeated), N not
divisible by P, both layouts; and the clear error for heads not divisible by P.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import reference, run_ranks, shard

from attnlab import masks
from attnlab.distributed import heads_to_sequence, sequence_to_heads, ulysses_attention
from attnlab.positional import ALiBi


def _case(rank, world, *, mask=None, bias=None, H=4, Hkv=4, N=37, layout="zigzag", backend="auto"):
    g = torch.Generator().manual_seed(N + H)
    q = torch.randn(2, H, N, 8, generator=g)
    k, v = (torch.randn(2, Hkv, N, 8, generator=g) for _ in range(2))
    dout = torch.randn(2, H, N, 8, generator=g)
    want_out, _, want_grads = reference(q, k, v, dout, mask=mask, bias=bias)
    ql, kl, vl = (shard(t, rank, world, layout).requires_grad_() for t in (q, k, v))
    out = ulysses_attention(ql, kl, vl, mask=mask, bias=bias, layout=layout, backend=backend)
    out.backward(shard(dout, rank, world, layout))
    what = f"P={world} mask={mask!r} H={H}/{Hkv} N={N} {layout} {backend}"
    torch.testing.assert_close(out, shard(want_out, rank, world, layout), atol=1e-5, rtol=0, msg=lambda m: f"{what}: {m}")
    for name, got, want in zip(("dq", "dk", "dv"), (ql.grad, kl.grad, vl.grad), want_grads):
        torch.testing.assert_close(got, shard(want, rank, world, layout), atol=5e-5, rtol=0,
                                   msg=lambda m, n=name: f"{what} {n}: {m}")


def _parity(rank, world):
    g = torch.Generator().manual_seed(0)
    N = 37
    ids = torch.randint(0, 3, (2, N), generator=g).sort(-1).values
    per_head = torch.rand(1, 4, N, N, generator=g) > 0.3  # a mask that reads the head index
    cases = [dict(), dict(mask=masks.causal()), dict(mask=masks.document(ids) & masks.causal(), Hkv=2),
             dict(mask=masks.sliding_window(3, 3), layout="contiguous"), dict(mask=masks.padding([N - 5, 0])),
             dict(mask=masks.dense(per_head) & masks.causal()), dict(mask=masks.causal(), bias=ALiBi(4).bias_fn(N, N)),
             dict(mask=masks.causal(), Hkv=1, backend="chunked"), dict(mask=masks.causal(), N=world, H=world * 2,
                                                                       Hkv=world)]
    for case in cases:
        _case(rank, world, **case)
    # the round trip sequence -> heads -> sequence returns its input exactly
    for layout, N in (("zigzag", 37), ("contiguous", 16), ("zigzag", world)):
        x = shard(torch.randn(3, 2 * world, N, 5, generator=g), rank, world, layout)
        h = sequence_to_heads(x, layout=layout)
        assert h.shape == (3, 2, N, 5)
        assert torch.equal(heads_to_sequence(h, layout=layout), x)
    # heads not divisible by the world size: a clear error, the same on every rank
    q = torch.randn(1, 2 * world + 1, 8, 4)
    with pytest.raises(ValueError, match=f"H={2 * world + 1} query heads are not divisible by the world size {world}"):
        ulysses_attention(q, q[:, :1], q[:, :1])


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks on 2 cores: slow, and 2 rings already
def test_ulysses_matches_single_process(world):
    run_ranks(_parity, world)
