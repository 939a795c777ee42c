"""attnlab.exact.native and edges on inputs ``attention()`` accepts that are easy to get wrong.

Empty batches (forward and backward), NaN and inf scores (they propagate as in the float64
``math`` backend: a row that sees a NaN or +inf score is NaN, a masked one does not count),
row strides below the head dim (an expanded tensor, the ``dout`` of ``out.sum(2)``), transposed
views, zero and negative ``scale`` (with a relative bias and its gradient), double backward
(``create_graph=True``: right through native, a clear error through edges), the segment
softmax's backward, and what ``auto`` pays to cost the kernel on a graph mask.
"""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.exact import choose_backend, native, native_build, native_layout, segment_softmax
from helpers import rand_qkv, random_edges, tol

pytestmark = pytest.mark.skipif(
    native_build.brgemm_signature() is not None or native_build._compiler() is None,
    reason="no C++ compiler or no float32 brgemm in this torch: the kernel cannot be built here")


def _math64(q, k, v, **kw):
    """float64 output and gradients of ``math`` (the oracle) with ``w`` the output's weights."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    return q64, k64, v64, attnlab.attention(q64, k64, v64, backend="math", **kw)


def _grads(out, inputs, w):
    return torch.autograd.grad((out.double() * w).sum(), inputs)


def test_an_empty_batch_gives_empty_outputs_and_gradients():
    q, k, v = rand_qkv(0, 4, 70, 16, M=90, Hkv=2, dtype=torch.float32, requires_grad=True)
    for mask in (None, masks.causal()):
        out = attnlab.attention(q, k, v, mask=mask, backend="native")
        assert out.shape == (0, 4, 70, 16)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("what", ["nan_query", "inf_query", "nan_key", "neg_inf_key_row"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "global_window"])
def test_nan_and_inf_propagate_as_in_math(what, mask_kind):
    q, k, v = rand_qkv(2, 2, 70, 16, M=130, dtype=torch.float32, seed=3)
    if what == "nan_query":
        q[0, 1, 5, 3] = float("nan")
    elif what == "inf_query":
        q[1, 0, 66, 0] = float("inf")
    elif what == "nan_key":
        k[0, 0, 100, 2] = float("nan")  # rows that may see key 100 are NaN, the others are not
    else:
        k[1, 1, 7] = float("-inf")
        q[1, 1, :, :] = q[1, 1].abs()  # key 7's scores are -inf: it counts as masked
    mask = {"none": None, "causal": masks.causal(), "global_window": masks.sliding_window(20) |
            masks.global_tokens([0])}[mask_kind]
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=mask, backend="native")
    q64, k64, v64, ref = _math64(q, k, v, mask=mask)
    assert torch.isnan(ref).any() or what == "neg_inf_key_row"
    torch.testing.assert_close(out.double(), ref, equal_nan=True, **tol(torch.float32))
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got, want = _grads(out, (qg, kg, vg), w), _grads(ref, (q64, k64, v64), w)
    seen = torch.isnan(ref).any(-1)  # (B, H, N): rows that saw a NaN or +inf score
    assert bool(torch.isnan(got[0]).all(-1)[seen].all())  # their dq is NaN
    for a, b in zip(got, want):  # and every finite gradient of math's is the kernel's (math's matmuls give
        # 0 * NaN = NaN for masked pairs too, the kernel skips them)
        fin = torch.isfinite(b)
        assert not torch.isnan(a[fin]).any()
        torch.testing.assert_close(a.double()[fin], b[fin], **tol(torch.float32, loose=True))


def _stride_cases():
    x = torch.randn(2, 3, 1, 24, generator=torch.Generator().manual_seed(0))
    wide = torch.randn(2, 3, 24, 70, generator=torch.Generator().manual_seed(1))
    base = torch.randn(2 * 3 * 80 * 12 + 12, generator=torch.Generator().manual_seed(2))
    return {
        "expanded_rows": x.expand(2, 3, 70, 24),  # row stride 0
        "transposed": wide.transpose(-1, -2),  # last stride 70
        "overlapping_rows": base.as_strided((2, 3, 70, 24), (3 * 80 * 12, 80 * 12, 12, 1)),  # row stride 12 < D
    }


@pytest.mark.parametrize("case", list(_stride_cases()))
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_every_stride_pattern_equals_a_contiguous_copy(case, which):
    q, k, v = rand_qkv(2, 3, 70, 24, dtype=torch.float32, seed=4)
    t = _stride_cases()[case]
    q, k, v = (t if n == which else x for n, x in zip("qkv", (q, k, v)))
    qg, kg, vg = (x.clone().requires_grad_() if x is not t else x.requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=masks.causal(), backend="native")
    q64, k64, v64, ref = _math64(q, k, v, mask=masks.causal())
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for a, b in zip(_grads(out, (qg, kg, vg), w), _grads(ref, (q64, k64, v64), w)):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))


@pytest.mark.parametrize("reduce", ["sum_rows", "expand"])
def test_a_broadcast_dout_is_right(reduce):
    """``out.sum(2)``'s gradient reaches the kernel as a (B, H, N, D) view with row stride 0."""
    q, k, v = rand_qkv(1, 2, 80, 32, dtype=torch.float32, seed=5)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=masks.causal(), backend="native")
    q64, k64, v64, ref = _math64(q, k, v, mask=masks.causal())
    if reduce == "sum_rows":
        got, want = torch.autograd.grad(out.sum(2).sum(), (qg, kg, vg)), \
            torch.autograd.grad(ref.sum(2).sum(), (q64, k64, v64))
    else:
        do = torch.randn(1, 2, 1, 32).expand(1, 2, 80, 32)
        got, want = torch.autograd.grad(out, (qg, kg, vg), do), torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))


@pytest.mark.parametrize("scale", [0.0, -0.3, -2.0])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "global_window"])
def test_zero_and_negative_scale_equal_math(scale, mask_kind):
    """Logits spread past 88 (where 2^x leaves float32): judged against float32 math's own error."""
    q, k, v = rand_qkv(2, 2, 70, 16, M=130, dtype=torch.float32, seed=6, scale=2.0)
    mask = {"none": None, "causal": masks.causal(), "global_window": masks.sliding_window(20) |
            masks.global_tokens([0])}[mask_kind]
    w = torch.randn(2, 2, 70, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    res = []
    for backend, dt in (("native", torch.float32), ("math", torch.float32), ("math", torch.float64)):
        qg, kg, vg = (x.detach().to(dt).requires_grad_() for x in (q, k, v))
        out = attnlab.attention(qg, kg, vg, mask=mask, scale=scale, backend=backend)
        res.append([out.detach().double(), *(g.double() for g in _grads(out, (qg, kg, vg), w))])
    for what, got, plain, want in zip(("out", "dq", "dk", "dv"), *res):
        err, plain_err = float((got - want).abs().max()), float((plain - want).abs().max())
        assert err <= 8 * plain_err + 1e-6, (what, err, plain_err)  # the kernel works in log2 units: its own rounding


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_a_relative_bias_gradient_at_zero_and_negative_scale(scale):
    from attnlab.positional import T5RelativeBias

    torch.manual_seed(0)
    pos = T5RelativeBias(2)
    q, k, v = rand_qkv(1, 2, 90, 16, dtype=torch.float32, seed=7, requires_grad=True)
    out = attnlab.attention(q, k, v, mask=masks.causal(), bias=pos.bias_fn(90, 90), scale=scale, backend="native")
    got = torch.autograd.grad(out.sum(), (*pos.parameters(),))
    ref_pos = T5RelativeBias(2).double()
    ref_pos.load_state_dict(pos.state_dict())
    q64, k64, v64 = (x.detach().double() for x in (q, k, v))
    ref = attnlab.attention(q64, k64, v64, mask=masks.causal(), bias=ref_pos.bias_fn(90, 90), scale=scale,
                            backend="math")
    want = torch.autograd.grad(ref.sum(), (*ref_pos.parameters(),))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))


def test_double_backward_through_native_equals_math():
    """A gradient penalty: d/dq of |d out / d v|^2 needs the backward's own graph (create_graph=True)."""
    q, k, v = rand_qkv(1, 2, 40, 8, M=50, dtype=torch.float32, seed=8)
    results = []
    for backend, dt in (("native", torch.float32), ("math", torch.float64)):
        qg, kg, vg = (x.detach().to(dt).requires_grad_() for x in (q, k, v))
        out = attnlab.attention(qg, kg, vg, mask=masks.causal(), backend=backend)
        (gv,) = torch.autograd.grad(out.pow(2).sum(), (vg,), create_graph=True)
        results.append(torch.autograd.grad(gv.pow(2).sum(), (qg, kg)))
    for a, b in zip(*results):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))


def test_double_backward_through_edges_is_a_clear_error():
    ei = random_edges(30, seed=1)
    q, k, v = rand_qkv(1, 2, 30, 8, dtype=torch.float32, seed=9, requires_grad=True)
    out = attnlab.attention(q, k, v, mask=masks.graph(ei, num_nodes=30), backend="edges")
    (gq,) = torch.autograd.grad(out.pow(2).sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (out.sum() + gq.pow(2).sum()).backward()  # a gradient penalty


def test_segment_softmax_backward_equals_autograd_of_the_formula():
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([2, 0, 2, 2, 0, 3, 3, 3, 3])  # node 1 has no entry
    scores = torch.randn(9, 4, generator=g, dtype=torch.float64)
    scores[5:, 1] = float("-inf")  # a group of -inf scores gives zeros
    x = scores.clone().requires_grad_()
    w = torch.randn(9, 4, generator=g, dtype=torch.float64)
    (got,) = torch.autograd.grad((segment_softmax(x, index, 4) * w).sum(), (x,))
    y = scores.clone().requires_grad_()
    dense = torch.full((4, 9, 4), float("-inf"), dtype=torch.float64).index_put(
        (index, torch.arange(9)), y)  # (nodes, entries, F): each node's entries, -inf elsewhere
    sm = torch.nan_to_num(torch.softmax(dense, 1), nan=0.0)[index, torch.arange(9)]  # (E, F)
    (want,) = torch.autograd.grad((sm * w).sum(), (y,))
    torch.testing.assert_close(got, torch.nan_to_num(want), **tol(torch.float64))
    assert torch.autograd.gradcheck(lambda s: segment_softmax(s, index, 4), (scores[:, :1].clone().requires_grad_(),))


def test_auto_costs_the_kernel_on_a_graph_without_building_its_bit_tiles(monkeypatch):
    """A graph has no row intervals: costing the kernel must not evaluate the mask on every tile's 4,096 pairs."""
    n = 3000
    ei = random_edges(n, seed=2)
    mask = masks.graph(ei, num_nodes=n)
    q, k, v = rand_qkv(1, 2, n, 16, dtype=torch.float32, seed=1)

    def refuse(*a, **kw):
        raise AssertionError("costing built the kernel's bit tiles")

    monkeypatch.setattr(native_layout, "_bit_tiles", refuse)
    assert choose_backend(q, k, v, mask=mask) == "edges"
    est = native.native_estimate(attnlab.exact.make_call(q, k, v, mask=mask))
    assert est > 0
