"""Streamed attention statistics equal the ones computed from the materialized weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import masks
from attnlab.diagnostics.stream import attention_statistics, statistics_from_weights
from helpers import TOL, rand_qkv


def _dense(q, k, v, **kw):
    _, w = attnlab.attention(q, k, v, return_weights=True, backend="math", **kw)
    return w


def _assert_same(a, b, dtype, check_indices=True):
    tol = TOL[dtype]
    for f in ("entropy", "received", "topk_values", "mean_distance"):
        torch.testing.assert_close(getattr(a, f), getattr(b, f).to(getattr(a, f).dtype), **tol, msg=f)
    assert torch.equal(a.valid, b.valid)
    if check_indices:
        assert torch.equal(a.topk_indices, b.topk_indices)
    torch.testing.assert_close(a.head_entropy, b.head_entropy.to(a.head_entropy.dtype), **tol)
    torch.testing.assert_close(a.head_mean_distance, b.head_mean_distance.to(a.head_mean_distance.dtype), **tol)
    if b.pooled is not None:
        torch.testing.assert_close(a.pooled, b.pooled.to(a.pooled.dtype), **tol)


CASES = [
    # B, H, Hkv, N, M, D, mask
    (1, 1, 1, 1, 1, 40, None),
    (2, 9, 3, 97, 97, 40, masks.causal()),
    (1, 2, 2, 33, 130, 59, masks.sliding_window(7, 3)),
    (2, 4, 1, 50, 41, 16, masks.causal()),  # N > M: the first 9 query rows see no key
    (2, 2, 2, 64, 64, 8, masks.padding(torch.tensor([64, 5])) & masks.causal()),
    (1, 3, 3, 70, 70, 24, masks.document(torch.tensor([[0] * 30 + [1] * 25 + [2] * 15]))),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[3]}x{c[4]}-H{c[1]}/{c[2]}-{c[6]!r}")
def test_streamed_equals_dense(case, dtype):
    B, H, Hkv, N, M, D, mask = case
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, Dv=3, dtype=dtype, draw_dtype=None)
    w = _dense(q, k, v, mask=mask)
    a = attention_statistics(q, k, v, mask=mask, top_k=5, bins=(7, 6), block_q=16, block_k=32)
    _assert_same(a, statistics_from_weights(w, top_k=5, bins=(7, 6)), dtype)


def test_default_tiles_and_no_v():
    q, k, _ = rand_qkv(1, 2, 300, 32, M=300, Hkv=2, Dv=3, dtype=torch.float32, seed=3, draw_dtype=None)
    w = _dense(q, k, k[..., :1], mask=masks.causal())
    a = attention_statistics(q, k, mask=masks.causal(), top_k=3)
    _assert_same(a, statistics_from_weights(w, top_k=3), torch.float32)


def test_fully_masked_rows_have_zero_entropy_and_no_topk():
    q, k, v = rand_qkv(1, 2, 12, 16, M=8, Hkv=2, Dv=3, dtype=torch.float64, draw_dtype=None)
    a = attention_statistics(q, k, v, mask=masks.causal(), top_k=3)
    empty = slice(0, 4)  # N - M = 4 query rows precede every key
    assert not a.valid[..., empty].any() and a.valid[..., 4:].all()
    assert (a.entropy[..., empty] == 0).all() and (a.mean_distance[..., empty] == 0).all()
    assert (a.topk_indices[..., empty, :] == -1).all() and (a.topk_values[..., empty, :] == 0).all()
    # the first non-empty row sees exactly one key: a single top-k entry with weight 1
    torch.testing.assert_close(a.topk_values[..., 4, 0], torch.ones(1, 2, dtype=torch.float64))
    assert (a.topk_indices[..., 4, 1:] == -1).all()


def test_bias_tensor_and_bias_function():
    q, k, v = rand_qkv(2, 4, 45, 16, M=45, Hkv=2, Dv=3, dtype=torch.float32, seed=5, draw_dtype=None)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).view(1, 4, 1, 1)

    def alibi(b, h, qi, kj):
        return -slopes.view(-1)[h] * (qi - kj).abs().float()

    bias_t = alibi(*[torch.arange(s).view(*[-1 if d == i else 1 for d in range(4)]) for i, s in enumerate((2, 4, 45, 45))])
    for bias in (bias_t, alibi):
        w = _dense(q, k, v, bias=bias, mask=masks.causal())
        a = attention_statistics(q, k, v, bias=bias, mask=masks.causal(), top_k=4, block_q=16, block_k=16)
        _assert_same(a, statistics_from_weights(w, top_k=4), torch.float32)


def test_pooled_rows_sum_to_one():
    q, k, v = rand_qkv(1, 1, 200, 8, M=150, Hkv=1, Dv=3, dtype=torch.float64, seed=2, draw_dtype=None)
    a = attention_statistics(q, k, v, bins=13, block_q=32, block_k=64)
    assert a.pooled.shape == (1, 1, 13, 13)
    torch.testing.assert_close(a.pooled.sum(-1), torch.ones(1, 1, 13, dtype=torch.float64))


def test_bad_arguments():
    q, k, v = rand_qkv(1, 1, 4, 8, M=4, Hkv=1, Dv=3, dtype=torch.float32, draw_dtype=None)
    with pytest.raises(ValueError, match="top_k"):
        attention_statistics(q, k, v, top_k=0)
    with pytest.raises(ValueError, match="bins"):
        attention_statistics(q, k, v, bins=0)
    with pytest.raises(ValueError, match="q"):
        attention_statistics(q[0], k, v)
    with pytest.raises(ValueError, match="weights"):
        statistics_from_weights(torch.ones(4, 4))


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 40), m=st.integers(1, 40), h=st.sampled_from([(1, 1), (4, 2), (3, 3)]),
    left=st.integers(0, 10), right=st.integers(0, 10), causal=st.booleans(),
    bq=st.sampled_from([1, 7, 16]), bk=st.sampled_from([1, 5, 32]), seed=st.integers(0, 1000),
)
def test_property_streamed_equals_dense(n, m, h, left, right, causal, bq, bk, seed):
    q, k, v = rand_qkv(1, h[0], n, 8, M=m, Hkv=h[1], Dv=3, dtype=torch.float64, seed=seed, scale=2.0, draw_dtype=None)
    mask = masks.sliding_window(left, right) & masks.causal() if causal else masks.sliding_window(left, right)
    w = _dense(q, k, v, mask=mask)
    a = attention_statistics(q, k, v, mask=mask, top_k=3, bins=(3, 4), block_q=bq, block_k=bk)
    _assert_same(a, statistics_from_weights(w, top_k=3, bins=(3, 4)), torch.float64)
