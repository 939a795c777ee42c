"""Gradients of attnlab.attention: every torch backend against ``math`` in float64.

``math`` in float64 is the gradient oracle (itself checked with ``gradcheck``). The
``chunked`` backend has a custom backward, so it gets ``gradcheck`` with small tiles
(several EMPTY / PARTIAL / FULL tiles), masks with fully masked rows, grouped-query
heads, bias tensors, bias functions over an ``nn.Parameter``, and dropout.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnlab
from attnlab import masks
from attnlab.exact import chunked_attention, get_backend, make_call, plan_tiles

DT = torch.float64
GRAD_BACKENDS = ["chunked", "sdpa"]


def leaves(g, B, H, Hkv, N, M_, D, Dv=None):
    Dv = D if Dv is None else Dv
    q = torch.randn(B, H, N, D, generator=g, dtype=DT).requires_grad_()
    k = torch.randn(B, Hkv, M_, D, generator=g, dtype=DT).requires_grad_()
    v = torch.randn(B, Hkv, M_, Dv, generator=g, dtype=DT).requires_grad_()
    return q, k, v


def random_mask(g, B, H, N, M_):
    a = torch.rand(B, H, N, M_, generator=g) > 0.5
    a[:, :, 0] = False  # fully masked rows
    a[0, -1, -1] = False
    return masks.dense(a)


def run(fn, inputs, gout):
    """Output and gradients of ``(fn() * gout).sum()`` w.r.t. ``inputs`` (zeros where unused)."""
    for t in inputs:
        t.grad = None
    out = fn()
    (out * gout).sum().backward()
    return out.detach(), [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in inputs]


# (B, H, Hkv, N, M, D, Dv, mask kind, bias kind)
CASES = [
    (1, 4, 1, 17, 17, 8, 8, "causal", None),
    (2, 6, 2, 13, 21, 8, 5, "random", "1HNM"),
    (2, 3, 3, 9, 30, 6, 6, "padding_empty", "B11M"),
    (1, 2, 2, 1, 9, 4, 4, "causal", "NM"),
    (1, 6, 2, 23, 23, 8, 8, "window", "fn"),
    (1, 2, 1, 20, 11, 8, 8, "causal", "fn"),  # N > M: empty first rows
]


def _mask(kind, g, B, H, N, M_):
    return {
        "causal": lambda: masks.causal(),
        "random": lambda: random_mask(g, B, H, N, M_),
        "padding_empty": lambda: masks.padding([0] + [M_ - 3] * (B - 1)),
        "window": lambda: masks.sliding_window(3, 2) | masks.global_tokens([0]),
    }[kind]()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[7]}-{c[8]}-N{c[3]}M{c[4]}")
def test_gradients_match_math_float64(case):
    B, H, Hkv, N, M_, D, Dv, mask_kind, bias_kind = case
    g = torch.Generator().manual_seed(N * 31 + M_)
    q, k, v = leaves(g, B, H, Hkv, N, M_, D, Dv)
    mask = _mask(mask_kind, g, B, H, N, M_)
    inputs = [q, k, v]
    bias = None
    slope = nn.Parameter(torch.rand(H, dtype=DT, generator=g) + 0.1)
    if bias_kind == "fn":

        def bias(b, h, i, j):
            return -(i - j).abs().to(DT) * slope[h]

        inputs.append(slope)
    elif bias_kind is not None:
        shape = {"1HNM": (1, H, N, M_), "B11M": (B, 1, 1, M_), "NM": (N, M_)}[bias_kind]
        bias = torch.randn(shape, generator=g, dtype=DT).requires_grad_()
        inputs.append(bias)
    gout = torch.randn(B, H, N, Dv, generator=g, dtype=DT)
    want_out, want_grads = run(lambda: attnlab.attention(q, k, v, mask=mask, bias=bias, backend="math"), inputs, gout)
    allowed = mask.dense(N, M_, batch=B, heads=H).expand(B, H, N, M_)
    empty = ~allowed.any(-1)  # (B, H, N)
    for w in want_grads:
        assert torch.isfinite(w).all()
    assert (want_grads[0][empty] == 0).all()
    fns = {name: (lambda n=name: attnlab.attention(q, k, v, mask=mask, bias=bias, backend=n)) for name in GRAD_BACKENDS}
    fns["chunked_tiles"] = lambda: chunked_attention(make_call(q, k, v, mask=mask, bias=bias), block_q=4, block_k=8)
    for name, fn in fns.items():
        out, grads = run(fn, inputs, gout)
        torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n} forward: {m}")
        for t_name, got, want in zip(["q", "k", "v", "bias"], grads, want_grads):
            assert torch.isfinite(got).all(), f"{name}: d{t_name} has NaN/Inf"
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=lambda m, n=name, t=t_name: f"{n} d{t}: {m}")
        assert (grads[0][empty] == 0).all(), f"{name}: fully masked rows must get zero dq"


def test_math_gradcheck():
    """The oracle's own gradients against finite differences."""
    g = torch.Generator().manual_seed(1)
    q, k, v = leaves(g, 1, 4, 2, 5, 7, 3)
    bias = torch.randn(1, 4, 1, 7, generator=g, dtype=DT).requires_grad_()
    mask = random_mask(g, 1, 4, 5, 7)
    assert torch.autograd.gradcheck(lambda q, k, v, b: attnlab.attention(q, k, v, mask=mask, bias=b, backend="math"), (q, k, v, bias))


def _chunked(mask=None, bias_fn=None, dropout_p=0.0, seed=0, bq=4, bk=8):
    def fn(q, k, v, bias=None):
        b = bias if bias is not None else bias_fn
        call = make_call(q, k, v, mask=mask, bias=b, dropout_p=dropout_p, dropout_seed=seed)
        return chunked_attention(call, block_q=bq, block_k=bk)

    return fn


GRADCHECK = {
    "causal_gqa": dict(shape=(1, 4, 2, 9, 13, 3), mask=masks.causal()),
    "random_empty_rows": dict(shape=(1, 2, 1, 7, 12, 2), mask="random"),
    "n_gt_m": dict(shape=(1, 2, 2, 11, 6, 3), mask=masks.causal()),
    "bias_tensor": dict(shape=(2, 2, 1, 6, 11, 2), mask=masks.sliding_window(3, 4), bias=(1, 2, 6, 11)),
    "bias_b11m": dict(shape=(2, 2, 2, 5, 9, 2), mask=masks.padding([0, 6]), bias=(2, 1, 1, 9)),
    "dropout": dict(shape=(1, 4, 2, 7, 11, 2), mask=masks.causal() | masks.global_tokens([2]), dropout_p=0.3),
    "dropout_bias": dict(shape=(1, 2, 1, 7, 10, 2), mask=None, dropout_p=0.5, bias=(1, 2, 7, 10)),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_chunked_gradcheck(name):
    spec = GRADCHECK[name]
    B, H, Hkv, N, M_, D = spec["shape"]
    g = torch.Generator().manual_seed(3)
    q, k, v = leaves(g, B, H, Hkv, N, M_, D)
    mask = random_mask(g, B, H, N, M_) if spec["mask"] == "random" else spec["mask"]
    fn = _chunked(mask=mask, dropout_p=spec.get("dropout_p", 0.0), seed=42)
    inputs = [q, k, v]
    if "bias" in spec:
        inputs.append(torch.randn(spec["bias"], generator=g, dtype=DT).requires_grad_())
    assert torch.autograd.gradcheck(fn, tuple(inputs))
    # the tiling really ran several tiles
    plan = plan_tiles(make_call(q, k, v, mask=mask), 4, 8)
    assert len(plan.kinds) * len(plan.kinds[0]) > 1


def test_chunked_gradcheck_bias_function_parameter():
    """A bias function closing over a Parameter: its .grad comes from a nested backward."""
    g = torch.Generator().manual_seed(4)
    q, k, v = leaves(g, 1, 3, 1, 7, 11, 3)
    slope = nn.Parameter(torch.rand(3, dtype=DT, generator=g) + 0.1)

    def alibi(b, h, i, j):
        return -(i - j).abs().to(DT) * slope[h]

    gout = torch.randn(1, 3, 7, 3, generator=g, dtype=DT)
    fn = _chunked(mask=masks.causal(), bias_fn=alibi)
    _, (gq, gs) = run(lambda: fn(q, k, v), [q, slope], gout)
    _, (wq, ws) = run(lambda: attnlab.attention(q, k, v, mask=masks.causal(), bias=alibi, backend="math"), [q, slope], gout)
    torch.testing.assert_close(gs, ws, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(gq, wq, rtol=1e-9, atol=1e-10)
    # finite differences on the parameter itself
    eps = 1e-6
    num = torch.zeros_like(ws)
    with torch.no_grad():
        for h in range(3):
            for sgn in (1, -1):
                slope[h] += sgn * eps
                num[h] += sgn * (fn(q, k, v) * gout).sum() / (2 * eps)
                slope[h] -= sgn * eps
    torch.testing.assert_close(gs, num, rtol=1e-6, atol=1e-7)


def test_chunked_bias_function_parameter_only():
    g = torch.Generator().manual_seed(5)
    q, k, v = (t.detach() for t in leaves(g, 1, 2, 1, 6, 9, 3))
    slope = nn.Parameter(torch.rand(2, dtype=DT, generator=g) + 0.1)

    def alibi(b, h, i, j):
        return -(i - j).abs().to(DT) * slope[h]

    want = torch.autograd.grad(attnlab.attention(q, k, v, mask=masks.causal(), bias=alibi, backend="math").sum(), slope)[0]
    out = attnlab.attention(q, k, v, mask=masks.causal(), bias=alibi, backend="chunked")
    out.sum().backward()
    torch.testing.assert_close(slope.grad, want)


@pytest.mark.parametrize("backend", ["math", "chunked", "sdpa"])
def test_fully_masked_rows_give_zero_not_nan_gradients(backend):
    g = torch.Generator().manual_seed(6)
    for dtype in (torch.float32, DT):
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in leaves(g, 2, 4, 2, 6, 8, 5))
        mask = masks.padding([0, 8]) & masks.causal()  # batch 0: every row empty
        bias = torch.zeros(1, 4, 6, 8, dtype=dtype).index_fill_(2, torch.tensor([3]), float("-inf")).requires_grad_()
        out = attnlab.attention(q, k, v, mask=mask, bias=bias, backend=backend)
        out.sum().backward()
        for name, t in (("q", q), ("k", k), ("v", v), ("bias", bias)):
            assert torch.isfinite(t.grad).all(), f"{backend} {dtype}: d{name} has NaN/Inf"
        assert (out[0] == 0).all() and (out[:, :, 3] == 0).all()
        assert (q.grad[0] == 0).all() and (k.grad[0] == 0).all() and (v.grad[0] == 0).all()
        assert (q.grad[:, :, 3] == 0).all()
        assert (q.grad[1, :, :3] != 0).any()


@pytest.mark.parametrize("mask", [None, masks.causal(), masks.sliding_window(2, 5) & masks.padding([9, 4])], ids=["none", "causal", "window_pad"])
def test_chunked_dropout_matches_math_dropout(mask):
    g = torch.Generator().manual_seed(7)
    q, k, v = leaves(g, 2, 6, 3, 11, 13, 4)
    bias = torch.randn(1, 6, 11, 13, generator=g, dtype=DT).requires_grad_()
    gout = torch.randn(2, 6, 11, 4, generator=g, dtype=DT)
    inputs = [q, k, v, bias]

    def via(backend):
        call = make_call(q, k, v, mask=mask, bias=bias, dropout_p=0.4, dropout_seed=2024)
        return get_backend(backend).forward(call)[0]

    want_out, want = run(lambda: via("math"), inputs, gout)
    for name, fn in (("chunked", lambda: via("chunked")),
                     ("tiles", lambda: chunked_attention(make_call(q, k, v, mask=mask, bias=bias, dropout_p=0.4, dropout_seed=2024), 4, 8))):
        out, got = run(fn, inputs, gout)
        torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
        for t_name, a, b in zip("qkvb", got, want):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m, n=name, t=t_name: f"{n} d{t}: {m}")
    no_drop, _ = run(lambda: attnlab.attention(q, k, v, mask=mask, bias=bias, backend="math"), inputs, gout)
    assert not torch.allclose(no_drop, want_out)


def test_chunked_bias_function_parameter_autograd_grad():
    g = torch.Generator().manual_seed(8)
    q, k, v = leaves(g, 1, 2, 1, 6, 9, 3)
    slope = nn.Parameter(torch.rand(2, dtype=DT, generator=g) + 0.1)

    def alibi(b, h, i, j):
        return -(i - j).abs().to(DT) * slope[h]

    want = torch.autograd.grad(attnlab.attention(q, k, v, mask=masks.causal(), bias=alibi, backend="math").sum(), slope)[0]
    out = attnlab.attention(q, k, v, mask=masks.causal(), bias=alibi, backend="chunked")
    got = torch.autograd.grad(out.sum(), slope, allow_unused=True)[0]
    assert got is not None
    torch.testing.assert_close(got, want)
