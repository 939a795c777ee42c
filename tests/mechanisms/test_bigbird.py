"""BigBird: exact attention under a window + global + random block pattern."""


import pytest
import torch

from attnlab import masks, mechanisms
from attnlab.exact import attention, make_call, plan_tiles
from attnlab.masks import EMPTY, FULL
from attnlab.mechanisms.bigbird import BlockTableMask
from helpers import (
    TOL,
    assert_linear_cost,
    assert_loss_falls,
    assert_no_future_leak,
    rand_qkv,
    train_losses,
)


@pytest.mark.parametrize("backend", ["auto", "chunked", "math"])
def test_full_cover_is_exact(backend):
    q, k, v = rand_qkv(2, 3, 45, 24, Hkv=1, seed=1, dtype=torch.float32)
    # 6 blocks of 8: window 3 (<= 2 at the ends) + global 1 + random 3 cover every block
    mech = mechanisms.create("bigbird", block_size=8, window_blocks=3, global_blocks=1, random_blocks=3, backend=backend)
    assert mech.table(45).all()
    torch.testing.assert_close(mech(q, k, v), attention(q, k, v, backend="math"), **TOL[torch.float32])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(97, 97, 8), (5, 40, 8), (1, 1, 4), (64, 64, 16), (33, 33, 5)])
def test_matches_dense_pattern(shape, causal):
    N, M, bs = shape
    q, k, v = rand_qkv(2, 9, N, 40, M=M, Hkv=3, Dv=16, seed=N + M)
    user = masks.padding([M, max(1, M - 7)])
    mech = mechanisms.create("bigbird", block_size=bs, random_blocks=2, causal=causal, seed=N)
    dense = masks.dense((mech.pattern(M) & user).dense(N, M, batch=2))
    ref = attention(q, k, v, mask=dense, backend="reference")
    for backend in ("auto", "chunked", "sdpa") + (("gather",) if N == M else ()):
        mech.backend = backend
        torch.testing.assert_close(mech(q, k, v, mask=user), ref, **TOL[torch.float64])


@pytest.mark.parametrize("n", [256, 200])
def test_tile_fraction_matches_density(n):
    mech = mechanisms.create("bigbird", block_size=16, random_blocks=3, seed=2)
    pattern = mech.pattern(n)
    kinds = pattern.block_kinds(n, n, 16, 16)[0, 0]
    table = mech.table(n)
    assert (kinds != EMPTY).tolist() == table.tolist()
    assert (kinds[:-1, :-1] == FULL).tolist() == table[:-1, :-1].tolist()  # whole blocks are FULL
    q = torch.zeros(1, 1, n, 8)
    plan = plan_tiles(make_call(q, q, q, mask=pattern), block_q=16, block_k=16)
    assert plan.computed_fraction == pytest.approx(pattern.density())
    # coarser tiles (multiples of the block) and finer ones are classified exactly too
    for bq, bk in ((32, 64), (8, 8), (16, 48), (24, 40)):
        exact = pattern.dense(n, n)
        got = pattern.block_kinds(n, n, bq, bk)
        want = masks.base._tile_reduce(exact, bq, bk)
        assert torch.equal(got, want), (bq, bk)


def test_block_kinds_with_offset_queries():
    mech = mechanisms.create("bigbird", block_size=8, random_blocks=1)
    pattern = mech.pattern(50)
    for bq, bk in ((8, 8), (16, 32), (5, 7)):
        want = masks.base._tile_reduce(pattern.dense(13, 50), bq, bk)
        assert torch.equal(pattern.block_kinds(13, 50, bq, bk), want)


def test_random_blocks_deterministic_and_seeded():
    a = mechanisms.create("bigbird", block_size=8, random_blocks=2, seed=3)
    b = mechanisms.create("bigbird", block_size=8, random_blocks=2, seed=3)
    c = mechanisms.create("bigbird", block_size=8, random_blocks=2, seed=4)
    assert torch.equal(a.table(400), b.table(400))
    assert not torch.equal(a.table(400), c.table(400))
    t = a.table(400)
    row_counts = t[1:].sum(1)  # non-global rows: window (<= 3) + global 1 + random 2
    assert int(row_counts.max()) == 6 and int(row_counts.min()) >= 4
    q, k, v = rand_qkv(1, 2, 100, 8, seed=5, dtype=torch.float32)
    torch.testing.assert_close(a(q, k, v), b(q, k, v), atol=0, rtol=0)


def test_causal_no_leak():
    q, k, v = rand_qkv(1, 2, 60, 8, seed=6)
    mech = mechanisms.create("bigbird", block_size=8, random_blocks=2, causal=True)
    t = mech.table(60)
    assert not torch.triu(t, 1).any()
    assert_no_future_leak(lambda a, b, c: mech(a, b, c), q, k, v)


def test_gradcheck_float64():
    q, k, v = rand_qkv(1, 2, 20, 4, seed=7, requires_grad=True)
    mech = mechanisms.create("bigbird", block_size=4, random_blocks=1, backend="chunked")
    assert torch.autograd.gradcheck(lambda a, b, c: mech(a, b, c, mask=masks.padding([18])), (q, k, v), fast_mode=True)


def test_padding_invariance_same_block_count():
    q, k, v = rand_qkv(2, 2, 40, 8, seed=8)
    lengths = [40, 35]  # both cover 5 blocks of 8, so the random table is the same
    mech = mechanisms.create("bigbird", block_size=8, random_blocks=1)
    out = mech(q, k, v, mask=masks.padding(lengths))
    for b, n in enumerate(lengths):
        alone = mech(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(out[b : b + 1, :, :n], alone, **TOL[torch.float64])


def test_gather_kernel_with_empty_rows_and_globals():
    N = 70
    q, k, v = rand_qkv(2, 3, N, 16, seed=9)
    allowed = torch.rand(2, 3, N, N, generator=torch.Generator().manual_seed(2)) < 0.6
    allowed[0, 1, 3] = False  # a global row emptied
    allowed[1, 2, 40] = False  # a sparse row emptied
    user = masks.dense(allowed)
    mech = mechanisms.create("bigbird", block_size=8, global_blocks=2, random_blocks=2, backend="gather")
    ref = attention(q, k, v, mask=mech.pattern(N) & user, backend="reference")
    torch.testing.assert_close(mech(q, k, v, mask=user), ref, **TOL[torch.float64])
    with pytest.raises(ValueError, match="gather"):
        mech(q, k, v, bias=torch.zeros(N, N, dtype=q.dtype))


def test_block_table_mask_errors():
    with pytest.raises(ValueError, match="table"):
        BlockTableMask(torch.ones(3, 3), 4)
    m = BlockTableMask(torch.ones(3, 3, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match="n_k"):
        m.dense(20, 20)


def test_cost_linear():
    assert_linear_cost(mechanisms.create("bigbird"))


def test_create_and_errors():
    assert mechanisms.create("bigbird", block_size=32).block_size == 32
    with pytest.raises(ValueError, match="window_blocks"):
        mechanisms.create("bigbird", window_blocks=2)
    with pytest.raises(ValueError, match="block_size"):
        mechanisms.create("bigbird", block_size=0)


def test_trains():
    assert_loss_falls(train_losses(mechanisms.create("bigbird", block_size=4, random_blocks=1), seq_len=32, task="class_token"))


def test_block_table_mask_moves_its_table():
    """A CUDA call must get a CUDA table (a compiled kernel captures the mask it is given)."""
    mech = mechanisms.create("bigbird", block_size=8, random_blocks=1)
    m = BlockTableMask(mech.table(40), 8)
    assert m.to("cpu") is m
    moved = m.to("meta")
    assert moved is not m and moved.table.device.type == "meta" and moved.block_size == 8
    assert m.table.device.type == "cpu"  # the original stays put
    # tile bounds index the integral image on its own device
    assert torch.equal(m.to(torch.device("cpu")).block_kinds(13, 40, 8, 8), m.block_kinds(13, 40, 8, 8))


def test_pattern_is_built_once_per_length_and_device():
    mech = mechanisms.create("bigbird", block_size=8, random_blocks=1)
    assert mech.pattern(40) is mech.pattern(40)
    on_meta = mech.pattern(40, "meta")
    assert on_meta is mech.pattern(40, torch.device("meta")) and on_meta.table.device.type == "meta"
    causal = mechanisms.create("bigbird", block_size=8, random_blocks=1, causal=True)
    assert causal.pattern(40, "meta").a.table.device.type == "meta"
