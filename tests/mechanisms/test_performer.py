"""Performer (FAVOR+): convergence to softmax, causal chunks, redraws, masks, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import masks
from attnlab.diagnostics import leak_test
from attnlab.mechanisms import create
from attnlab.mechanisms.linear import kernel_attention
from attnlab.mechanisms.performer import Performer, orthogonal_gaussian
from helpers import (
    assert_linear_cost,
    assert_loss_falls,
    causal_cumsum_naive,
    check_low_precision,
    check_padding_invariance,
    exact,
    gradcheck,
    kernel_direct,
    rand_qkv,
    rel_err,
    train_losses,
)


def favor_features(x, w, m):
    """phi(x) = exp(w.x' - |x'|^2/2) / sqrt(m), x' = x / D^(1/4), without stabilization."""
    x = x * x.shape[-1] ** -0.25
    return torch.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(m)


@pytest.mark.parametrize("causal", [False, True])
def test_error_shrinks_with_features(gen, causal):
    # moderate norms: the estimator's variance grows like exp(|q'|^2 + |k'|^2)
    q, k, v = rand_qkv(2, 2, 48, 8, M=48, Hkv=2, Dv=8, gen=gen, scale=0.5)
    mask = masks.causal() if causal else None
    ref = exact(q, k, v, mask)
    errs = []
    for m in (256, 1024, 4096):
        errs.append(sum(rel_err(Performer(m, seed=s)(q, k, v, mask), ref) for s in range(4)) / 4)
    # Monte Carlo: about halving per 4x features (1/sqrt(m)); ask for a clear decrease
    assert errs[0] > 1.25 * errs[1] and errs[1] > 1.25 * errs[2], errs
    assert errs[2] < 0.05, errs


def test_matches_unstabilized_formula(gen, tol):
    """Stabilization (subtracting maxima) cancels exactly in the normalization."""
    q, k, v = rand_qkv(2, 9, 19, 59, M=31, Hkv=3, Dv=7, gen=gen, scale=0.5)
    mech = Performer(64, seed=0)
    out = mech(q, k, v)
    w = mech.projection.double()
    ref = kernel_direct(favor_features(q, w, 64), favor_features(k, w, 64), v)
    torch.testing.assert_close(out, ref, **tol(torch.float64))
    out_c = mech(q, k, v, masks.causal())
    ref_c = kernel_direct(favor_features(q, w, 64), favor_features(k, w, 64), v, causal=True)
    torch.testing.assert_close(out_c, ref_c, **tol(torch.float64))


@pytest.mark.parametrize("chunk", [1, 6, 32, 128])
def test_chunked_causal_equals_naive_cumsum(gen, tol, chunk):
    q, k, v = rand_qkv(1, 4, 40, 8, M=40, Hkv=2, Dv=5, gen=gen)
    mech = Performer(32, seed=1, chunk_size=chunk)
    mech(q, k, v)  # draws the projection
    qf, kf = mech.feature_map(q, is_query=True), mech.feature_map(k, is_query=False)
    torch.testing.assert_close(mech(q, k, v, masks.causal()), causal_cumsum_naive(qf, kf, v), **tol(torch.float64))
    torch.testing.assert_close(kernel_attention(qf, kf, v, causal=True, chunk_size=chunk),
                               causal_cumsum_naive(qf, kf, v), **tol(torch.float64))


def test_relu_kernel(gen, tol):
    q, k, v = rand_qkv(1, 4, 23, 8, M=23, Hkv=4, Dv=8, gen=gen)
    mech = Performer(32, kernel="relu", seed=0)
    out = mech(q, k, v, masks.causal())
    w = mech.projection.double()

    def f(x):
        return torch.relu((x * 8**-0.25) @ w.T) / math.sqrt(32) + 1e-3

    torch.testing.assert_close(out, kernel_direct(f(q), f(k), v, causal=True), **tol(torch.float64))


def test_causal_no_leak(gen):
    q, k, v = rand_qkv(1, 4, 24, 8, M=24, Hkv=2, Dv=8, gen=gen)
    mech = Performer(32, seed=0, chunk_size=8).eval()
    leak_test(mech, q, k, v, masks.causal(), trials=1)


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_key_padding(gen, tol, kernel):
    q, k, v = rand_qkv(3, 4, 21, 8, M=21, Hkv=2, Dv=8, gen=gen)
    mech = Performer(32, kernel=kernel, seed=0).eval()
    check_padding_invariance(mech, q, k, v, [21, 9, 1], **tol(torch.float64))
    out = mech(q, k, v, masks.padding([21, 0, 3]))
    assert (out[1] == 0).all()  # no visible key: zeros


def test_orthogonal_features():
    w = orthogonal_gaussian(20, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert w.shape == (20, 8)
    for lo in (0, 8):  # full blocks: orthogonal rows
        g = w[lo : lo + 8] @ w[lo : lo + 8].T
        torch.testing.assert_close(g, torch.diag(torch.diagonal(g)))
    norms = w.norm(dim=1)
    assert norms.std() > 0.1  # chi-distributed norms, not all equal
    assert 1.5 < norms.mean() < 4.5  # E|g| ~ sqrt(8) for a Gaussian 8-vector


def test_redraw_schedule(gen):
    q, k, v = rand_qkv(1, 2, 5, 4, M=5, Hkv=2, Dv=4, gen=gen, dtype=torch.float32)
    mech = Performer(16, redraw_interval=2, seed=0)
    mech(q, k, v)
    p0 = mech.projection.clone()
    mech(q, k, v)
    assert torch.equal(mech.projection, p0)  # call 2: not yet
    mech(q, k, v)
    p1 = mech.projection.clone()
    assert not torch.equal(p1, p0)  # call 3: redrawn after 2 calls
    mech.eval()
    for _ in range(4):
        mech(q, k, v)
    assert torch.equal(mech.projection, p1)  # eval mode never redraws
    mech.train().fix_features()
    for _ in range(4):
        mech(q, k, v)
    assert torch.equal(mech.projection, p1)  # fixed
    with pytest.raises(ValueError, match="head_dim"):
        mech(q[..., :2], k[..., :2], v)


def test_deterministic_under_seed(gen):
    q, k, v = rand_qkv(1, 2, 17, 8, M=17, Hkv=2, Dv=8, gen=gen, dtype=torch.float32)
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        outs.append(create("performer", features=64)(q, k, v, masks.causal()))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(Performer(64, seed=3)(q, k, v), Performer(64, seed=3)(q, k, v))
    assert not torch.equal(Performer(64, seed=3)(q, k, v), Performer(64, seed=4)(q, k, v))


def test_state_dict_round_trip(gen):
    q, k, v = rand_qkv(1, 2, 9, 8, M=9, Hkv=2, Dv=8, gen=gen, dtype=torch.float32)
    a = Performer(16, seed=0).eval()
    out = a(q, k, v)
    b = Performer(16, seed=99).eval()
    b.load_state_dict(a.state_dict())  # b has not drawn yet: the saved projection is adopted
    assert torch.equal(b(q, k, v), out)


@pytest.mark.parametrize("mask", [None, "causal", "padding"])
def test_gradcheck_fixed_features(gen, mask):
    q, k, v = rand_qkv(2, 2, 6, 3, M=6, Hkv=1, Dv=2, gen=gen)
    m = {None: None, "causal": masks.causal(), "padding": masks.padding([6, 4])}[mask]
    mech = Performer(8, seed=0, head_dim=3, chunk_size=4).fix_features()
    assert gradcheck(lambda a, b, c: mech(a, b, c, m), (q, k, v))


def test_return_weights(gen, tol):
    q, k, v = rand_qkv(1, 2, 7, 4, M=7, Hkv=2, Dv=4, gen=gen)
    out, w = Performer(16, seed=0)(q, k, v, masks.causal(), return_weights=True)
    torch.testing.assert_close(w @ v, out, **tol(torch.float64))
    assert (w.triu(1) == 0).all()


def test_rejects_what_it_cannot_do(gen):
    q, k, v = rand_qkv(2, 2, 8, 4, M=8, Hkv=2, Dv=4, gen=gen)
    mech = Performer(8)
    with pytest.raises(ValueError, match="bias"):
        mech(q, k, v, bias=torch.zeros(8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="supports only"):
        mech(q, k, v, masks.sliding_window(2, 2))
    with pytest.raises(ValueError, match="kernel"):
        Performer(8, kernel="cosine")
    with pytest.raises(ValueError, match="features"):
        create("performer", features=0)


def test_cost_linear():
    assert_linear_cost(Performer(256), lo=1.7, hi=2.3)
    assert_linear_cost(Performer(256), lo=1.7, hi=2.3, causal=True)


def test_create_by_name():
    mech = create("performer", features=64)
    assert isinstance(mech, Performer) and mech.features == 64


@pytest.mark.parametrize("causal", [False, True])
def test_tiny_model_trains(causal):
    assert_loss_falls(train_losses(Performer(32, redraw_interval=10, chunk_size=8), causal=causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_low_precision(gen, causal, kernel):
    q, k, v = rand_qkv(2, 4, 150, 32, M=150, Hkv=2, Dv=32, gen=gen)
    mech = Performer(64, kernel=kernel, seed=0, chunk_size=32).eval()
    check_low_precision(mech, q, k, v, masks.causal() if causal else None)
