"""The ``edges`` backend and its kernel: attention on a graph's edges.

The segment softmax against a float64 loop over nodes (isolated nodes, scores of +-1e4),
``edge_attention`` against a loop over edges (multi-edges counted, per-edge bias, weights
edge by edge), float64 ``gradcheck`` of the custom backward, the backend against the dense
path under ``masks.graph`` (the same function in float64, within 1e-6 of it in float32, forward
and gradients), dropout drawn from
attnlab's stream, zeros and zero gradients for nodes without incoming edges, memory O(E),
what ``auto`` and ``explain`` say about the density, and errors that name the argument.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attnlab import attention, masks
from attnlab.exact import backends, edge_attention, explain, make_call, segment_softmax
from attnlab.exact.edges import DENSITY_THRESHOLD
from helpers import gradcheck, rand_qkv, random_edges, tensor_peak_bytes, tol


def softmax_loop(scores: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """Per node, the float64 softmax of the scores of its entries (math.exp, no tensor ops)."""
    out = torch.zeros(scores.shape, dtype=torch.float64)
    flat, res = scores.double().reshape(len(index), -1), out.view(len(index), -1)
    for node in range(n):
        rows = [e for e in range(len(index)) if int(index[e]) == node]
        for c in range(flat.shape[1]):
            vals = [float(flat[e, c]) for e in rows]
            if not vals:
                continue
            top = max(vals)
            ex = [math.exp(x - top) for x in vals]
            for e, x in zip(rows, ex):
                res[e, c] = x / sum(ex)
    return out


def edge_loop(q, k, v, ei, bias, scale, N):
    """``edge_attention`` by its definition: for each of the N targets, a softmax over its incoming edges, in float64."""
    q, k, v = (None if t is None else t.double() for t in (q, k, v))
    H = v.shape[1]
    E = ei.shape[1]
    s = torch.zeros(E, H, dtype=torch.float64)
    for e in range(E):
        j, i = int(ei[0, e]), int(ei[1, e])
        if q is not None:
            s[e] = (q[i] * k[j]).sum(-1) * scale
        if bias is not None:
            s[e] += bias[e].double()
    w = softmax_loop(s, ei[1], N)
    out = torch.zeros(N, H, v.shape[2], dtype=torch.float64)
    for e in range(E):
        out[int(ei[1, e])] += w[e, :, None] * v[int(ei[0, e])]
    return out, w


def test_segment_softmax_matches_a_float64_loop_with_isolated_nodes():
    g = torch.Generator().manual_seed(0)
    ei = random_edges(9, 11, seed=1, isolated=2)
    s = torch.randn(ei.shape[1], 3, generator=g)
    got = segment_softmax(s, ei[1], 11)
    torch.testing.assert_close(got.double(), softmax_loop(s, ei[1], 11), **tol(torch.float32))
    sums = torch.zeros(11, 3, dtype=torch.float64).index_add_(0, ei[1], got.double())
    has = torch.bincount(ei[1], minlength=11) > 0
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]), **tol(torch.float32))


def test_segment_softmax_survives_float32_extremes():
    # one node sees +1e4 and -1e4, one sees equal huge scores, one a lone -1e4, one -inf and a finite score
    index = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    s = torch.tensor([1e4, -1e4, 1e4 - 1.0, 1e4, 1e4, -1e4, float("-inf"), -3.0])
    got = segment_softmax(s, index, 5)
    want = softmax_loop(s.double().masked_fill(torch.isinf(s), -1e300), index, 5)  # -inf: a vanishing score
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, **tol(torch.float32))
    allinf = segment_softmax(torch.full((2,), float("-inf")), torch.tensor([1, 1]), 3)
    assert torch.equal(allinf, torch.zeros(2))  # a node whose every edge is -inf gets zeros, not NaN


@pytest.mark.parametrize("with_qk", [True, False])
@pytest.mark.parametrize("n_src,n_dst", [(13, 13), (7, 19), (19, 7), (1, 1)])
def test_edge_attention_matches_its_definition(with_qk, n_src, n_dst):
    ei = random_edges(n_src, n_dst, seed=n_src * 3 + n_dst, isolated=2)  # duplicates count twice here
    g = torch.Generator().manual_seed(2)
    H, D, Dv = 3, 5, 4
    q = torch.randn(n_dst, H, D, generator=g) if with_qk else None
    k = torch.randn(n_src, H, D, generator=g) if with_qk else None
    v = torch.randn(n_src, H, Dv, generator=g)
    bias = torch.randn(ei.shape[1], H, generator=g)
    out, w = edge_attention(q, k, v, ei, num_nodes=(n_src, n_dst), bias=bias, return_weights=True)
    want_out, want_w = edge_loop(q, k, v, ei, bias, D ** -0.5, n_dst)
    assert out.shape == (n_dst, H, Dv) and w.shape == (ei.shape[1], H)
    torch.testing.assert_close(out.double(), want_out, **tol(torch.float32))
    torch.testing.assert_close(w.double(), want_w, **tol(torch.float32))
    isolated = torch.bincount(ei[1], minlength=n_dst) == 0
    assert torch.equal(out[isolated], torch.zeros_like(out[isolated]))


def test_edge_attention_gradcheck_float64():
    ei = random_edges(6, 5, seed=3, isolated=1)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 2, 3, generator=g, dtype=torch.float64)
    k = torch.randn(6, 2, 3, generator=g, dtype=torch.float64)
    v = torch.randn(6, 2, 4, generator=g, dtype=torch.float64)
    b = torch.randn(ei.shape[1], 2, generator=g, dtype=torch.float64)

    def fn(q, k, v, b):
        out, w = edge_attention(q, k, v, ei, bias=b, return_weights=True)
        return out, w  # the weights are an output too: their gradient flows back through the softmax

    assert gradcheck(fn, (q, k, v, b))
    assert gradcheck(lambda v, b: edge_attention(None, None, v, ei, num_nodes=(6, 5), bias=b), (v, b))


def test_attention_through_the_edges_backend_gradcheck_float64():
    n = 6
    mask = masks.graph(random_edges(n, seed=4), num_nodes=n) & masks.causal()
    q, k, v = rand_qkv(2, 2, n, 3, Hkv=1, seed=5)
    bias = torch.randn(1, 2, n, n, dtype=torch.float64)
    assert gradcheck(lambda q, k, v, b: attention(q, k, v, mask=mask, bias=b, backend="edges"), (q, k, v, bias))


CASES = {  # (B, H, Hkv, N targets, M sources, D, self_loops)
    "square": (1, 8, 8, 97, 97, 16, True),
    "no_loops": (2, 3, 3, 61, 61, 40, False),
    "bipartite": (1, 4, 2, 33, 80, 24, True),
    "gqa_cross": (2, 9, 3, 40, 17, 8, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_edges_backend_equals_the_dense_path(case):
    """float64: the same function as math and chunked under the graph's dense mask (1e-12); float32: within 1e-6
    of that dense function (the outputs absolutely, the gradients relative to their largest entry; math's own
    float32 error is larger, up to 1e-6 here, so two float32 results may differ by twice that)."""
    B, H, Hkv, N, M, D, loops = CASES[case]
    ei = random_edges(M, N, seed=N + M, isolated=3, self_loops=loops)
    mask = masks.graph(ei, num_nodes=(M, N))
    w = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(9), dtype=torch.float64)

    def run(backend, dtype):
        q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, dtype=dtype, seed=6, requires_grad=True)
        out = attention(q, k, v, mask=mask, backend=backend)
        return (out, *torch.autograd.grad((out.double() * w).sum(), (q, k, v)))

    got64 = run("edges", torch.float64)
    for dense in ("math", "chunked"):
        for a, b in zip(got64, run(dense, torch.float64)):
            torch.testing.assert_close(a, b, **tol(torch.float64))
    got32 = run("edges", torch.float32)
    for a, b in zip(got32, got64):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-6 * max(1.0, b.abs().max().item()))
    out, dq = got32[0], got32[1]
    isolated = torch.bincount(ei[1], minlength=N) == 0
    assert isolated.any()
    assert torch.equal(out[:, :, isolated], torch.zeros_like(out[:, :, isolated]))
    assert torch.equal(dq[:, :, isolated], torch.zeros_like(dq[:, :, isolated]))  # zero gradients


@settings(max_examples=25, deadline=None)
@example(n_src=1, n_dst=3, per=0, heads=1, kv=1, seed=188, loops=True)  # more isolated targets than shared ids
@given(n_src=st.integers(1, 30), n_dst=st.integers(1, 30), per=st.integers(0, 5), heads=st.integers(1, 3),
       kv=st.sampled_from([1, None]), seed=st.integers(0, 2**16), loops=st.sampled_from([True, False, None]))
def test_random_graphs_equal_the_reference(n_src, n_dst, per, heads, kv, seed, loops):
    """Property: on any graph (empty, isolated targets, duplicates, bipartite), edges == the float64 oracle."""
    ei = random_edges(n_src, n_dst, edges=per * n_dst, seed=seed, isolated=seed % 3, self_loops=loops)
    mask = masks.graph(ei, num_nodes=(n_src, n_dst))
    q, k, v = rand_qkv(1, heads, n_dst, 4, M=n_src, Hkv=kv, seed=seed)
    torch.testing.assert_close(attention(q, k, v, mask=mask, backend="edges"),
                               attention(q, k, v, mask=mask, backend="reference"), **tol(torch.float64))


def test_weights_bias_and_dropout_follow_the_math_backend():
    n = 20
    mask = masks.graph(random_edges(n, seed=7), num_nodes=n)
    q, k, v = rand_qkv(2, 3, n, 8, seed=8)
    bias = torch.randn(2, 1, n, n, dtype=torch.float64)
    alibi = lambda b, h, i, j: -0.5 * (h + 1) * (i - j).abs()  # noqa: E731  a bias function of the indices
    for kw in ({"bias": bias}, {"bias": alibi}, {"dropout_p": 0.3}):
        call = make_call(q, k, v, mask=mask, return_weights=True, dropout_seed=11, **kw)
        out, wts = backends()["edges"].forward(call)
        ref, ref_w = backends()["math"].forward(call)
        torch.testing.assert_close(out, ref, **tol(torch.float64))
        torch.testing.assert_close(wts, ref_w, **tol(torch.float64))


def test_auto_takes_edges_for_sparse_graphs_and_explain_says_why():
    n = 512
    q, k, v = rand_qkv(1, 4, n, 32, dtype=torch.float32, seed=9)
    sparse = masks.graph(random_edges(n, edges=4 * n, seed=1), num_nodes=n)
    verdicts = {x.backend: x for x in explain(q, k, v, mask=sparse)}
    assert verdicts["edges"].chosen
    assert "dense), below the" in verdicts["edges"].note and f"{DENSITY_THRESHOLD:.0%}" in verdicts["edges"].note
    dense = masks.graph(random_edges(n, edges=n * n // 2, seed=2), num_nodes=n)  # about 40% of the pairs
    verdicts = {x.backend: x for x in explain(q, k, v, mask=dense)}
    assert not verdicts["edges"].chosen and "above the" in verdicts["edges"].note
    assert "needs a graph mask" in verdicts_for(q, masks.causal())["edges"].reason


def verdicts_for(q, mask):
    return {x.backend: x for x in explain(q, q, q, mask=mask)}


def test_training_memory_grows_with_edges_not_with_n_squared():
    n, H, D = 4096, 4, 16  # N x N x H float32 scores alone would be 256 MiB
    q, k, v = rand_qkv(1, H, n, D, dtype=torch.float32, seed=10)

    def step(edges):
        mask = masks.graph(random_edges(n, edges=edges, seed=edges), num_nodes=n)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        return tensor_peak_bytes(lambda: attention(*leaves, mask=mask, backend="edges").sum().backward())

    small, large = step(8 * n), step(32 * n)
    assert large < 32 * 2**20, large  # far below one N x N matrix per head
    per_edge = (large - small) / (24 * n)
    assert per_edge < 30 * H * 4, per_edge  # a few (E, H) float32 buffers per edge, no (E, H, D) ones


@pytest.mark.parametrize("call,match", [
    (lambda v, ei: edge_attention(None, None, v, ei, bias=torch.zeros(4, 2)), r"bias must have shape \(E, H\)=\(3, 2\)"),
    (lambda v, ei: edge_attention(None, None, v[:, 0], ei), r"v must be a floating-point \(nodes, heads, dim\)"),
    (lambda v, ei: edge_attention(v, None, v, ei), r"pass q and k together"),
    (lambda v, ei: edge_attention(v[:3], v, v, ei), r"target node id 3 .* q's rows \(3 targets\)"),
    (lambda v, ei: edge_attention(v[:3], v, v, ei, num_nodes=2), r"num_nodes gives 2 target nodes but q has 3 rows"),
    (lambda v, ei: edge_attention(None, None, v, ei.float()), r"edge_index must hold integer node ids"),
    (lambda v, ei: edge_attention(None, None, v, ei, num_nodes=(9, 5)), r"num_nodes gives 9 source nodes"),
    (lambda v, ei: edge_attention(None, None, v[:4], ei), r"edge_index holds source node id"),
])
def test_bad_arguments_are_named(call, match):
    ei = torch.tensor([[0, 4, 2], [1, 1, 3]])
    v = torch.randn(5, 2, 4)
    with pytest.raises(ValueError, match=match):
        call(v, ei)


@pytest.mark.slow
def test_a_gat_layer_on_two_million_edges_trains_within_2_gib():
    from attnlab.layers import GATConv

    n, e = 100_000, 2_000_000
    g = torch.Generator().manual_seed(0)
    ei = torch.stack([torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)])
    x = torch.randn(n, 64, generator=g)
    conv = GATConv(64, 8, heads=8, dropout=0.6).train()
    peak = tensor_peak_bytes(lambda: conv(x, ei).sum().backward())
    assert peak < 2 * 2**30, f"{peak / 2**30:.2f} GiB"
    assert conv.att_src.grad is not None and torch.isfinite(conv.att_src.grad).all()
