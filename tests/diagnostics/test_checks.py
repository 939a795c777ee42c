"""attnlab.diagnostics: check_attention and leak_test pass on real attention, fail on broken."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.diagnostics import AttentionCheckError, AttentionReport, check_attention, leak_test
from helpers import rand_qkv

MASKS = {
    "none": None,
    "causal": masks.causal(),
    "padding_with_empty_row": masks.padding([0, 7]),
    "window_or_global": masks.sliding_window(2, 1) | masks.global_tokens([0]),
    "dense": masks.dense(torch.rand(2, 4, 9, 13, generator=torch.Generator().manual_seed(3)) > 0.6),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_check_attention_passes_on_real_weights(gen, name):
    mask = MASKS[name]
    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    _, w = attnlab.attention(q, k, v, mask=mask, return_weights=True)
    report = check_attention(w, mask)
    assert isinstance(report, AttentionReport)
    assert report.rows == 2 * 4 * 9
    assert report.max_row_sum_error <= 1e-5 and report.max_masked_weight == 0.0
    if name == "padding_with_empty_row":
        assert report.empty_rows == 4 * 9  # batch row 0 sees no key
    # the same mask as a bool tensor works too
    if mask is not None:
        check_attention(w, mask.dense(9, 13, batch=2, heads=4))


def test_check_attention_accepts_2d_weights():
    w = torch.softmax(torch.randn(5, 5).masked_fill(~masks.causal().dense(5, 5)[0, 0], float("-inf")), -1)
    assert check_attention(w, masks.causal()).rows == 5


def _good(gen):
    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    _, w = attnlab.attention(q, k, v, mask=masks.causal(), return_weights=True)
    return w


def test_check_attention_rejects_row_sum_off(gen):
    w = _good(gen).clone()
    w[1, 2, 3] *= 1.01
    with pytest.raises(AttentionCheckError, match=r"sum to 1.*\(1, 2, 3\)"):
        check_attention(w, masks.causal())


def test_check_attention_rejects_nonzero_empty_row(gen):
    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    mask = masks.padding([0, 13])
    _, w = attnlab.attention(q, k, v, mask=mask, return_weights=True)
    w = w.clone()
    w[0, 0, 0] = 1.0 / 13  # a row that may see nothing must hold zeros
    with pytest.raises(AttentionCheckError, match="disallowed"):
        check_attention(w, mask)


def test_check_attention_rejects_nan_and_inf(gen):
    w = _good(gen).clone()
    w[0, 1, 2, 0] = float("nan")
    with pytest.raises(AttentionCheckError, match=r"NaN/Inf at \(0, 1, 2, 0\)"):
        check_attention(w, masks.causal())
    w[0, 1, 2, 0] = float("inf")
    with pytest.raises(AttentionCheckError, match="NaN/Inf"):
        check_attention(w)


def test_check_attention_rejects_weight_on_masked_key(gen):
    w = _good(gen).clone()
    # move half the mass of query 0 (position 4 of 13, sees keys 0..4) onto key 5: row sums stay 1
    w[0, 0, 0, :5] *= 0.5
    w[0, 0, 0, 5] = 0.5
    with pytest.raises(AttentionCheckError, match=r"disallowed keys.*\(0, 0, 0, 5\)"):
        check_attention(w, masks.causal())
    # without the mask the same weights are not an error of sums
    w2 = _good(gen).clone()
    w2[0, 0, 0, 4:6] = w2[0, 0, 0, 4:6].flip(-1)  # weight on key 5 (hidden), none on key 4
    check_attention(w2)
    with pytest.raises(AttentionCheckError, match="disallowed"):
        check_attention(w2, masks.causal())


def test_check_attention_rejects_negative_weights():
    w = torch.tensor([[0.5, 0.5], [1.2, -0.2]])
    with pytest.raises(AttentionCheckError, match="negative"):
        check_attention(w)


def test_check_attention_bad_arguments():
    with pytest.raises(ValueError, match="weights"):
        check_attention(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        check_attention(torch.ones(2, 2) / 2, torch.ones(2, 2))  # float tensor is not a mask
    assert issubclass(AttentionCheckError, ValueError)


# -- leak_test ------------------------------------------------------------------------------
def _exact(backend):
    return lambda q, k, v, mask: attnlab.attention(q, k, v, mask=mask, backend=backend)


@pytest.mark.parametrize("backend", ["math", "chunked", "sdpa"])
@pytest.mark.parametrize("name", ["causal", "padding_with_empty_row", "window_or_global", "dense"])
def test_leak_test_passes_on_exact_attention(gen, backend, name):
    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    change = leak_test(_exact(backend), q, k, v, MASKS[name])
    assert 0.0 <= change <= 1e-5


def _ignores_mask(q, k, v, mask):
    return attnlab.attention(q, k, v, backend="math")


def _leaks_one_future_key(q, k, v, mask):
    """Causal attention that also lets every query peek at the last key."""
    m = mask | masks.dense(_last_key(k))
    return attnlab.attention(q, k, v, mask=m, backend="math")


def _last_key(k):
    a = torch.zeros(1, 1, 1, k.shape[2], dtype=torch.bool)
    a[..., -1] = True
    return a


def test_leak_test_catches_a_function_that_ignores_the_mask(gen):
    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    with pytest.raises(AttentionCheckError, match=r"mask leak: outputs at \(batch, head, query\) \(0, 0, 0\)"):
        leak_test(_ignores_mask, q, k, v, masks.causal())


def test_leak_test_catches_a_single_leaked_key(gen):
    q, k, v = rand_qkv(2, 4, 13, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    with pytest.raises(AttentionCheckError, match="mask leak") as e:
        leak_test(_leaks_one_future_key, q, k, v, masks.causal())
    # the last query may see the last key, so it is not reported
    assert "12)" not in str(e.value).split("moved")[0]


def test_leak_test_catches_a_fully_masked_row_that_is_not_zero(gen):
    """A row that sees nothing must not follow the (perturbed) values."""

    def uniform_on_empty_rows(q, k, v, mask):
        out = attnlab.attention(q, k, v, mask=mask, backend="math")  # (B, H, N, Dv)
        vbar = v.mean(2, keepdim=True).repeat_interleave(q.shape[1] // k.shape[1], 1)  # (B, H, 1, Dv)
        empty = ~mask.dense(q.shape[2], k.shape[2], batch=q.shape[0]).any(-1, keepdim=True)  # (B, 1, N|1, 1)
        return out + vbar * empty

    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float32, gen=gen, draw_dtype=None)
    with pytest.raises(AttentionCheckError, match=r"\(0, 0, 0\)"):
        leak_test(uniform_on_empty_rows, q, k, v, masks.padding([0, 7]))


def test_leak_test_queries_subset_and_float64(gen):
    q, k, v = rand_qkv(2, 4, 9, 8, M=13, Hkv=2, dtype=torch.float64, gen=gen, draw_dtype=None)
    assert leak_test(_exact("math"), q, k, v, masks.causal(), queries=[0, 4], trials=1) <= 1e-10
    with pytest.raises(ValueError, match="queries"):
        leak_test(_exact("math"), q, k, v, masks.causal(), queries=[9])
    # a mask that hides nothing perturbs nothing
    assert leak_test(_exact("math"), q, k, v, masks.sliding_window(20, 20)) == 0.0
