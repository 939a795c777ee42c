"""Linear attention (elu + 1 features): the kernelized formula, causal chunks, masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from attnlab import masks
from attnlab.diagnostics import leak_test
from attnlab.mechanisms import create
from attnlab.mechanisms.linear import LinearAttention, kernel_attention
from helpers import (
    assert_linear_cost,
    assert_loss_falls,
    causal_cumsum_naive,
    check_low_precision,
    check_padding_invariance,
    gradcheck,
    kernel_direct,
    rand_qkv,
    repeat_heads,
    train_losses,
)


def phi(x):
    return F.elu(x) + 1


@pytest.mark.parametrize(
    "B,H,Hkv,N,M,D,Dv",
    [(2, 4, 4, 97, 97, 40, 40), (1, 9, 3, 33, 50, 59, 17), (2, 2, 1, 1, 7, 8, 8), (1, 2, 2, 20, 1, 4, 3)],
)
def test_noncausal_equals_direct_formula(gen, tol, B, H, Hkv, N, M, D, Dv):
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, Dv=Dv, gen=gen)
    out = LinearAttention()(q, k, v)
    torch.testing.assert_close(out, kernel_direct(phi(q), phi(k), v), **tol(torch.float64))


@pytest.mark.parametrize("N,M", [(97, 97), (30, 50), (50, 30), (1, 1), (1, 9)])
@pytest.mark.parametrize("chunk", [1, 7, 128])
def test_causal_equals_direct_formula(gen, tol, N, M, chunk):
    q, k, v = rand_qkv(2, 6, N, 12, M=M, Hkv=3, Dv=5, gen=gen)
    out = LinearAttention(chunk_size=chunk)(q, k, v, masks.causal())
    torch.testing.assert_close(out, kernel_direct(phi(q), phi(k), v, causal=True), **tol(torch.float64))
    if N > M:  # queries before the first key see nothing: zeros
        assert (out[:, :, : N - M] == 0).all()


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_prefix_sums_equal_naive_cumsum(gen, tol, chunk):
    q, k, v = rand_qkv(2, 4, 45, 8, M=45, Hkv=2, Dv=6, gen=gen)
    qf, kf = phi(q), phi(k)
    out = kernel_attention(qf, kf, v, causal=True, chunk_size=chunk)
    torch.testing.assert_close(out, causal_cumsum_naive(qf, kf, v), **tol(torch.float64))


def test_float32_close_to_float64(gen):
    q, k, v = rand_qkv(2, 4, 70, 16, M=70, Hkv=2, Dv=16, gen=gen)
    mech = LinearAttention(chunk_size=16)
    for mask in (None, masks.causal()):
        ref = mech(q, k, v, mask)
        out = mech(q.float(), k.float(), v.float(), mask)
        torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-5)


def test_causal_no_leak(gen):
    q, k, v = rand_qkv(1, 4, 29, 8, M=29, Hkv=2, Dv=8, gen=gen)
    leak_test(LinearAttention(chunk_size=8), q, k, v, masks.causal(), trials=1)
    # a perturbation larger than leak_test's, and bitwise: past outputs do not move at all
    mech = LinearAttention(chunk_size=8)
    out = mech(q, k, v, masks.causal())
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 10:] *= 50
    v2[:, :, 10:] = -v2[:, :, 10:] * 1e3
    assert torch.equal(mech(q, k2, v2, masks.causal())[:, :, :10], out[:, :, :10])


def test_key_padding(gen, tol):
    q, k, v = rand_qkv(3, 4, 41, 8, M=41, Hkv=2, Dv=8, gen=gen)
    check_padding_invariance(LinearAttention(), q, k, v, [41, 17, 1], **tol(torch.float64))
    leak_test(LinearAttention(), q, k, v, masks.padding([41, 17, 1]), trials=1)


def test_bool_tensor_key_mask(gen, tol):
    q, k, v = rand_qkv(2, 2, 9, 4, M=13, Hkv=2, Dv=4, gen=gen)
    keep = torch.rand(2, 1, 1, 13, generator=gen) > 0.3
    mech = LinearAttention()
    torch.testing.assert_close(mech(q, k, v, keep), mech(q, k, v, masks.key_mask(keep[:, 0, 0])), **tol(torch.float64))
    with pytest.raises(ValueError, match="supports only"):  # query-dependent bool masks are refused
        mech(q, k, v, torch.rand(2, 1, 9, 13, generator=gen) > 0.3)


def test_key_mask_and_fully_masked_row(gen, tol):
    q, k, v = rand_qkv(2, 2, 9, 4, M=13, Hkv=2, Dv=4, gen=gen)
    keep = torch.rand(2, 13, generator=gen) > 0.5
    keep[1] = False  # row 1 sees no key: zeros
    out = LinearAttention()(q, k, v, masks.key_mask(keep))
    kf = phi(k) * keep[:, None, :, None]
    torch.testing.assert_close(out[:1], kernel_direct(phi(q), kf, v)[:1], **tol(torch.float64))
    assert (out[1] == 0).all()


def test_return_weights(gen, tol):
    q, k, v = rand_qkv(1, 4, 11, 8, M=11, Hkv=2, Dv=5, gen=gen)
    for mask in (None, masks.causal(), masks.padding([6])):
        out, w = LinearAttention()(q, k, v, mask, return_weights=True)
        assert w.shape == (1, 4, 11, 11)
        torch.testing.assert_close(w @ repeat_heads(v, 4), out, **tol(torch.float64))
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 11, dtype=w.dtype), **tol(torch.float64))


@pytest.mark.parametrize("mask", [None, "causal"])
def test_gradcheck(gen, mask):
    q, k, v = rand_qkv(1, 2, 6, 3, M=6, Hkv=1, Dv=2, gen=gen)
    m = masks.causal() if mask else None
    mech = LinearAttention(chunk_size=4)
    assert gradcheck(lambda a, b, c: mech(a, b, c, m), (q, k, v))


def test_deterministic(gen):
    q, k, v = rand_qkv(1, 2, 40, 8, M=40, Hkv=2, Dv=8, gen=gen, dtype=torch.float32)
    mech = LinearAttention(chunk_size=16)
    assert torch.equal(mech(q, k, v, masks.causal()), mech(q, k, v, masks.causal()))


def test_rejects_what_it_cannot_do(gen):
    q, k, v = rand_qkv(2, 2, 8, 4, M=8, Hkv=2, Dv=4, gen=gen)
    mech = LinearAttention()
    with pytest.raises(ValueError, match="bias"):
        mech(q, k, v, bias=torch.zeros(8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="sliding_window"):
        mech(q, k, v, masks.sliding_window(2))
    with pytest.raises(ValueError, match="causal"):
        mech(q, k, v, masks.causal() & masks.padding([8, 4]))
    with pytest.raises(ValueError, match="chunk_size"):
        LinearAttention(chunk_size=0)
    with pytest.raises(ValueError):  # heads that do not group
        mech(q, k[:, :1].expand(2, 3, 8, 4), v[:, :1].expand(2, 3, 8, 4))


def test_cost_linear():
    assert_linear_cost(LinearAttention(), lo=1.7, hi=2.3)
    assert_linear_cost(LinearAttention(), lo=1.7, hi=2.3, causal=True)


def test_registered():
    assert isinstance(create("linear", chunk_size=32), LinearAttention)


@pytest.mark.parametrize("causal", [False, True])
def test_tiny_model_trains(causal):
    assert_loss_falls(train_losses(LinearAttention(chunk_size=8), causal=causal))


@pytest.mark.parametrize("causal", [False, True])
def test_low_precision(gen, causal):
    q, k, v = rand_qkv(2, 4, 150, 32, M=150, Hkv=2, Dv=32, gen=gen)
    check_low_precision(LinearAttention(chunk_size=32), q, k, v, masks.causal() if causal else None)
