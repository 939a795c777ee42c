"""attnlab.attention: every torch backend against the float64 NumPy reference.

Covers awkward shapes (length 1, 97, 1025; head dims 40, 59, 64; 9 heads; N != M;
grouped-query heads; Dv != D), random masks with fully masked rows (exact zeros),
bias tensors and bias functions, the scale argument, bfloat16 judged against plain
torch's own bfloat16 error, the seeds' 3-token worked example, ``auto`` dispatch and
``explain``, argument validation, counter-based dropout, and the behavioural mask
test (perturb what a query may not see) for every mask kind and backend.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.diagnostics import leak_test
from attnlab.exact import backends, choose_backend, chunked_attention, explain, get_backend, make_call
from helpers import ATTENTION_CASES, case_id, make_mask, rand_qkv, reference

TORCH_BACKENDS = ["math", "chunked", "sdpa"]


def dense_allowed(mask, B, H, N, M_) -> torch.Tensor:
    """``(B, H, N, M)`` bool of any mask argument."""
    if mask is None:
        return torch.ones(B, H, N, M_, dtype=torch.bool)
    return masks.as_mask(mask).dense(N, M_, batch=B, heads=H).expand(B, H, N, M_)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_id)
def test_float32_backends_match_reference(case, tol):
    B, H, Hkv, N, M_, D, Dv, kind = case
    g = torch.Generator().manual_seed(zlib.crc32(case_id(case).encode()))
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, Dv=Dv, dtype=torch.float32, gen=g)
    mask = make_mask(kind, B, H, N, M_, g)
    want = reference(q, k, v, mask=mask).float()
    empty = ~dense_allowed(mask, B, H, N, M_).any(-1)  # (B, H, N)
    for name in TORCH_BACKENDS:
        out = attnlab.attention(q, k, v, mask=mask, backend=name)
        assert out.shape == (B, H, N, Dv) and out.dtype == torch.float32
        torch.testing.assert_close(out, want, **tol(torch.float32), msg=lambda m, n=name: f"{n}: {m}")
        assert (out[empty] == 0).all(), f"{name}: fully masked rows must be exactly zero"
    auto = attnlab.attention(q, k, v, mask=mask)
    torch.testing.assert_close(auto, want, **tol(torch.float32))
    # chunked with small, non-dividing tiles: many EMPTY / PARTIAL / FULL tiles
    bq, bk = (7, 13) if N * M_ <= 40 * 40 else (16, 24) if N * M_ <= 97 * 97 else (128, 96)
    tiled = chunked_attention(make_call(q, k, v, mask=mask), block_q=bq, block_k=bk)
    torch.testing.assert_close(tiled, want, **tol(torch.float32))
    assert (tiled[empty] == 0).all()


BIASES = {
    "1HNM": lambda B, H, N, M_, g: torch.randn(1, H, N, M_, generator=g),
    "B11M": lambda B, H, N, M_, g: torch.randn(B, 1, 1, M_, generator=g),
    "NM": lambda B, H, N, M_, g: torch.randn(N, M_, generator=g),
    "neg_inf_row": lambda B, H, N, M_, g: torch.zeros(B, H, N, M_).index_fill_(2, torch.tensor([1]), float("-inf")),
}


@pytest.mark.parametrize("bias_kind", list(BIASES))
@pytest.mark.parametrize("mask_kind", ["none", "causal", "random"])
def test_bias_tensors(bias_kind, mask_kind, tol):
    B, H, Hkv, N, M_, D = 2, 6, 2, 19, 37, 40
    g = torch.Generator().manual_seed(11)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, dtype=torch.float32, gen=g)
    bias = BIASES[bias_kind](B, H, N, M_, g)
    mask = make_mask(mask_kind, B, H, N, M_, g)
    want = reference(q, k, v, mask=mask, bias=bias, scale=0.3).float()
    for name in TORCH_BACKENDS:
        out = attnlab.attention(q, k, v, mask=mask, bias=bias, scale=0.3, backend=name)
        torch.testing.assert_close(out, want, **tol(torch.float32), msg=lambda m, n=name: f"{n}: {m}")
        if bias_kind == "neg_inf_row":  # a -inf bias row is a fully masked row: zeros, not NaN
            assert (out[:, :, 1] == 0).all(), name
    tiled = chunked_attention(make_call(q, k, v, mask=mask, bias=bias, scale=0.3), block_q=4, block_k=7)
    torch.testing.assert_close(tiled, want, **tol(torch.float32))


def test_bias_function_alibi(tol):
    B, H, Hkv, N, M_, D = 2, 6, 3, 23, 41, 59
    g = torch.Generator().manual_seed(5)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, dtype=torch.float32, gen=g)
    slope = 2.0 ** (-torch.arange(1, H + 1, dtype=torch.float32))

    def alibi(b, h, qi, ki):
        return -(qi + (M_ - N) - ki).abs() * slope[h]

    mask = masks.causal()
    want = reference(q, k, v, mask=mask, bias=alibi).float()
    # the function equals the same bias materialized
    dense_bias = alibi(*[t for t in torch.meshgrid(
        torch.arange(B), torch.arange(H), torch.arange(N), torch.arange(M_), indexing="ij")])
    torch.testing.assert_close(reference(q, k, v, mask=mask, bias=dense_bias).float(), want, rtol=0, atol=0)
    for name in TORCH_BACKENDS:
        out = attnlab.attention(q, k, v, mask=mask, bias=alibi, backend=name)
        torch.testing.assert_close(out, want, **tol(torch.float32), msg=lambda m, n=name: f"{n}: {m}")
    tiled = chunked_attention(make_call(q, k, v, mask=mask, bias=alibi), block_q=5, block_k=8)
    torch.testing.assert_close(tiled, want, **tol(torch.float32))
    # bias tensor and function together
    extra = torch.randn(1, H, 1, M_, generator=g)
    both = reference(q, k, v, mask=mask, bias=dense_bias + extra).float()
    for name in TORCH_BACKENDS:
        b = attnlab.attention(q, k, v, mask=mask, bias=lambda *i: alibi(*i) + extra, backend=name)
        torch.testing.assert_close(b, both, **tol(torch.float32))


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_scale_argument(scale, tol):
    g = torch.Generator().manual_seed(2)
    q, k, v = rand_qkv(1, 4, 13, 16, M=29, Hkv=2, Dv=8, dtype=torch.float32, gen=g)
    want = reference(q, k, v, mask=masks.causal(), scale=scale).float()
    assert not torch.allclose(want, reference(q, k, v, mask=masks.causal()).float())
    for name in TORCH_BACKENDS:
        torch.testing.assert_close(attnlab.attention(q, k, v, mask=masks.causal(), scale=scale, backend=name), want, **tol(torch.float32))


def test_naive_formula_agrees_with_reference(naive_attention, tol):
    """The bf16 yardstick computes the right function (checked in float64)."""
    g = torch.Generator().manual_seed(9)
    q, k, v = rand_qkv(2, 6, 11, 8, M=17, Hkv=2, dtype=torch.float64, gen=g)
    allowed = masks.causal().dense(11, 17)
    torch.testing.assert_close(naive_attention(q, k, v, allowed), reference(q, k, v, mask=masks.causal()), **tol(torch.float64))


@pytest.mark.parametrize("mask_kind,Hkv", [("none", 3), ("causal", 1), ("window", 3)])
def test_bfloat16_error_within_twice_plain_torch(mask_kind, Hkv, naive_attention):
    B, H, N, M_, D = 1, 3, 33, 33, 40
    g = torch.Generator().manual_seed(17)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, dtype=torch.bfloat16, gen=g)
    mask = make_mask(mask_kind, B, H, N, M_, g)
    want = reference(q, k, v, mask=mask)  # float64, from the same bf16 inputs
    allowed = None if mask is None else dense_allowed(mask, B, H, N, M_)
    naive_err = (naive_attention(q, k, v, allowed).double() - want).abs().max().item()
    assert naive_err > 0
    for name in TORCH_BACKENDS:
        out = attnlab.attention(q, k, v, mask=mask, backend=name)
        assert out.dtype == torch.bfloat16
        err = (out.double() - want).abs().max().item()
        assert err <= 2.0 * naive_err + 1e-3, f"{name}: bf16 error {err:.3g} vs plain torch {naive_err:.3g}"


# -- the seeds' worked example -------------------------------------------------------------
def _seed_example():
    X = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [0.9, 1.0, 1.1, 1.2]])
    rs = np.random.RandomState(0)
    W_q, W_k, W_v = (rs.randn(4, 4) * 0.1 for _ in range(3))
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return Q, K, V


def _seed_formula(Q, K, V, blocked=None):
    """The seeds' numpy steps: scores, scale, (add mask * -1e9), softmax, weighted sum."""
    scores = Q @ K.T
    scaled = scores / np.sqrt(K.shape[-1])
    if blocked is not None:
        scaled = scaled + blocked * -1e9
    w = np.exp(scaled) / np.sum(np.exp(scaled), axis=1, keepdims=True)
    return w @ V, w


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["reference", *TORCH_BACKENDS])
def test_seeds_worked_example(backend, dtype, tol):
    Q, K, V = _seed_example()
    want_out, want_w = _seed_formula(Q, K, V)
    t = lambda a: torch.from_numpy(a)[None, None].to(dtype)  # noqa: E731  (1, 1, 3, 4)
    out = attnlab.attention(t(Q), t(K), t(V), backend=backend)
    torch.testing.assert_close(out, t(want_out), **tol(dtype))
    # the look-ahead mask of the seeds, through from_blocked
    look_ahead = np.triu(np.ones((3, 3)), k=1)
    want_c, _ = _seed_formula(Q, K, V, look_ahead)
    out_c = attnlab.attention(t(Q), t(K), t(V), mask=masks.from_blocked(torch.from_numpy(look_ahead)), backend=backend)
    torch.testing.assert_close(out_c, t(want_c), **tol(dtype))
    if backend in ("reference", "math"):
        _, w = attnlab.attention(t(Q), t(K), t(V), return_weights=True, backend=backend)
        torch.testing.assert_close(w, t(want_w), **tol(dtype))


# -- dispatch -------------------------------------------------------------------------------
def _shape(N, M_=None, H=2, D=16):
    M_ = N if M_ is None else M_
    return torch.randn(1, H, N, D), torch.randn(1, H, M_, D), torch.randn(1, H, M_, D)


def test_auto_choices():
    q, k, v = _shape(64)
    assert choose_backend(q, k, v) == "sdpa"
    assert choose_backend(q, k, v, mask=masks.causal()) == "sdpa"
    assert choose_backend(q, k, v, mask=masks.causal(), return_weights=True) == "math"
    assert choose_backend(q, k, v, return_weights=True) == "math"
    q, k, v = _shape(4096, H=8, D=64)  # typical sizes: a narrow window skips most tiles
    assert choose_backend(q, k, v, mask=masks.sliding_window(64)) == "chunked"
    # auto actually uses the chosen backend's answer (and returns the weights with math)
    q, k, v = _shape(9)
    out, w = attnlab.attention(q, k, v, mask=masks.causal(), return_weights=True)
    assert w.shape == (1, 2, 9, 9)


def test_explain_one_verdict_per_backend():
    q, k, v = _shape(20, 30)
    verdicts = explain(q, k, v, mask=masks.causal(), return_weights=True)
    assert [x.backend for x in verdicts] == list(backends())
    assert sum(x.chosen for x in verdicts) == 1
    by = {x.backend: x for x in verdicts}
    assert by["math"].serves and by["math"].chosen and by["math"].estimate is not None
    for name in ("sdpa", "chunked"):
        assert not by[name].serves and "weights" in by[name].reason
    for x in verdicts:
        assert x.serves == (x.reason is None)
        assert x.reason is None or (isinstance(x.reason, str) and x.reason)
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        assert "not installed" in by["flash"].reason and "pip install" in by["flash"].reason
    assert "reference" in by and by["reference"].serves and not by["reference"].chosen  # never auto


def test_named_backend_that_cannot_serve_says_why():
    q, k, v = _shape(8)
    with pytest.raises(ValueError, match="sdpa.*weights"):
        attnlab.attention(q, k, v, return_weights=True, backend="sdpa")


# -- validation -----------------------------------------------------------------------------
def _v(B=1, H=6, Hkv=2, N=5, M_=7, D=8, Dv=8, dtype=torch.float32, device="cpu"):
    return (
        torch.randn(B, H, N, D, dtype=dtype, device=device),
        torch.randn(B, Hkv, M_, D, dtype=dtype, device=device),
        torch.randn(B, Hkv, M_, Dv, dtype=dtype, device=device),
    )


def _bad_calls():
    q, k, v = _v()
    return [
        ("q rank", lambda: attnlab.attention(q[0], k, v), ["q", "4 dimensions", "(6, 5, 8)"]),
        ("k rank", lambda: attnlab.attention(q, k[..., None], v), ["k", "(1, 2, 7, 8, 1)"]),
        ("head dim", lambda: attnlab.attention(q, k[..., :7], v), ["head_dim", "(1, 6, 5, 8)", "(1, 2, 7, 7)"]),
        ("heads", lambda: attnlab.attention(q, *_v(Hkv=4)[1:]), ["multiple", "6", "4"]),
        ("kv len", lambda: attnlab.attention(q, k, v[:, :, :6]), ["k and v", "(1, 2, 7, 8)", "(1, 2, 6, 8)"]),
        ("batch", lambda: attnlab.attention(q, *_v(B=2)[1:]), ["batch", "(1, 6, 5, 8)"]),
        ("mask shape", lambda: attnlab.attention(q, k, v, mask=torch.ones(6, 7, dtype=torch.bool)), ["mask", "(6, 7)", "(1, 6, 5, 7)"]),
        ("mask batch", lambda: attnlab.attention(q, k, v, mask=masks.padding([1, 2, 3])), ["mask", "batch size 3"]),
        ("mask heads", lambda: attnlab.attention(q, k, v, mask=torch.ones(1, 4, 5, 7, dtype=torch.bool)), ["mask", "4 heads"]),
        ("float mask", lambda: attnlab.attention(q, k, v, mask=torch.ones(5, 7)), ["mask", "float32", "bias="]),
        ("int mask", lambda: attnlab.attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.long)), ["mask", "int64"]),
        ("mask type", lambda: attnlab.attention(q, k, v, mask="causal"), ["mask", "str"]),
        ("bias shape", lambda: attnlab.attention(q, k, v, bias=torch.zeros(1, 6, 4, 7)), ["bias", "(1, 6, 4, 7)", "(1, 6, 5, 7)"]),
        ("bias too big", lambda: attnlab.attention(q, k, v, bias=torch.zeros(3, 6, 5, 7)), ["bias", "(3, 6, 5, 7)"]),
        ("bias bool", lambda: attnlab.attention(q, k, v, bias=torch.zeros(5, 7, dtype=torch.bool)), ["bias", "bool"]),
        ("bias type", lambda: attnlab.attention(q, k, v, bias=3.0), ["bias", "float"]),
        ("dtypes", lambda: attnlab.attention(q, k.double(), v), ["dtype", "torch.float32", "torch.float64"]),
        ("int q", lambda: attnlab.attention(q.long(), k, v), ["q", "floating", "int64"]),
        ("devices", lambda: attnlab.attention(q, k.to("meta"), v), ["device", "cpu", "meta"]),
        ("bias device", lambda: attnlab.attention(q, k, v, bias=torch.zeros(5, 7, device="meta")), ["bias", "meta"]),
        ("dropout neg", lambda: attnlab.attention(q, k, v, dropout_p=-0.1), ["dropout_p", "-0.1"]),
        ("dropout one", lambda: attnlab.attention(q, k, v, dropout_p=1.0), ["dropout_p", "1.0"]),
        ("dropout str", lambda: attnlab.attention(q, k, v, dropout_p="0.1"), ["dropout_p", "'0.1'"]),
        ("scale nan", lambda: attnlab.attention(q, k, v, scale=float("nan")), ["scale", "nan"]),
        ("backend", lambda: attnlab.attention(q, k, v, backend="fastest"), ["backend", "'fastest'", "math"]),
        ("empty seq", lambda: attnlab.attention(q[:, :, :0], k, v), ["q", "(1, 6, 0, 8)"]),
    ]


@pytest.mark.parametrize("case", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_arguments_raise_value_error(case):
    _, call, words = case
    with pytest.raises(ValueError) as e:
        call()
    for w in words:
        assert w in str(e.value), f"{w!r} not in {str(e.value)!r}"


# -- dropout --------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_kind", ["none", "causal", "random"])
def test_dropout_same_seed_same_drops(mask_kind, tol):
    B, H, Hkv, N, M_, D = 2, 6, 2, 21, 19, 8
    g = torch.Generator().manual_seed(23)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, dtype=torch.float64, gen=g)
    mask = make_mask(mask_kind, B, H, N, M_, g)
    call = make_call(q, k, v, mask=mask, dropout_p=0.3, dropout_seed=1234)
    math_out, _ = get_backend("math").forward(call)
    ref_out, _ = get_backend("reference").forward(call)
    no_drop, _ = get_backend("math").forward(make_call(q, k, v, mask=mask))
    assert not torch.allclose(math_out, no_drop)
    torch.testing.assert_close(math_out, ref_out, **tol(torch.float64))
    torch.testing.assert_close(get_backend("chunked").forward(call)[0], math_out, **tol(torch.float64))
    torch.testing.assert_close(chunked_attention(call, block_q=4, block_k=8), math_out, **tol(torch.float64))
    other, _ = get_backend("math").forward(make_call(q, k, v, mask=mask, dropout_p=0.3, dropout_seed=1235))
    assert not torch.allclose(other, math_out)
    # through attention(): the seed comes from torch's generator
    outs = {}
    for name in ("math", "chunked"):
        torch.manual_seed(77)
        outs[name] = attnlab.attention(q, k, v, mask=mask, dropout_p=0.3, backend=name)
    torch.testing.assert_close(outs["chunked"], outs["math"], **tol(torch.float64))


def test_dropout_zero_is_no_dropout():
    g = torch.Generator().manual_seed(4)
    q, k, v = rand_qkv(1, 4, 13, 8, M=17, Hkv=2, dtype=torch.float32, gen=g)
    for name in TORCH_BACKENDS:
        a = attnlab.attention(q, k, v, mask=masks.causal(), backend=name)
        b = attnlab.attention(q, k, v, mask=masks.causal(), dropout_p=0.0, backend=name)
        assert torch.equal(a, b), name


def test_dropout_is_unbiased_over_seeds():
    """E[dropout output] = the no-dropout output, within 6 standard errors per element."""
    B, H, N, M_, D, p, S = 1, 2, 5, 7, 4, 0.25, 400
    g = torch.Generator().manual_seed(8)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=H, dtype=torch.float64, gen=g)
    base, w = get_backend("math").forward(make_call(q, k, v, mask=masks.causal(), return_weights=True))
    outs = torch.stack([get_backend("math").forward(make_call(q, k, v, mask=masks.causal(), dropout_p=p, dropout_seed=s))[0] for s in range(S)])
    # per-element variance of sum_j w_j z_j v_j with z_j = keep/(1-p): w_j^2 v_j^2 p/(1-p)
    var = (w.unsqueeze(-1) ** 2 * v.unsqueeze(2) ** 2).sum(-2) * p / (1 - p)  # (B, H, N, D)
    z = (outs.mean(0) - base).abs() / (var / S).sqrt().clamp_min(1e-12)
    assert z.max() < 6.0, f"dropout mean is off by {z.max():.1f} standard errors"
    assert (outs.std(0) > 0).any()


def test_dropout_keep_rate():
    from attnlab.exact.call import dropout_keep, index_grid

    keep = dropout_keep(99, *index_grid(4, 8, 0, 64, 0, 64, "cpu"), 0.3)
    frac = keep.double().mean().item()
    assert abs(frac - 0.7) < 0.01, frac


# -- the behavioural mask test --------------------------------------------------------------
LEAK_KINDS = ["causal", "window", "padding_empty", "global", "document", "prefix_lm", "key_mask", "random", "random_bool"]


@pytest.mark.parametrize("kind", LEAK_KINDS)
@pytest.mark.parametrize("backend", ["reference", *TORCH_BACKENDS])
def test_masked_keys_do_not_leak(kind, backend):
    B, H, Hkv, N, M_, D = 2, 4, 2, 11, 14, 8
    g = torch.Generator().manual_seed(31)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, dtype=torch.float32, gen=g)
    mask = make_mask(kind, B, H, N, M_, g)

    def fn(q, k, v, mask):
        return attnlab.attention(q, k, v, mask=mask, backend=backend)

    assert leak_test(fn, q, k, v, mask, trials=2) <= 1e-5


def test_masked_keys_do_not_leak_with_bias_function():
    g = torch.Generator().manual_seed(32)
    q, k, v = rand_qkv(1, 2, 9, 8, M=12, Hkv=1, dtype=torch.float32, gen=g)

    def fn(q, k, v, mask, backend):
        return attnlab.attention(q, k, v, mask=mask, bias=lambda b, h, i, j: -0.1 * (i - j).abs(), backend=backend)

    for name in TORCH_BACKENDS:
        assert leak_test(lambda *a, n=name: fn(*a, n), q, k, v, masks.causal() & masks.sliding_window(3, 1), trials=1) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["none", "causal", "random", "global"])
def test_flex_matches_reference(kind, tol):
    B, H, Hkv, N, M_, D = 1, 4, 2, 32, 48, 16
    g = torch.Generator().manual_seed(41)
    q, k, v = rand_qkv(B, H, N, D, M=M_, Hkv=Hkv, dtype=torch.float32, gen=g)
    mask = make_mask(kind, B, H, N, M_, g)
    why = get_backend("flex").verdict(make_call(q, k, v, mask=mask))
    if why is not None:
        pytest.skip(why)
    out = attnlab.attention(q, k, v, mask=mask, backend="flex")
    want = reference(q, k, v, mask=mask).float()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    slope = torch.linspace(0.1, 1.0, H)
    out_b = attnlab.attention(q, k, v, mask=mask, bias=lambda b, h, i, j: -(i - j).abs() * slope[h], backend="flex")
    want_b = reference(q, k, v, mask=mask, bias=lambda b, h, i, j: -(i - j).abs() * slope[h]).float()
    torch.testing.assert_close(out_b, want_b, rtol=1e-4, atol=1e-5)


def test_reference_matches_textbook_float64(naive_attention, tol):
    """The oracle itself against the textbook formula (no empty rows), with GQA."""
    g = torch.Generator().manual_seed(6)
    q, k, v = rand_qkv(2, 6, 7, 5, M=7, Hkv=3, Dv=3, dtype=torch.float64, gen=g)
    torch.testing.assert_close(reference(q, k, v, mask=masks.causal()), naive_attention(q, k, v, masks.causal().dense(7, 7)), **tol(torch.float64))
    torch.testing.assert_close(reference(q, k, v, scale=0.5), naive_attention(q, k, v, None, 0.5), **tol(torch.float64))
    assert math.isfinite(reference(q, k, v).sum().item())
