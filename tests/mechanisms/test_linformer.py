"""Linformer: identity projections give exact attention; sharing options, max_len, padding."""

from __future__ import annotations

import pytest
import torch

from attnlab import masks
from attnlab.diagnostics import leak_test
from attnlab.mechanisms import create
from attnlab.mechanisms.linformer import Linformer
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


def set_projections(mech: Linformer, e: torch.Tensor, f: torch.Tensor | None = None) -> Linformer:
    with torch.no_grad():
        mech.E.copy_(e.expand_as(mech.E))
        if mech.F is not None:
            mech.F.copy_((e if f is None else f).expand_as(mech.F))
    return mech.double()


def mean_pooling(k: int, n: int) -> torch.Tensor:
    """``(k, n)``: row ``r`` averages the ``r``-th of ``k`` contiguous segments."""
    p = torch.zeros(k, n, dtype=torch.float64)
    p[torch.arange(n) * k // n, torch.arange(n)] = 1.0
    return p / p.sum(-1, keepdim=True)


@pytest.mark.parametrize("heads,H,Hkv", [(None, 4, 4), (None, 9, 3), (9, 9, 3), (3, 9, 3)])
@pytest.mark.parametrize("share_kv", [False, True])
def test_identity_projections_are_exact(gen, tol, heads, H, Hkv, share_kv):
    N = 23
    q, k, v = rand_qkv(2, H, N, 40, M=N, Hkv=Hkv, Dv=7, gen=gen)
    mech = set_projections(Linformer(N, k=N, heads=heads, share_kv=share_kv), torch.eye(N, dtype=torch.float64))
    torch.testing.assert_close(mech(q, k, v), exact(q, k, v), **tol(torch.float64))


def test_equals_formula_with_shorter_sequence(gen, tol):
    """A sequence shorter than max_len uses the first M columns of E and F."""
    q, k, v = rand_qkv(2, 3, 11, 8, M=13, Hkv=3, Dv=5, gen=gen)
    mech = Linformer(max_len=20, k=6, heads=3).double()
    e, f = mech.E[:, :, :13], mech.F[:, :, :13]  # (H, k, M)
    ref = exact(q, e @ k, f @ v)
    torch.testing.assert_close(mech(q, k, v), ref, **tol(torch.float64))
    shared = Linformer(max_len=20, k=6, share_kv=True).double()
    e = shared.E[0, :, :13]
    torch.testing.assert_close(shared(q, k, v), exact(q, e @ k, e @ v), **tol(torch.float64))
    assert shared.F is None


def test_error_shrinks_with_k(gen):
    """Smooth (rank-7 along the sequence) keys and values, mean-pooling projections: the
    more projected rows, the closer to exact attention (k = N is exact)."""
    N = 128
    q, k, v = (smooth_sequences(2, 2, N, 16, gen) for _ in range(3))
    ref = exact(q, k, v)
    errs = []
    for kk in (4, 8, 16, 32, 64):
        mech = set_projections(Linformer(N, k=kk, share_kv=True), mean_pooling(kk, N))
        errs.append(rel_err(mech(q, k, v), ref))
    assert all(a > 1.5 * b for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.01, errs


@pytest.mark.parametrize("heads", [None, 4])
def test_key_padding(gen, tol, heads):
    q, k, v = rand_qkv(3, 4, 19, 8, M=19, Hkv=2, Dv=8, gen=gen)
    mech = Linformer(32, k=8, heads=heads).double()
    check_padding_invariance(mech, q, k, v, [19, 7, 1], **tol(torch.float64))
    leak_test(mech, q, k, v, masks.padding([19, 7, 1]), trials=1)
    out = mech(q, k, v, masks.padding([19, 0, 2]))
    assert (out[1] == 0).all()  # no visible key: zeros


def test_max_len(gen):
    q, k, v = rand_qkv(1, 2, 9, 4, M=9, Hkv=2, Dv=4, gen=gen)
    with pytest.raises(ValueError, match="max_len=8"):
        Linformer(8, k=4).double()(q, k, v)
    assert Linformer(9, k=4).double()(q, k, v).shape == (1, 2, 9, 4)


def test_rejects_what_it_cannot_do(gen):
    q, k, v = rand_qkv(2, 4, 8, 4, M=8, Hkv=2, Dv=4, gen=gen)
    mech = Linformer(8, k=4).double()
    with pytest.raises(ValueError, match="causal"):
        mech(q, k, v, masks.causal())
    with pytest.raises(ValueError, match="key padding"):
        mech(q, k, v, masks.sliding_window(1, 1))
    with pytest.raises(ValueError, match="bias"):
        mech(q, k, v, bias=torch.zeros(8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="weights"):
        mech(q, k, v, return_weights=True)
    with pytest.raises(ValueError, match="heads=3"):
        Linformer(8, k=4, heads=3).double()(q, k, v)
    with pytest.raises(ValueError, match="max_len"):
        Linformer(0)


def test_gradcheck(gen):
    q, k, v = rand_qkv(2, 2, 5, 3, M=6, Hkv=1, Dv=2, gen=gen)
    mech = Linformer(8, k=3, heads=2).double()
    mask = masks.padding([6, 4])
    assert gradcheck(lambda a, b, c: mech(a, b, c, mask), (q, k, v))
    # and the projections receive gradients
    mech(q, k, v).sum().backward()
    assert mech.E.grad is not None and mech.E.grad[:, :, 6:].abs().sum() == 0  # unused columns
    assert mech.F.grad.abs().sum() > 0


def test_deterministic_under_seed(gen):
    q, k, v = rand_qkv(1, 2, 12, 8, M=12, Hkv=2, Dv=8, gen=gen, dtype=torch.float32)
    outs = []
    for _ in range(2):
        torch.manual_seed(5)
        outs.append(create("linformer", max_len=16, k=4)(q, k, v))
    assert torch.equal(outs[0], outs[1])


def test_grouped_query_per_kv_head(gen, tol):
    q, k, v = rand_qkv(1, 6, 10, 4, M=10, Hkv=2, Dv=4, gen=gen)
    mech = Linformer(10, k=5, heads=2).double()
    ref = exact(q, mech.E @ k, mech.F @ v)  # per kv head projections, then grouped heads
    torch.testing.assert_close(mech(q, k, v), ref, **tol(torch.float64))
    per_q = Linformer(10, k=5, heads=6).double()
    ref = exact(q, per_q.E @ repeat_heads(k, 6), per_q.F @ repeat_heads(v, 6))
    torch.testing.assert_close(per_q(q, k, v), ref, **tol(torch.float64))


def test_cost_linear():
    assert_linear_cost(Linformer(16384, k=256), lo=1.7, hi=2.3)


def test_tiny_model_trains():
    assert_loss_falls(train_losses(Linformer(24, k=8)))


def test_low_precision(gen):
    q, k, v = rand_qkv(2, 4, 150, 32, M=150, Hkv=2, Dv=32, gen=gen)
    check_low_precision(Linformer(160, k=32), q, k, v)
