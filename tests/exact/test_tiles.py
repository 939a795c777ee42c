"""attnlab.exact.tiles and the fused path of ``chunked``, against the float64 reference.

``attend_block`` and ``merge_partials``: splitting the keys anywhere and merging gives the
whole; the backward of each block with the global ``out``/``lse`` sums to the whole
gradient. ``chunked`` on the native kernel, on the fused path (the native kernel turned off)
and on the plain tiles (the fused op turned off too): every mask kind of the attention grid,
grouped-query heads, N != M, fully masked rows, forward and gradients. ``explain`` says which
path a call takes and why.
"""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.exact import chunked_attention, explain, make_call, native, tiles
from attnlab.exact.chunked import fused_reason
from helpers import ATTENTION_CASES, case_id, make_mask, rand_qkv, reference


@pytest.fixture(params=["native", "fused", "plain"])
def path(request):
    """Run a test on the native kernel, on the fused path (no native kernel) and on the plain tiles."""
    native.set_native_enabled(request.param == "native")
    tiles.set_fused_enabled(request.param != "plain")
    yield request.param
    tiles.set_fused_enabled(True)
    native.set_native_enabled(True)


def _formula(q, k, v, allowed, bias, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.double()
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0)[..., None])
    return p @ v.double(), lse


def test_fused_op_is_detected_and_verified():
    assert tiles.fused_status() is None, tiles.fused_status()  # torch 2.13's CPU flash op passes the check
    tiles.set_fused_enabled(False)
    try:
        assert "turned off" in tiles.fused_status()
    finally:
        tiles.set_fused_enabled(True)


@pytest.mark.parametrize("split", [1, 20, 52])
def test_blocks_merge_to_the_whole_and_gradients_split(path, split):
    g = torch.Generator().manual_seed(split)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for n in (37, 53, 53))
    allowed = torch.rand(2, 1, 37, 53, generator=g) > 0.5
    allowed[1, 0, 3] = False  # a row that sees nothing at all
    allowed[0, 0, 4, split:] = False  # a row that sees only the first part
    bias = torch.randn(1, 3, 37, 53, generator=g)
    want_o, want_l = _formula(q, k, v, allowed, bias, 0.3)
    whole = tiles.attend_block(q, k, v, tile_mask=allowed, bias_tile=bias, scale=0.3)
    parts = [tiles.attend_block(q, k[:, :, a:b], v[:, :, a:b], tile_mask=allowed[..., a:b], bias_tile=bias[..., a:b],
                                 scale=0.3) for a, b in ((0, split), (split, 53))]
    merged = tiles.merge_partials(*parts[0], *parts[1])
    for out, lse in (whole, merged):
        torch.testing.assert_close(out.double(), want_o, atol=2e-6, rtol=1e-5)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(want_l)) and bool(torch.isneginf(lse[1, :, 3]).all())
        fin = torch.isfinite(want_l)
        torch.testing.assert_close(lse.double()[fin], want_l[fin], atol=2e-6, rtol=1e-5)
        assert float(out[1, :, 3].abs().max()) == 0.0
    # gradients: each part with the global out and lse, summed, equals autograd through the formula
    do = torch.randn_like(whole[0], generator=None)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    o64, _ = _formula(qd, kd, vd, allowed, bias, 0.3)
    gq, gk, gv = torch.autograd.grad(o64, (qd, kd, vd), do.double())
    gq, gk, gv = (torch.nan_to_num(x) for x in (gq, gk, gv))
    shares = [tiles.attend_block_backward(do, q, k[:, :, a:b], v[:, :, a:b], *whole, tile_mask=allowed[..., a:b],
                                           bias_tile=bias[..., a:b], scale=0.3) for a, b in ((0, split), (split, 53))]
    torch.testing.assert_close((shares[0][0] + shares[1][0]).double(), gq, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat([shares[0][1], shares[1][1]], 2).double(), gk, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat([shares[0][2], shares[1][2]], 2).double(), gv, atol=2e-5, rtol=1e-4)


def test_attend_block_bad_input_names_the_argument():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match="attend_block: q must have 4 dimensions"):
        tiles.attend_block(q[0], k, v)
    with pytest.raises(ValueError, match="attend_block: k and v must agree"):
        tiles.attend_block(q, k[:, :1], v)
    with pytest.raises(ValueError, match="query heads must be equal to the key/value heads"):
        tiles.attend_block(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="tile_mask must broadcast"):
        tiles.attend_block(q, k, v, tile_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="tile_mask must be a bool tensor"):
        tiles.attend_block(q, k, v, tile_mask=torch.ones(4, 6))


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_id)
def test_chunked_matches_reference_forward_and_gradients(path, case):
    B, H, Hkv, N, M_, D, Dv, kind = case
    if N * M_ > 200_000:
        pytest.skip("the largest shapes are covered by test_attention")
    g = torch.Generator().manual_seed(7)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, Dv=Dv, dtype=torch.float32, gen=g)
    mask = make_mask(kind, B, H, N, M_, g)
    call = make_call(q, k, v, mask=mask)
    if path == "native":
        assert native.call_reason(call) is None, native.call_reason(call)
    else:
        assert (fused_reason(call) is None) == (path == "fused" and D == Dv), fused_reason(call)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=mask, backend="chunked")
    want = reference(q, k, v, mask=mask)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    do = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (qg, kg, vg), do)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref = attnlab.attention(q64, k64, v64, mask=mask, backend="math")
    want_g = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for got, w in zip(grads, want_g):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got.double(), w, atol=5e-5, rtol=1e-4)


def test_chunked_fused_handles_a_bias_tensor_and_bfloat16():
    g = torch.Generator().manual_seed(3)
    q, k, v = rand_qkv(2, 4, 300, 32, M=300, Hkv=2, dtype=torch.float32, gen=g)
    bias = torch.randn(1, 4, 300, 300, generator=g)
    mask = masks.sliding_window(40, 0)
    assert fused_reason(make_call(q, k, v, mask=mask, bias=bias)) is None
    out = attnlab.attention(q, k, v, mask=mask, bias=bias, backend="chunked")
    torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask, bias=bias), atol=2e-5, rtol=1e-4)
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    got = attnlab.attention(qb, kb, vb, mask=mask, backend="chunked")
    plain = attnlab.attention(qb, kb, vb, mask=mask, backend="math")
    want = reference(q, k, v, mask=mask)
    assert float((got.double() - want).abs().max()) <= 2 * float((plain.double() - want).abs().max()) + 1e-3


def test_explain_says_which_path_chunked_takes():
    q, k, v = torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)

    def note(**kw):
        return next(x for x in explain(q, k, v, **kw) if x.backend == "chunked").note

    assert note(mask=masks.causal()).startswith("native kernel")
    native.set_native_enabled(False)
    try:
        assert note(mask=masks.causal()).startswith("fused per-block path")
    finally:
        native.set_native_enabled(True)
    assert "dropout" in note(mask=masks.causal(), dropout_p=0.1)
    assert "float64" in next(x for x in explain(q.double(), k.double(), v.double()) if x.backend == "chunked").note
    tb = torch.zeros(1, 2, 64, 64, requires_grad=True)
    assert "bias tensor that needs gradients" in note(bias=tb)
    tiles.set_fused_enabled(False)
    native.set_native_enabled(False)
    try:
        assert "turned off" in note(mask=masks.causal())
    finally:
        tiles.set_fused_enabled(True)
        native.set_native_enabled(True)


def test_fused_check_passes_when_first_used_without_autograd():
    """The one-time check runs its own backward: a first use under no_grad or inference_mode must pass it."""
    with torch.inference_mode():
        assert tiles._verify() is None
    with torch.no_grad():
        assert tiles._verify() is None


@pytest.mark.parametrize("name,mask,N,M_,Hkv", [
    ("causal", masks.causal(), 300, 300, 4),
    ("causal-decode", masks.causal(), 150, 300, 4),  # bottom-right aligned: the diagonal starts at key 150
    ("causal-grouped", masks.causal(), 300, 300, 2),  # grouped heads keep the mask
    ("causal&document", masks.causal() & masks.document(torch.tensor([0] * 100 + [1] * 120 + [2] * 80)), 300, 300, 4),
    ("window", masks.sliding_window(70, 0), 300, 300, 4),
    ("causal&padding", masks.causal() & masks.padding([300, 170]), 300, 300, 4),
])
def test_causal_diagonal_runs_in_the_ops_causal_mode(monkeypatch, no_native_kernel, name, mask, N, M_, Hkv):
    """Diagonal tiles inside the lower triangle go to the op's causal mode; results match float64 either way."""
    seen = []
    real = tiles.attend_block

    def spy(*a, **kw):
        seen.append((bool(kw.get("is_causal")), kw.get("tile_mask") is None))
        return real(*a, **kw)

    import attnlab.exact.chunked as chunked_mod
    monkeypatch.setattr(chunked_mod, "attend_block", spy)
    g = torch.Generator().manual_seed(11)
    q, k, v = rand_qkv(2, 4, N, 32, M=M_, Hkv=Hkv, dtype=torch.float32, gen=g)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    for blk in (None, 64):
        seen.clear()
        out = chunked_attention(make_call(qg, kg, vg, mask=mask), block_q=blk, block_k=blk)
        torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask), atol=2e-5, rtol=1e-4)
        if Hkv == 4:
            assert any(c for c, _ in seen), f"{name}: no call in causal mode"
            if name in ("causal", "causal-decode"):
                assert all(nomask for c, nomask in seen if c), "a pure causal diagonal needs no mask"
        else:
            assert not any(c for c, _ in seen)
        do = torch.randn(out.shape, generator=g)
        grads = torch.autograd.grad(out, (qg, kg, vg), do)
        q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
        want = torch.autograd.grad(attnlab.attention(q64, k64, v64, mask=mask, backend="math"), (q64, k64, v64),
                                   do.double())
        for got, w in zip(grads, want):
            torch.testing.assert_close(got.double(), w, atol=5e-5, rtol=1e-4)
