"""Longformer: exact attention under a sliding-window + global-token mask."""


import pytest
import torch

from attnlab import masks, mechanisms
from attnlab.exact import attention, make_call, plan_tiles, tiles
from helpers import (
    TOL,
    assert_linear_cost,
    assert_loss_falls,
    assert_no_future_leak,
    rand_qkv,
    train_losses,
)


@pytest.mark.parametrize("backend", ["auto", "chunked", "math", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_window_covering_sequence_is_exact(backend, causal):
    q, k, v = rand_qkv(2, 3, 37, 24, seed=1, dtype=torch.float32)
    mech = mechanisms.create("longformer", window=80, causal=causal, backend=backend)
    ref = attention(q, k, v, mask=masks.causal() if causal else None, backend="math")
    torch.testing.assert_close(mech(q, k, v), ref, **TOL[torch.float32])


@pytest.mark.parametrize("seed", range(6))
def test_matches_dense_mask_random_sizes(seed):
    g = torch.Generator().manual_seed(seed)
    N = int(torch.randint(1, 90, (), generator=g))
    M = N if seed % 2 else int(torch.randint(N, 100, (), generator=g))
    Hkv = [1, 3][seed % 2]
    window = int(torch.randint(0, 20, (), generator=g))
    glob = torch.randint(0, M, (int(torch.randint(0, 3, (), generator=g)),), generator=g).tolist()
    q, k, v = rand_qkv(2, 3 * Hkv if seed % 3 else 9, N, 40, M=M, Hkv=Hkv if seed % 3 else 3, Dv=16, seed=seed)
    user = masks.padding([M, max(1, M // 2)])
    mech = mechanisms.create("longformer", window=window, global_indices=glob, causal=bool(seed % 2), backend="chunked")
    pattern = mech.pattern() & user
    ref = attention(q, k, v, mask=pattern, backend="reference")
    torch.testing.assert_close(mech(q, k, v, mask=user), ref, **TOL[torch.float64])
    if N == M:
        mech.backend = "gather"
        torch.testing.assert_close(mech(q, k, v, mask=user), ref, **TOL[torch.float64])
    dense = masks.dense(pattern.dense(N, M, batch=2))
    torch.testing.assert_close(attention(q, k, v, mask=dense, backend="math"), ref, **TOL[torch.float64])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 3, 40, 300])
def test_gather_kernel_matches_reference(window, causal):
    N = 150
    q, k, v = rand_qkv(2, 4, N, 24, Hkv=2, Dv=8, seed=window)
    allowed = torch.rand(2, 1, N, N, generator=torch.Generator().manual_seed(window)) < 0.7
    allowed[1, :, 7] = False  # fully masked row -> zeros
    user = masks.dense(allowed)
    mech = mechanisms.create("longformer", window=window, global_indices=[0, 77, 149], causal=causal, backend="gather")
    ref = attention(q, k, v, mask=mech.pattern() & user, backend="reference")
    torch.testing.assert_close(mech(q, k, v, mask=user), ref, **TOL[torch.float64])


def test_gather_backend_refuses_what_it_cannot_do():
    q, k, v = rand_qkv(1, 2, 8, 4, M=12)
    with pytest.raises(ValueError, match="gather"):
        mechanisms.create("longformer", window=4, backend="gather")(q, k, v)


def test_pattern_semantics():
    mech = mechanisms.create("longformer", window=4, global_indices=[0])
    d = mech.pattern().dense(8, 8)[0, 0]
    assert d[5].tolist() == [True, False, False, True, True, True, True, True]  # 5-2..5+2 and global 0
    assert d[0].all() and d[:, 0].all()
    c = mechanisms.create("longformer", window=2, causal=True).pattern().dense(6, 6)[0, 0]
    assert c[4].tolist() == [False, False, True, True, True, False]


def test_causal_user_mask_switches_to_causal_window():
    q, k, v = rand_qkv(1, 2, 30, 8, seed=3)
    mech = mechanisms.create("longformer", window=4, global_indices=[2])
    out = mech(q, k, v, mask=masks.causal())
    ref = attention(q, k, v, mask=mech.pattern(causal_=True), backend="reference")
    torch.testing.assert_close(out, ref, **TOL[torch.float64])


def test_causal_no_leak():
    q, k, v = rand_qkv(1, 2, 40, 8, seed=4)
    mech = mechanisms.create("longformer", window=6, global_indices=[0, 20], causal=True)
    assert_no_future_leak(lambda a, b, c: mech(a, b, c), q, k, v)


def test_bias_and_weights():
    q, k, v = rand_qkv(1, 2, 12, 8, seed=5)
    bias = torch.randn(1, 2, 12, 12, dtype=q.dtype)
    mech = mechanisms.create("longformer", window=4, global_indices=[0])
    out, w = mech(q, k, v, bias=bias, return_weights=True)
    ref = attention(q, k, v, mask=mech.pattern(), bias=bias, backend="reference")
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    assert not w[0, 0][~mech.pattern().dense(12, 12)[0, 0]].any()


def test_gradcheck_float64():
    q, k, v = rand_qkv(1, 2, 13, 4, seed=6, requires_grad=True)
    mech = mechanisms.create("longformer", window=4, global_indices=[1], backend="chunked")
    assert torch.autograd.gradcheck(lambda a, b, c: mech(a, b, c, mask=masks.padding([11])), (q, k, v), fast_mode=True)


def test_padding_invariance():
    q, k, v = rand_qkv(2, 2, 29, 8, seed=7)
    lengths = [29, 17]
    mech = mechanisms.create("longformer", window=6, global_indices=[0])
    out = mech(q, k, v, mask=masks.padding(lengths))
    for b, n in enumerate(lengths):
        alone = mech(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(out[b : b + 1, :, :n], alone, **TOL[torch.float64])


def test_deterministic():
    q, k, v = rand_qkv(1, 2, 50, 8, seed=8, dtype=torch.float32)
    mech = mechanisms.create("longformer", window=8, global_indices=[0])
    torch.testing.assert_close(mech(q, k, v), mech(q, k, v), atol=0, rtol=0)


def test_chunked_skips_tiles_linear_work():
    """The computed tiles grow linearly in N: the O(N w) cost is real, not just modeled."""
    fractions = []
    for n in (2048, 4096):
        q = torch.zeros(1, 1, n, 8)
        mech = mechanisms.create("longformer", window=64, global_indices=[0])
        plan = plan_tiles(make_call(q, q, q, mask=mech.pattern()), block_q=64, block_k=64)
        fractions.append(plan.computed_fraction * (n // 64) ** 2)  # computed tiles
    assert 1.8 < fractions[1] / fractions[0] < 2.2


def test_cost_linear():
    assert_linear_cost(mechanisms.create("longformer", window=256, global_indices=[0]))


def test_create_and_errors():
    assert mechanisms.create("longformer", window=64).window == 64
    with pytest.raises(ValueError, match="window"):
        mechanisms.create("longformer", window=-1)
    with pytest.raises(ValueError, match="global_indices"):
        mechanisms.create("longformer", global_indices=[-1])
    with pytest.raises(ValueError, match="backend"):
        mechanisms.create("longformer", backend="nope")


def test_trains():
    assert_loss_falls(train_losses(mechanisms.create("longformer", window=6, global_indices=[0]), seq_len=32, task="class_token"))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_gather_backend_equals_exact_with_gradients_float32(causal, fused):
    """The window band (a strided view, one fused call) plus global keys (merged) against exact attention."""
    N = 150
    q, k, v = rand_qkv(2, 4, N, 24, Hkv=2, Dv=8, dtype=torch.float32, seed=31, requires_grad=True)
    g = torch.Generator().manual_seed(32)
    allowed = torch.rand(2, 1, N, N, generator=g) < 0.7
    allowed[1, :, 7] = False  # fully masked row -> zeros
    user = masks.dense(allowed)
    mech = mechanisms.create("longformer", window=40, global_indices=[0, 77, 149], causal=causal, backend="gather")
    dout = torch.randn(2, 4, N, 8, generator=g)

    def grads(fn, on=True):
        tiles.set_fused_enabled(on)
        try:
            out = fn(q, k, v)
            return (out, *torch.autograd.grad(out, (q, k, v), dout))
        finally:
            tiles.set_fused_enabled(True)

    got = grads(lambda a, b, c: mech(a, b, c, mask=user), fused)
    want = grads(lambda a, b, c: attention(a, b, c, mask=mech.pattern() & user, backend="math"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_gather_backend_gradcheck_float64():
    q, k, v = rand_qkv(1, 2, 21, 4, seed=33, requires_grad=True)
    mech = mechanisms.create("longformer", window=6, global_indices=[2], backend="gather")
    assert torch.autograd.gradcheck(lambda a, b, c: mech(a, b, c, mask=masks.padding([19])), (q, k, v), fast_mode=True)


def test_global_index_past_the_sequence_is_an_error_on_every_path():
    """A global position >= N used to vanish silently on the gather path."""
    q = torch.randn(1, 2, 16, 8)
    for backend in ("gather", "math"):
        m = mechanisms.create("longformer", window=4, global_indices=[0, 40], backend=backend)
        assert "global_indices must be < the sequence length 16" in m.supports(q, q, q)
        with pytest.raises(ValueError, match="global_indices must be < the sequence length 16"):
            m(q, q, q)
