"""masks.graph against its definition: node i may attend to node j for each edge j -> i.

``dense`` against a loop over the edge list (duplicates collapse), ``allows`` on broadcast
indices, ``block_kinds`` against the tiles of the dense matrix, composition with the other
masks, ``chunked`` skipping the empty tiles, the sorted forms the ``edges`` backend reads,
and bad arguments with errors that name them.
"""

from __future__ import annotations

import pytest
import torch

from attnlab import attention, masks
from attnlab.exact import make_call, plan_tiles
from attnlab.exact.edges import graph_part
from attnlab.masks import EMPTY, FULL, PARTIAL
from helpers import rand_qkv, random_edges, tol


def brute(edge_index: torch.Tensor, n_dst: int, n_src: int) -> torch.Tensor:
    out = torch.zeros(n_dst, n_src, dtype=torch.bool)
    for j, i in edge_index.t().tolist():
        out[i, j] = True  # edge j -> i: target i attends to source j
    return out


CASES = [(9, 9), (1, 1), (7, 23), (23, 7), (64, 64)]


@pytest.mark.parametrize("n_src,n_dst", CASES)
@pytest.mark.parametrize("loops", [True, False])
def test_dense_and_allows_follow_the_edge_list(n_src, n_dst, loops):
    ei = random_edges(n_src, n_dst, seed=n_src + n_dst, self_loops=loops)
    g = masks.graph(ei, num_nodes=(n_src, n_dst))
    want = brute(ei, n_dst, n_src)
    assert torch.equal(g.dense(n_dst, n_src)[0, 0], want)
    q = torch.arange(n_dst).view(1, 1, -1, 1)
    k = torch.arange(n_src).view(1, 1, 1, -1)
    assert torch.equal(g.allows(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), q, k, n_dst, n_src)[0, 0], want)
    assert torch.equal(g.tile(1, n_dst, 0, n_src, n_dst, n_src)[0, 0], want[1:])
    assert g.has_empty_rows(n_dst, n_src) == bool((~want.any(-1)).any())


def test_square_graph_without_num_nodes_takes_the_call_size():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    g = masks.graph(ei)
    assert torch.equal(g.dense(5, 5)[0, 0], brute(ei, 5, 5))  # nodes 3 and 4 are isolated


@pytest.mark.parametrize("block", [(1, 1), (4, 4), (7, 13), (13, 7), (16, 64)])
def test_block_kinds_are_the_tiles_of_the_dense_mask(block):
    n = 40
    # a block-diagonal graph (two clusters, one complete): EMPTY, FULL and PARTIAL tiles all occur
    full = [(j, i) for i in range(16) for j in range(16)]
    sparse = [(int(j), int(i)) for j, i in random_edges(24, seed=3, isolated=0, self_loops=None).t() + 16]
    ei = torch.tensor(full + sparse).t()
    g = masks.graph(ei, num_nodes=n)
    d = g.dense(n, n)[0, 0]
    bq, bk = block
    got = g.block_kinds(n, n, bq, bk)[0, 0]
    for a in range(got.shape[0]):
        for b in range(got.shape[1]):
            t = d[a * bq:(a + 1) * bq, b * bk:(b + 1) * bk]
            want = FULL if bool(t.all()) else PARTIAL if bool(t.any()) else EMPTY
            assert int(got[a, b]) == want, (a, b)


def test_graph_composes_with_other_masks():
    n = 12
    ei = random_edges(n, seed=5)
    g = masks.graph(ei, num_nodes=n)
    d = brute(ei, n, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.equal((g & masks.causal()).dense(n, n)[0, 0], d & causal)
    assert torch.equal((g | masks.sliding_window(1, 1)).dense(n, n)[0, 0],
                       d | masks.sliding_window(1, 1).dense(n, n)[0, 0])
    assert torch.equal((~g).dense(n, n)[0, 0], ~d)
    q, k, v = rand_qkv(2, 2, n, 8, seed=1)
    for m in (g & masks.causal(), g & masks.padding([n, 5]), g | masks.global_tokens([0])):
        for backend in ("chunked", "math", "edges"):
            if backend == "edges" and graph_part(m)[0] is None:
                continue  # an | of a graph: not the edges backend's (it needs the graph as an &-part)
            torch.testing.assert_close(attention(q, k, v, mask=m, backend=backend),
                                       attention(q, k, v, mask=m, backend="reference"), **tol(torch.float64))


def test_chunked_skips_the_empty_tiles_of_a_clustered_graph():
    n, size = 512, 64
    # eight clusters of 64 nodes, edges only inside a cluster: 7/8 of the 64 x 64 tiles are empty
    ei = torch.cat([random_edges(size, edges=6 * size, seed=c, isolated=0) + c * size for c in range(n // size)], 1)
    g = masks.graph(ei, num_nodes=n)
    q, k, v = rand_qkv(1, 2, n, 16, dtype=torch.float32, seed=2)
    plan = plan_tiles(make_call(q, k, v, mask=g), 64, 64)
    assert plan.computed_fraction == pytest.approx(1 / 8)
    torch.testing.assert_close(attention(q, k, v, mask=g, backend="chunked"),
                               attention(q, k, v, mask=g, backend="math"), **tol(torch.float32))


def test_a_query_does_not_see_its_non_neighbours():
    n = 30
    ei = random_edges(n, seed=7)
    g = masks.graph(ei, num_nodes=n)
    d = brute(ei, n, n)
    q, k, v = rand_qkv(1, 2, n, 8, seed=3)
    i = int(d.sum(1).argmax())  # the node with the most neighbours
    hidden = (~d[i]).nonzero().flatten()
    k2, v2 = k.clone(), v.clone()
    k2[:, :, hidden] = 5 * torch.randn(k2[:, :, hidden].shape, dtype=k.dtype)
    v2[:, :, hidden] = -7.0
    for backend in ("edges", "chunked", "math"):
        a = attention(q, k, v, mask=g, backend=backend)[:, :, i]
        b = attention(q, k2, v2, mask=g, backend=backend)[:, :, i]
        torch.testing.assert_close(a, b, **tol(torch.float64))


def test_csr_sorts_by_target_and_keeps_every_edge_unless_collapsed():
    ei = torch.tensor([[2, 0, 1, 0, 3, 0], [1, 1, 0, 1, 3, 2]])  # 0 -> 1 twice
    g = masks.graph(ei, num_nodes=4)
    assert g.has_duplicates()
    c = g.csr(4, 4, collapse=False)
    assert c.num_edges == 6 and c.dst.tolist() == sorted(c.dst.tolist())
    assert torch.equal(ei[:, c.order], torch.stack([c.src, c.dst]))  # order maps back to the given columns
    assert c.counts.tolist() == [1, 3, 1, 1]  # edges per target, the duplicate counted
    assert c.num_pairs == 5 and c.crow.tolist() == [0, 1, 3, 4, 5]  # the pattern: each pair once
    assert c.multiplicity.tolist() == [1, 2, 1, 1, 1] and c.group.tolist() == [0, 1, 1, 2, 3, 4]
    pairs_dst = torch.repeat_interleave(torch.arange(4), c.crow.diff().long())
    assert torch.equal(pairs_dst[c.t_order], c.t_col.long())  # the transpose lists the same pairs by source
    assert c.col.long()[c.t_order].tolist() == sorted(c.col.tolist())
    u = g.csr(4, 4)
    assert u.num_edges == u.num_pairs == 5 and u.order is None and u.group is None
    assert g.density(4, 4) == 5 / 16


def test_an_empty_edge_list_gives_zeros():
    g = masks.graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=6)
    q, k, v = rand_qkv(1, 2, 6, 4, seed=4, requires_grad=True)
    for backend in ("edges", "chunked", "math"):
        out = attention(q, k, v, mask=g, backend=backend)
        assert torch.equal(out, torch.zeros_like(out))
        grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
        assert all(x is None or torch.equal(x, torch.zeros_like(x)) for x in grads)


@pytest.mark.parametrize("edge_index,num_nodes,match", [
    (torch.zeros(3, 4, dtype=torch.long), None, r"edge_index must have shape \(2, E\).*\(3, 4\)"),
    (torch.zeros(4, dtype=torch.long), None, r"edge_index must have shape \(2, E\)"),
    (torch.zeros(2, 4), None, r"edge_index must hold integer node ids.*float32"),
    (torch.zeros(2, 4, dtype=torch.bool), None, r"edge_index must hold integer node ids.*bool"),
    (torch.tensor([[0, -1], [1, 1]]), None, r"edge_index holds a negative node id \(-1, in column 1\)"),
    (torch.tensor([[0, 7], [1, 1]]), 5, r"edge_index holds source node id 7 \(column 1\) but num_nodes=5"),
    (torch.tensor([[0, 1], [1, 9]]), (4, 6), r"target node id 9 .* num_nodes=\(4, 6\) gives 6 target"),
    (torch.tensor([[0], [1]]), 0, r"num_nodes must be an int >= 1, got 0"),
    (torch.tensor([[0], [1]]), (2, 3, 4), r"num_nodes must be an int or a pair"),
    (torch.tensor([[0], [1]]), "5", r"num_nodes must be an int >= 1"),
])
def test_bad_arguments_are_named(edge_index, num_nodes, match):
    with pytest.raises(ValueError, match=match):
        masks.graph(edge_index, num_nodes=num_nodes)


def test_a_call_that_disagrees_with_num_nodes_is_refused():
    g = masks.graph(torch.tensor([[0, 1], [1, 2]]), num_nodes=5)
    q, k, v = rand_qkv(1, 1, 6, 4)
    for backend in ("edges", "chunked", "math"):
        with pytest.raises(ValueError, match=r"num_nodes gives 5 target nodes but the call has N=6 queries"):
            attention(q, k, v, mask=g, backend=backend)
    free = masks.graph(torch.tensor([[0, 9], [1, 2]]))  # sizes from the call: ids must fit in it
    with pytest.raises(ValueError, match=r"source node id 9 but the call has M=6 keys"):
        attention(q, k, v, mask=free, backend="edges")


def test_dense_refuses_a_large_graph():
    n = 1 << 15
    g = masks.graph(torch.tensor([[0, 1], [1, 0]]), num_nodes=n)
    with pytest.raises(ValueError, match=r"dense 32768 x 32768 mask .* 'edges' backend"):
        g.dense(n, n)
    assert g.block_kinds(n, n, 4096, 4096).shape == (1, 1, 8, 8)  # tiles need no dense matrix


def test_allows_searches_the_edge_codes_above_the_table_limit(monkeypatch):
    import importlib

    graph_module = importlib.import_module("attnlab.masks.graph")  # the module (masks.graph is the function)

    ei = random_edges(23, 7, seed=9)
    g = masks.graph(ei, num_nodes=(23, 7))
    q = torch.arange(-1, 8).view(1, 1, -1, 1)  # out-of-range ids on both sides are never allowed
    k = torch.arange(-1, 24).view(1, 1, 1, -1)
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    table = g.allows(zero, zero, q, k, 7, 23)
    monkeypatch.setattr(graph_module, "TABLE_LIMIT", 0)
    searched = masks.graph(ei, num_nodes=(23, 7)).allows(zero, zero, q, k, 7, 23)
    assert torch.equal(table, searched)
    assert torch.equal(searched[0, 0, 1:-1, 1:-1], brute(ei, 7, 23)) and not searched[0, 0, 0].any()
