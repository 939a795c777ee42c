"""Reformer LSH attention: shared-QK, hashing, sorted chunks, multi-round combination."""

import math

import pytest
import torch

from attnlab import masks, mechanisms
from attnlab.exact import tiles
from attnlab.mechanisms.reformer import lsh_sort
from helpers import (
    TOL,
    assert_linear_cost,
    assert_loss_falls,
    rand_qkv,
    train_losses,
)


def shared_qk_reference(q, v, allowed=None, causal=False, self_score=-1e5):
    """Exact shared-QK attention with the self rule: keys = q / |q|, own score = self_score."""
    B, H, N, D = q.shape
    kn = q / q.norm(dim=-1, keepdim=True)
    s = (q @ kn.transpose(-1, -2)) / math.sqrt(D)  # (B, H, N, N)
    s = s.masked_fill(torch.eye(N, dtype=torch.bool), self_score)
    ok = torch.ones(N, N, dtype=torch.bool)
    if causal:
        ok = torch.tril(ok)
    if allowed is not None:
        ok = ok & allowed
    s = s.masked_fill(~ok, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("N", [1, 2, 7, 97])
@pytest.mark.parametrize("n_hashes", [1, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_single_chunk_equals_exact_shared_qk(N, n_hashes, causal):
    q, _, v = rand_qkv(2, 3, N, 40, Dv=24, seed=N)
    mech = mechanisms.create("reformer", bucket_size=128, n_hashes=n_hashes, n_buckets=4, causal=causal)
    out = mech(q, q, v)
    torch.testing.assert_close(out, shared_qk_reference(q, v, causal=causal), **TOL[torch.float64])


def test_k_is_ignored_and_grouped_values():
    q, k, v = rand_qkv(1, 4, 20, 8, Hkv=2, seed=1)
    mech = mechanisms.create("reformer", bucket_size=32)
    out = mech(q, k, v)
    torch.testing.assert_close(out, mech(q, torch.randn_like(k), v), atol=0, rtol=0)
    torch.testing.assert_close(out, shared_qk_reference(q, v.repeat_interleave(2, dim=1)), **TOL[torch.float64])


@pytest.mark.parametrize("causal", [False, True])
def test_union_semantics_and_weights(causal):
    """With dedup the output is exact attention over the keys some round found (each once)."""
    q, _, v = rand_qkv(2, 2, 61, 16, seed=2)
    mech = mechanisms.create("reformer", bucket_size=8, n_hashes=3, causal=causal, seed=5)
    out, w = mech(q, q, v, return_weights=True)
    torch.testing.assert_close(w @ v, out, **TOL[torch.float64])
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 61, dtype=w.dtype), **TOL[torch.float64])
    support = w > 0
    support |= torch.eye(61, dtype=torch.bool)  # self weight underflows (score -1e5) unless alone
    ref = shared_qk_reference(q, v, allowed=support, causal=causal)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    assert 0.1 < support.float().mean() < 0.9  # really sparse, really non-trivial


def test_more_rounds_reduce_error():
    N = 128
    errs = {}
    for R in (1, 2, 4, 8):
        total = 0.0
        for seed in range(4):
            q, _, v = rand_qkv(1, 2, N, 16, seed=100 + seed, dtype=torch.float32)
            mech = mechanisms.create("reformer", bucket_size=8, n_hashes=R, seed=seed)
            total += float((mech(q, q, v) - shared_qk_reference(q, v)).pow(2).mean())
        errs[R] = total / 4
    assert errs[1] > errs[2] > errs[4] > errs[8], errs
    assert errs[8] < 0.5 * errs[1], errs


def test_causal_no_leak():
    N = 48
    q, _, v = rand_qkv(1, 2, N, 8, seed=3)
    mech = mechanisms.create("reformer", bucket_size=8, n_hashes=2, causal=True)
    base = mech(q, q, v)
    for t in (0, 10, 30, 46):
        v2 = v.clone()
        v2[:, :, t + 1 :] += 5.0
        torch.testing.assert_close(mech(q, q, v2)[:, :, : t + 1], base[:, :, : t + 1], **TOL[torch.float64])
    # no gradient flows from an output to a later query (the keys are the queries)
    qq = q.clone().requires_grad_(True)
    out = mech(qq, qq, v)
    t = 20
    (g,) = torch.autograd.grad(out[:, :, t].sum(), qq)
    assert g[:, :, t + 1 :].abs().max() == 0
    assert g[:, :, : t + 1].abs().max() > 0


def test_causal_user_mask_is_causal_flag():
    q, _, v = rand_qkv(1, 2, 40, 8, seed=4)
    a = mechanisms.create("reformer", bucket_size=8, causal=True)(q, q, v)
    b = mechanisms.create("reformer", bucket_size=8)(q, q, v, mask=masks.causal())
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_lsh_sort_round_trip():
    g = torch.Generator().manual_seed(0)
    buckets = torch.randint(0, 6, (3, 2, 50), generator=g)
    keep = torch.rand(3, 1, 50, generator=g) < 0.8
    sorted_pos, inv = lsh_sort(buckets, 6, keep)
    x = torch.randn(3, 2, 50, generator=g)
    torch.testing.assert_close(x.gather(-1, sorted_pos).gather(-1, inv), x, atol=0, rtol=0)
    key = torch.where(keep, buckets, 6).gather(-1, sorted_pos)
    assert (key[..., 1:] >= key[..., :-1]).all()  # sorted by bucket, padding last
    same = key[..., 1:] == key[..., :-1]
    assert (sorted_pos[..., 1:] > sorted_pos[..., :-1])[same].all()  # then by position


def test_padding_invariance():
    q, _, v = rand_qkv(2, 2, 40, 8, seed=5)
    lengths = [40, 27]
    mech = mechanisms.create("reformer", bucket_size=8, n_hashes=2, n_buckets=4)
    out = mech(q, q, v, mask=masks.padding(lengths))
    for b, n in enumerate(lengths):
        alone = mech(q[b : b + 1, :, :n], q[b : b + 1, :, :n], v[b : b + 1, :, :n])
        torch.testing.assert_close(out[b : b + 1, :, :n], alone, **TOL[torch.float64])
    assert out.isfinite().all()


def test_general_mask_on_pairs():
    q, _, v = rand_qkv(2, 2, 30, 8, seed=6)
    ids = (torch.arange(30) // 10).expand(2, 30)
    mech = mechanisms.create("reformer", bucket_size=64)
    out = mech(q, q, v, mask=masks.document(ids) & masks.padding([30, 25]))
    allowed = masks.document(ids).dense(30, 30)[:, 0] & (torch.arange(30) < torch.tensor([30, 25]).view(2, 1, 1))
    ref = shared_qk_reference(q, v, allowed=allowed[:, None])
    torch.testing.assert_close(out[0], ref[0], **TOL[torch.float64])
    torch.testing.assert_close(out[1, :, :25], ref[1, :, :25], **TOL[torch.float64])


def test_gradcheck_float64():
    q, _, v = rand_qkv(1, 2, 24, 4, seed=7, requires_grad=True)
    mech = mechanisms.create("reformer", bucket_size=4, n_hashes=2, causal=True)
    assert torch.autograd.gradcheck(lambda a, c: mech(a, a, c, mask=masks.padding([21])), (q, v), fast_mode=True)


def test_deterministic_seed_and_redraw():
    q, _, v = rand_qkv(1, 2, 64, 8, seed=8, dtype=torch.float32)
    a, b = (mechanisms.create("reformer", bucket_size=8, seed=1) for _ in range(2))
    torch.testing.assert_close(a(q, q, v), b(q, q, v), atol=0, rtol=0)
    torch.testing.assert_close(a(q, q, v), a(q, q, v), atol=0, rtol=0)
    c = mechanisms.create("reformer", bucket_size=8, seed=2)
    assert not torch.equal(a(q, q, v), c(q, q, v))
    r1, r2 = (mechanisms.create("reformer", bucket_size=8, seed=1, redraw=True) for _ in range(2))
    s1 = [r1(q, q, v) for _ in range(2)]
    s2 = [r2(q, q, v) for _ in range(2)]
    assert not torch.equal(s1[0], s1[1])  # new hashes each training step
    torch.testing.assert_close(s1[1], s2[1], atol=0, rtol=0)  # ... reproducibly
    r1.eval()
    torch.testing.assert_close(r1(q, q, v), r1(q, q, v), atol=0, rtol=0)


def test_cost_linear():
    assert_linear_cost(mechanisms.create("reformer", bucket_size=64, n_hashes=2))


def test_errors():
    q, k, v = rand_qkv(1, 2, 8, 4, M=6)
    mech = mechanisms.create("reformer")
    with pytest.raises(ValueError, match="M == N"):
        mech(q, k, v)
    q, k, v = rand_qkv(1, 2, 8, 4)
    with pytest.raises(ValueError, match="bias"):
        mech(q, k, v, bias=torch.zeros(8, 8, dtype=q.dtype))
    with pytest.raises(ValueError, match="n_buckets"):
        mechanisms.create("reformer", n_buckets=3)
    with pytest.raises(ValueError, match="n_hashes"):
        mechanisms.create("reformer", n_hashes=0)


def test_trains():
    assert_loss_falls(train_losses(mechanisms.create("reformer", bucket_size=8, n_hashes=2), seq_len=32, task="class_token"))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal,dedup", [(False, True), (True, True), (False, False), (True, False)])
def test_fused_chunks_equal_readable_path_with_gradients(causal, dedup, fused):
    """All rounds in one fused call (first-round dedup, merged by lse) equal the score-matrix path
    (what ``return_weights=True`` runs), outputs and gradients, with padding and empty slots (75 = 9.4 chunks)."""
    q, _, v = rand_qkv(2, 3, 75, 16, Dv=8, dtype=torch.float32, seed=41, requires_grad=True)
    mech = mechanisms.create("reformer", bucket_size=8, n_hashes=3, causal=causal, dedup=dedup, seed=3)
    mask = masks.padding([75, 60])
    dout = torch.randn(2, 3, 75, 8, generator=torch.Generator().manual_seed(42))
    tiles.set_fused_enabled(fused)
    try:
        new = mech(q, q, v, mask=mask)
        new_grads = torch.autograd.grad(new, (q, v), dout)
    finally:
        tiles.set_fused_enabled(True)
    old = mech(q, q, v, mask=mask, return_weights=True)[0]
    old_grads = torch.autograd.grad(old, (q, v), dout)
    for a, b in zip((new, *new_grads), (old, *old_grads)):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


def test_fused_chunks_equal_readable_path_many_chunks():
    """Over 128 chunks the deduplication compares 16-bit chunk ids instead of bytes."""
    q, _, v = rand_qkv(1, 2, 300, 8, dtype=torch.float32, seed=43)
    mech = mechanisms.create("reformer", bucket_size=2, n_hashes=3, n_buckets=8, causal=True, seed=4)
    torch.testing.assert_close(mech(q, q, v), mech(q, q, v, return_weights=True)[0], **TOL[torch.float32])
