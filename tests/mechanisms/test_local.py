"""Local block attention: equals exact attention under its dense block mask."""

import os
import sys

import pytest
import torch

from attnlab import masks, mechanisms
from attnlab.exact import attention

sys.path.insert(0, os.path.dirname(__file__))
from helpers_b import (  # noqa: E402
    TOL,
    assert_linear_cost,
    assert_loss_falls,
    assert_no_future_leak,
    rand_qkv,
    train_losses,
)

CASES = [  # B, H, Hkv, N, M, D, Dv, block
    (2, 3, 3, 97, 97, 40, 24, 16),
    (1, 9, 3, 33, 33, 59, 8, 8),
    (2, 4, 2, 5, 40, 16, 16, 8),
    (1, 2, 2, 1, 1, 8, 8, 4),
    (1, 2, 1, 64, 64, 8, 8, 64),
]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_matches_exact_under_dense_pattern(case, overlap, causal):
    B, H, Hkv, N, M, D, Dv, bs = case
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, Dv=Dv, seed=N + bs)
    mech = mechanisms.create("local", block_size=bs, overlap=overlap, causal=causal)
    out = mech(q, k, v)
    ref = attention(q, k, v, mask=mech.pattern(), backend="reference")
    torch.testing.assert_close(out, ref, **TOL[torch.float64])


@pytest.mark.parametrize("overlap", [False, True])
def test_with_user_masks_including_empty_rows(overlap):
    B, H, N = 2, 3, 45
    q, k, v = rand_qkv(B, H, N, 16, seed=3)
    allowed = torch.rand(B, 1, N, N, generator=torch.Generator().manual_seed(1)) < 0.5
    allowed[:, :, 4] = False  # a fully masked row must give zeros
    for user in (masks.padding([N, 20]), masks.dense(allowed), masks.padding([30, 45]) & masks.document((torch.arange(N) // 10).expand(B, N))):
        mech = mechanisms.create("local", block_size=8, overlap=overlap)
        out = mech(q, k, v, mask=user)
        ref = attention(q, k, v, mask=mech.pattern() & user, backend="reference")
        torch.testing.assert_close(out, ref, **TOL[torch.float64])
    assert out.isfinite().all()


@pytest.mark.parametrize("causal", [False, True])
def test_block_covering_sequence_is_exact(causal):
    q, k, v = rand_qkv(2, 3, 37, 24, Hkv=1, seed=5, dtype=torch.float32)
    out = mechanisms.create("local", block_size=64, causal=causal)(q, k, v)
    ref = attention(q, k, v, mask=masks.causal() if causal else None, backend="math")
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_causal_no_leak():
    q, k, v = rand_qkv(1, 2, 40, 8, seed=7)
    mech = mechanisms.create("local", block_size=8, overlap=True, causal=True)
    assert_no_future_leak(lambda a, b, c: mech(a, b, c), q, k, v)


def test_gradcheck_float64():
    q, k, v = rand_qkv(1, 2, 11, 4, seed=9, requires_grad=True)
    mech = mechanisms.create("local", block_size=4, overlap=True, causal=True)
    assert torch.autograd.gradcheck(lambda a, b, c: mech(a, b, c, mask=masks.padding([9])), (q, k, v), fast_mode=True)


def test_padding_invariance():
    q, k, v = rand_qkv(2, 2, 29, 8, seed=11)
    lengths = [29, 17]
    mech = mechanisms.create("local", block_size=8, overlap=True)
    out = mech(q, k, v, mask=masks.padding(lengths))
    for b, n in enumerate(lengths):
        alone = mech(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(out[b : b + 1, :, :n], alone, **TOL[torch.float64])


def test_deterministic():
    q, k, v = rand_qkv(1, 2, 30, 8, seed=12, dtype=torch.float32)
    mech = mechanisms.create("local", block_size=8)
    torch.testing.assert_close(mech(q, k, v), mech(q, k, v), atol=0, rtol=0)


def test_cost_linear():
    assert_linear_cost(mechanisms.create("local", block_size=128, overlap=True))


def test_errors():
    q, k, v = rand_qkv(1, 2, 8, 4)
    mech = mechanisms.create("local", block_size=4)
    with pytest.raises(ValueError, match="bias"):
        mech(q, k, v, bias=torch.zeros(8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="return_weights"):
        mech(q, k, v, return_weights=True)
    with pytest.raises(ValueError, match="N <= M"):
        mech(*rand_qkv(1, 2, 8, 4, M=4)[:1], k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match="block_size"):
        mechanisms.create("local", block_size=0)


def test_trains():
    assert_loss_falls(train_losses(mechanisms.create("local", block_size=8, overlap=True)))
