"""Nyströmformer: landmarks = N is exact; ragged segments; pseudo-inverse; padding; conv."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from attnlab import masks
from attnlab.diagnostics import leak_test
from attnlab.mechanisms import create
from attnlab.mechanisms.nystrom import Nystromformer, iterative_pinv, segment_means
from helpers import (
    assert_linear_cost,
    assert_loss_falls,
    check_low_precision,
    check_padding_invariance,
    exact,
    gradcheck,
    rand_qkv,
    rel_err,
    repeat_heads,
    smooth_sequences,
    train_losses,
)


@pytest.mark.parametrize("B,H,Hkv,N,D,Dv", [(2, 4, 4, 37, 40, 40), (1, 9, 3, 20, 59, 7), (1, 2, 1, 1, 4, 4)])
@pytest.mark.parametrize("extra", [0, 5])
def test_landmarks_at_least_n_are_exact(gen, tol, B, H, Hkv, N, D, Dv, extra):
    """Each segment one token (landmarks = N), or some segments empty (landmarks > N)."""
    q, k, v = rand_qkv(B, H, N, D, M=N, Hkv=Hkv, Dv=Dv, gen=gen)
    out = Nystromformer(num_landmarks=N + extra, pinv="exact")(q, k, v)
    torch.testing.assert_close(out, exact(q, k, v), **tol(torch.float64))


def test_landmarks_n_iterative_pinv_converges(gen):
    q, k, v = rand_qkv(1, 2, 16, 8, M=16, Hkv=2, Dv=8, gen=gen, scale=0.5)
    ref = exact(q, k, v)
    err6 = rel_err(Nystromformer(16)(q, k, v), ref)
    err20 = rel_err(Nystromformer(16, pinv_iterations=20)(q, k, v), ref)
    assert err20 < 1e-8 and err20 <= err6


def test_iterative_pinv_matches_exact(gen, tol):
    a = torch.softmax(torch.randn(3, 12, 12, generator=gen, dtype=torch.float64), dim=-1)
    torch.testing.assert_close(iterative_pinv(a, 30), torch.linalg.pinv(a), rtol=1e-7, atol=1e-9)
    # rows and columns of zeros (empty landmarks) stay zero and the rest is the sub-block's pinv
    z = torch.zeros(14, 14, dtype=torch.float64)
    z[:12, 1:13] = a[0]
    p = iterative_pinv(z, 30)
    torch.testing.assert_close(p, torch.linalg.pinv(z), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("L,l", [(97, 8), (10, 3), (5, 7)])
def test_ragged_segment_means(gen, tol, L, l):
    x = torch.randn(2, 3, L, 4, generator=gen, dtype=torch.float64)
    means, ok = segment_means(x, l)
    bounds = [(i * L + l - 1) // l for i in range(l + 1)]  # segment i: positions with floor(p*l/L) == i
    for i in range(l):
        lo, hi = bounds[i], bounds[i + 1]
        assert bool(ok[0, i]) == (hi > lo)
        if hi > lo:
            torch.testing.assert_close(means[:, :, i], x[:, :, lo:hi].mean(2), **tol(torch.float64))
            assert hi - lo in (L // l, -(-L // l))  # lengths differ by at most one
    # with a validity mask: segments formed over the valid positions only
    valid = torch.rand(2, L, generator=gen) > 0.3
    means, ok = segment_means(x, l, valid)
    for b in range(2):
        alone, ok_b = segment_means(x[b : b + 1, :, valid[b]], l)
        torch.testing.assert_close(means[b : b + 1][:, :, ok_b[0]], alone[:, :, ok_b[0]], **tol(torch.float64))
        assert torch.equal(ok[b], ok_b[0])


def test_error_shrinks_with_landmarks(gen):
    """Smooth (rank-7 along the sequence) inputs: more landmarks, closer to exact.

    With the paper's iterative pseudo-inverse (6 iterations); the exact pseudo-inverse
    of the ill-conditioned landmark kernel amplifies errors at few landmarks."""
    N = 96
    q, k, v = (smooth_sequences(2, 2, N, 16, gen) for _ in range(3))
    ref = exact(q, k, v)
    errs = [rel_err(Nystromformer(l)(q, k, v), ref) for l in (4, 8, 16, 32)]
    assert all(a > 1.5 * b for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.02, errs


@pytest.mark.parametrize("conv", [None, 3])
def test_key_padding(gen, tol, conv):
    q, k, v = rand_qkv(3, 4, 21, 8, M=21, Hkv=2, Dv=8, gen=gen)
    mech = Nystromformer(4, conv_kernel=conv, heads=4).double()
    check_padding_invariance(mech, q, k, v, [21, 9, 2], **tol(torch.float64))
    out = mech(q, k, v, masks.padding([21, 0, 3]))
    assert (out[1] == 0).all()  # no visible key: zeros (the conv sees zeroed values)


def test_cross_attention_key_mask(gen, tol):
    """N != M: the key mask removes keys from landmarks and the last softmax; exact when
    landmarks cover every kept key."""
    q, k, v = rand_qkv(2, 2, 9, 8, M=14, Hkv=2, Dv=8, gen=gen)
    keep = torch.rand(2, 14, generator=gen) > 0.4
    mask = masks.key_mask(keep)
    out = Nystromformer(14, pinv="exact")(q, k, v, mask)
    torch.testing.assert_close(out, exact(q, k, v, mask), **tol(torch.float64))
    leak_test(Nystromformer(4), q, k, v, mask, trials=1)


def test_conv_residual(gen, tol):
    q, k, v = rand_qkv(1, 4, 15, 8, M=15, Hkv=2, Dv=6, gen=gen)
    mech = Nystromformer(15, pinv="exact", conv_kernel=5, heads=4).double()
    w = mech.conv.detach()
    conv = F.conv2d(repeat_heads(v, 4), w, padding=(2, 0), groups=4)
    torch.testing.assert_close(mech(q, k, v), exact(q, k, v) + conv, **tol(torch.float64))


def test_return_weights(gen, tol):
    q, k, v = rand_qkv(1, 2, 12, 4, M=12, Hkv=2, Dv=4, gen=gen)
    out, w = Nystromformer(4)(q, k, v, return_weights=True)
    torch.testing.assert_close(w @ v, out, **tol(torch.float64))


@pytest.mark.parametrize("pinv", ["iterative", "exact"])
def test_gradcheck(gen, pinv):
    q, k, v = rand_qkv(2, 2, 5, 2, M=5, Hkv=1, Dv=2, gen=gen)
    mech = Nystromformer(2, pinv=pinv)
    mask = masks.padding([5, 4])
    assert gradcheck(lambda a, b, c: mech(a, b, c, mask), (q, k, v))


def test_deterministic_under_seed(gen):
    q, k, v = rand_qkv(1, 4, 30, 8, M=30, Hkv=4, Dv=8, gen=gen, dtype=torch.float32)
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(create("nystrom", num_landmarks=8, conv_kernel=3, heads=4)(q, k, v))
    assert torch.equal(outs[0], outs[1])


def test_rejects_what_it_cannot_do(gen):
    q, k, v = rand_qkv(2, 2, 8, 4, M=8, Hkv=2, Dv=4, gen=gen)
    mech = Nystromformer(4)
    with pytest.raises(ValueError, match="causal"):
        mech(q, k, v, masks.causal())
    with pytest.raises(ValueError, match="bias"):
        mech(q, k, v, bias=torch.zeros(8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="heads"):
        Nystromformer(4, conv_kernel=3)
    with pytest.raises(ValueError, match="odd"):
        Nystromformer(4, conv_kernel=4, heads=2)
    with pytest.raises(ValueError, match="N == M"):
        Nystromformer(4, conv_kernel=3, heads=2).double()(q, torch.cat([k, k], 2), torch.cat([v, v], 2))


def test_cost_linear():
    assert_linear_cost(Nystromformer(64), lo=1.7, hi=2.3)
    assert_linear_cost(Nystromformer(64, conv_kernel=33, heads=8), lo=1.7, hi=2.3)


def test_tiny_model_trains():
    assert_loss_falls(train_losses(Nystromformer(8)))


def test_low_precision(gen):
    q, k, v = rand_qkv(2, 4, 150, 32, M=150, Hkv=2, Dv=32, gen=gen)
    check_low_precision(Nystromformer(16), q, k, v)
