"""Local block attention: equals exact attention under its dense block mask."""


import pytest
import torch

from attnlab import masks, mechanisms
from attnlab.exact import attention, native, tiles
from attnlab.mechanisms.local import block_attention, native_serves
from helpers import (
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
    assert_loss_falls(train_losses(mechanisms.create("local", block_size=8, overlap=True), seq_len=32, task="class_token"))


def _grads(fn, inputs, g, fused=True, kernel=True):
    """``fn(*inputs)`` and its gradients for output gradient ``g``, with the fused block op and the native kernel
    on or off."""
    tiles.set_fused_enabled(fused)
    native.set_native_enabled(kernel)
    try:
        out = fn(*inputs)
        return (out, *torch.autograd.grad(out, inputs, g))
    finally:
        tiles.set_fused_enabled(True)
        native.set_native_enabled(True)


@pytest.mark.parametrize("path", ["native", "fused", "plain"])
@pytest.mark.parametrize("overlap,causal", [(False, False), (False, True), (True, False), (True, True)])
def test_fused_blocks_equal_exact_with_gradients_float32(overlap, causal, path):
    """One native kernel call over the blocks' intervals, and the folded-block path (the kernel off: the fused op,
    or plain torch when that is off too), against exact attention under the pattern."""
    q, k, v = rand_qkv(2, 4, 45, 40, M=53, Hkv=2, Dv=24, dtype=torch.float32, seed=21, requires_grad=True)
    user = masks.padding([53, 40])
    mech = mechanisms.create("local", block_size=8, overlap=overlap, causal=causal)
    g = torch.randn(2, 4, 45, 24, generator=torch.Generator().manual_seed(22))
    assert native_serves(q, k, v, mech.pattern() & user) == (native.status() is None)
    got = _grads(lambda a, b, c: mech(a, b, c, mask=user), (q, k, v), g, path != "plain", path == "native")
    want = _grads(lambda a, b, c: attention(a, b, c, mask=mech.pattern() & user, backend="math"), (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


@pytest.mark.parametrize("fused", [True, False])
def test_block_attention_fused_equals_gather_path(fused):
    """Any table of key blocks (gathered) and extra keys (merged by log-sum-exp) give the old path's result."""
    N, bs = 70, 8
    q, k, v = rand_qkv(2, 4, N, 16, Hkv=2, Dv=8, dtype=torch.float32, seed=23, requires_grad=True)
    g = torch.Generator().manual_seed(24)
    nb = -(-N // bs)
    table = torch.stack([torch.randperm(nb, generator=g)[:3] for _ in range(nb)])  # (nb, 3) random blocks
    table[2, 1:] = -1  # a block row listing one block only
    allowed = torch.rand(2, 1, N, N, generator=g) < 0.7
    allowed[1, :, 5] = False  # a row that sees nothing
    full = masks.dense(allowed)
    extra, rows = torch.tensor([0, 33, 69]), torch.tensor([1, 50])
    dout = torch.randn(2, 4, N, 8, generator=g)
    got = _grads(lambda a, b, c: block_attention(a, b, c, table, bs, full, extra_keys=extra, dense_rows=rows),
                 (q, k, v), dout, fused)
    want = _grads(lambda a, b, c: block_attention(a, b, c, table, bs, full, extra_keys=extra, dense_rows=rows,
                                                  fused=False), (q, k, v), dout)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_block_attention_fused_gradcheck_float64():
    q, k, v = rand_qkv(1, 2, 13, 4, seed=25, requires_grad=True)
    table = torch.tensor([[0, 2], [1, -1], [3, 0], [2, 3]])  # blocks of 4: not a band, so gathered
    full = masks.padding([11])
    assert torch.autograd.gradcheck(
        lambda a, b, c: block_attention(a, b, c, table, 4, full, extra_keys=torch.tensor([5])),
        (q, k, v), fast_mode=True)
