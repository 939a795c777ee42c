"""Top-k attention: exact at k = M, an independent NumPy oracle below it, gradients, masks, awkward sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import attention, masks
from attnlab.diagnostics import leak_test
from attnlab.mechanisms import create
from attnlab.mechanisms.topk import TopK
from helpers import gradcheck, rand_qkv, reference


def numpy_topk(q, k, v, top, allowed=None):
    """The oracle: NumPy float64, each query's ``top`` largest allowed scores kept (rows with none: zeros)."""
    q, k, v = (t.detach().double().numpy() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # (B, H, M, D), (B, H, M, Dv)
    s = np.einsum("bhnd,bhmd->bhnm", q, k) / np.sqrt(q.shape[-1])  # (B, H, N, M)
    ok = np.ones(s.shape, bool) if allowed is None else np.broadcast_to(allowed.numpy(), s.shape)
    s = np.where(ok, s, -np.inf)
    out = np.zeros(s.shape[:3] + (v.shape[-1],))
    for b, h, n in np.ndindex(*s.shape[:3]):
        row = s[b, h, n]
        keys = [j for j in np.argsort(-row, kind="stable")[:top] if np.isfinite(row[j])]
        if keys:
            w = np.exp(row[keys] - row[keys].max())
            out[b, h, n] = (w / w.sum()) @ v[b, h, keys]
    return torch.from_numpy(out)


def _grads(out, inputs, seed=7):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs)


@pytest.mark.parametrize("N,M,H,Hkv,D", [(1, 1, 2, 2, 8), (13, 13, 9, 3, 40), (7, 23, 4, 1, 59), (97, 97, 2, 2, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_k_equal_m_is_exact_attention_forward_and_gradients(N, M, H, Hkv, D, causal):
    q, k, v = rand_qkv(2, H, N, D, M=M, Hkv=Hkv, Dv=5, seed=N + M, requires_grad=True)
    mask = masks.causal() if causal else None
    mech = TopK(k=M)
    out = mech(q, k, v, mask)
    ref = attention(q, k, v, mask=mask, backend="math")
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.detach(), reference(q.detach(), k.detach(), v.detach(), mask=mask),
                               rtol=0, atol=1e-6)
    for g, r in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-6)


@pytest.mark.parametrize("top", [1, 3, 10])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "window"])
def test_equals_numpy_oracle_below_m(top, mask_kind):
    B, H, N, M = 2, 3, 17, 17
    q, k, v = rand_qkv(B, H, N, 8, M=M, Hkv=1, seed=top)
    mask = {"none": None, "causal": masks.causal(), "padding": masks.padding([M, 6]),
            "window": masks.sliding_window(4, 2)}[mask_kind]
    allowed = None if mask is None else mask.dense(N, M, batch=B, heads=H)
    got = TopK(k=top, chunk=5)(q, k, v, mask)  # chunk 5: the selection runs over 4 query blocks
    torch.testing.assert_close(got, numpy_topk(q, k, v, top, allowed), rtol=0, atol=1e-10)


def test_fewer_keys_than_kept_keep_all_and_fully_masked_rows_give_zeros():
    q, k, v = rand_qkv(2, 2, 9, 8, seed=3)
    mask = masks.padding([9, 0])  # row 1 has no key at all
    out = TopK(k=4)(q, k, v, mask & masks.causal())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1], torch.zeros_like(out[1]))
    # query 2 of row 0 sees 3 causal keys, fewer than k = 4: all three are kept (exact attention there)
    ref = attention(q, k, v, mask=masks.causal(), backend="math")
    torch.testing.assert_close(out[0, :, :4], ref[0, :, :4], rtol=0, atol=1e-10)


def test_bias_enters_the_selection_and_the_softmax():
    q, k, v = rand_qkv(1, 2, 11, 8, seed=4)
    bias = torch.zeros(1, 2, 11, 11, dtype=torch.float64)
    bias[..., 5] = 50.0  # key 5 wins every query's selection; at k=1 every output is v[5]
    out = TopK(k=1)(q, k, v, bias=bias)
    torch.testing.assert_close(out, v[:, :, 5:6].expand_as(out), rtol=0, atol=1e-10)


def test_gradcheck_float64_below_m():
    q, k, v = rand_qkv(1, 2, 7, 4, M=9, seed=5, scale=0.5)
    assert gradcheck(lambda a, b, c: TopK(k=3)(a, b, c, masks.padding([8])), (q, k, v))


@pytest.mark.parametrize("mask", [masks.causal(), masks.sliding_window(3, 1), masks.padding([20, 7])])
def test_masks_are_respected_leak_test(mask):
    q, k, v = rand_qkv(2, 4, 20, 8, Hkv=2, seed=6)
    leak_test(lambda a, b, c, m: TopK(k=5)(a, b, c, m), q, k, v, mask)


def test_weights_have_k_nonzeros_per_row_and_sum_to_one():
    q, k, v = rand_qkv(2, 2, 31, 8, seed=8)
    out, w = create("topk", k=6)(q, k, v, return_weights=True)
    assert ((w > 0).sum(-1) == 6).all()
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    torch.testing.assert_close(out, w @ v)


@pytest.mark.parametrize("kwargs,word", [({"k": 0}, "k must be"), ({"chunk": 2.5}, "chunk must be"),
                                          ({"backend": "nope"}, "nope")])
def test_bad_settings_name_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        TopK(**kwargs)


@pytest.mark.parametrize("mask_kind", ["none", "causal", "window"])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_block_path_float32_equals_the_attention_path(mask_kind, Hkv):
    """``backend="auto"`` runs the selected mask as one block (the kernel when it is built); ``"math"`` through
    :func:`attnlab.attention`: equal outputs and gradients in float32, GQA included, tails of 64-key tiles."""
    q, k, v = rand_qkv(2, 4, 150, 16, M=150, Hkv=Hkv, Dv=24, seed=3, dtype=torch.float32, requires_grad=True)
    mask = {"none": None, "causal": masks.causal(), "window": masks.sliding_window(40, 0)}[mask_kind]
    got = TopK(k=20, chunk=64)(q, k, v, mask)
    ref = TopK(k=20, chunk=64, backend="math")(q, k, v, mask)
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)
    for g, r in zip(_grads(got, (q, k, v)), _grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=2e-5)


def test_a_bias_function_keeps_its_parameters_gradient():
    """A bias function (T5's learned buckets) goes through attnlab.attention, not the block path, so its table
    gets the gradient exact attention gives it (at k = M the two are the same function)."""
    from attnlab.positional import T5RelativeBias

    torch.manual_seed(0)
    q, k, v = rand_qkv(1, 4, 40, 16, seed=5, dtype=torch.float32, requires_grad=True)
    t5 = T5RelativeBias(4, bidirectional=False)
    fn = t5.bias_fn(40, 40)
    got = TopK(k=40)(q, k, v, masks.causal(), bias=fn)
    ref = attention(q, k, v, mask=masks.causal(), bias=fn, backend="math")
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    (g,) = torch.autograd.grad(got.sum(), list(t5.parameters()))
    (r,) = torch.autograd.grad(ref.sum(), list(t5.parameters()))
    assert float(r.abs().max()) > 0
    torch.testing.assert_close(g, r, rtol=0, atol=1e-4)
