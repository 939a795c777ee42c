"""GATConv, GATv2Conv and TransformerConv against PyTorch Geometric's (a test-only dependency).

``from_pyg`` copies of each PyG layer on random graphs (isolated nodes, duplicate edges,
self-loops present or not, bipartite inputs, an empty edge list) and on Cora: outputs within
1e-6 in float32, gradients within 1e-5 of their scale, the attention weights edge by edge and
the returned edge lists identical; float64 to rounding. Then what is ours alone: gradcheck,
dropout in training, and errors that name the argument.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.layers import GATConv, GATv2Conv, TransformerConv
from helpers import gradcheck, random_edges

pyg = pytest.importorskip("torch_geometric.nn", reason="parity tests need torch_geometric (the test extra)")

LAYERS = {
    "gat": (GATConv, "GATConv", {}),
    "gat_mean": (GATConv, "GATConv", {"concat": False, "negative_slope": 0.1}),
    "gat_no_loops": (GATConv, "GATConv", {"add_self_loops": False, "bias": False}),
    "gatv2": (GATv2Conv, "GATv2Conv", {}),
    "gatv2_shared": (GATv2Conv, "GATv2Conv", {"share_weights": True, "concat": False}),
    "transformer": (TransformerConv, "TransformerConv", {}),
    "transformer_beta": (TransformerConv, "TransformerConv", {"beta": True, "concat": False}),
    "transformer_no_root": (TransformerConv, "TransformerConv", {"root_weight": False, "bias": False}),
}

#: graphs: (sources, targets, self_loops, bipartite input) -- bipartite means x = (x_src, x_dst)
GRAPHS = {
    "loops": (37, 37, True, False),
    "no_loops": (37, 37, False, False),
    "bipartite": (23, 11, None, True),
    "bipartite_wide": (8, 29, True, True),
    "single": (1, 1, True, False),
}


def _pair(layer_kind: str, graph: str, dtype=torch.float32, seed=0):
    cls, pyg_name, kw = LAYERS[layer_kind]
    n_src, n_dst, loops, bipartite = GRAPHS[graph]
    torch.manual_seed(seed)
    f_src, f_dst = 12, (12 if "shared" in layer_kind else 7)
    in_ch = (f_src, f_dst) if bipartite and "shared" not in layer_kind else f_src
    theirs = getattr(pyg, pyg_name)(in_ch, 5, heads=3, **kw).to(dtype).eval()
    ours = cls.from_pyg(theirs)
    g = torch.Generator().manual_seed(seed + 1)
    xs = torch.randn(n_src, f_src, generator=g, dtype=dtype)
    xd = torch.randn(n_dst, f_dst if isinstance(in_ch, tuple) else f_src, generator=g, dtype=dtype)
    x = (xs, xd) if bipartite else xs
    ei = random_edges(n_src, n_dst, seed=seed + 2, isolated=2, self_loops=loops)
    return ours, theirs, x, ei


def _run(layer, x, ei, cot=None):
    inputs = [t.clone().requires_grad_() for t in (x if isinstance(x, tuple) else (x,))]
    xin = tuple(inputs) if isinstance(x, tuple) else inputs[0]
    out, (edges, w) = layer(xin, ei, return_attention_weights=True)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype) if cot is None else cot
    names = sorted(n for n, _ in layer.named_parameters())
    params = dict(layer.named_parameters())
    grads = torch.autograd.grad((out * cot).sum(), inputs + [params[n] for n in names], allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, inputs + [params[n] for n in names])]
    return out, edges, w, dict(zip(["x_src", "x_dst"][: len(inputs)] + names, grads)), cot


def _assert_parity(ours, theirs, x, ei, fwd: float, grad: float):
    o, e, w, g, cot = _run(ours, x, ei)
    po, pe, pw, pg, _ = _run(theirs, x, ei, cot)
    assert torch.equal(e, pe)  # the same edge list (self-loops removed and appended as PyG does)
    torch.testing.assert_close(o, po, rtol=0, atol=fwd)
    torch.testing.assert_close(w, pw, rtol=0, atol=fwd)  # edge by edge
    assert set(g) == set(pg)
    for name in g:
        scale = max(1.0, pg[name].abs().max().item())
        torch.testing.assert_close(g[name], pg[name], rtol=0, atol=grad * scale, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("layer_kind", list(LAYERS))
def test_from_pyg_matches_torch_geometric_float32(layer_kind, graph):
    ours, theirs, x, ei = _pair(layer_kind, graph)
    _assert_parity(ours, theirs, x, ei, fwd=1e-6, grad=1e-5)


@pytest.mark.parametrize("layer_kind", ["gat", "gatv2", "transformer_beta"])
def test_from_pyg_matches_torch_geometric_float64(layer_kind):
    ours, theirs, x, ei = _pair(layer_kind, "bipartite", dtype=torch.float64)
    _assert_parity(ours, theirs, x, ei, fwd=1e-12, grad=1e-11)


@pytest.mark.parametrize("layer_kind", ["gat", "gat_no_loops", "gatv2", "transformer"])
def test_an_empty_edge_list_matches_torch_geometric(layer_kind):
    ours, theirs, x, _ = _pair(layer_kind, "loops")
    ei = torch.zeros(2, 0, dtype=torch.long)
    out, (edges, w) = ours(x, ei, return_attention_weights=True)
    pout, (pedges, pw) = theirs(x, ei, return_attention_weights=True)
    torch.testing.assert_close(out, pout, rtol=0, atol=1e-6)
    assert torch.equal(edges, pedges) and torch.equal(w, pw)
    if LAYERS[layer_kind][2].get("add_self_loops", True) and "gat" in layer_kind:
        assert torch.equal(w, torch.ones_like(w))  # only self-loops: each node attends to itself alone


def test_parity_on_cora(planetoid):
    data = planetoid("cora")
    torch.manual_seed(0)
    for name, kw in (("GATConv", {"heads": 8}), ("GATv2Conv", {"heads": 8}), ("TransformerConv", {"heads": 2})):
        theirs = getattr(pyg, name)(data.num_features, 8, **kw).eval()
        ours = {"GATConv": GATConv, "GATv2Conv": GATv2Conv, "TransformerConv": TransformerConv}[name].from_pyg(theirs)
        _assert_parity(ours, theirs, data.x, data.edge_index, fwd=1e-6, grad=1e-5)


def test_gat_layer_gradcheck_float64():
    torch.manual_seed(0)
    layer = GATConv((4, 3), 2, heads=2).double()
    ei = random_edges(5, 4, seed=3)
    xs = torch.randn(5, 4, dtype=torch.float64)
    xd = torch.randn(4, 3, dtype=torch.float64)
    assert gradcheck(lambda a, b: layer((a, b), ei), (xs, xd))


def test_dropout_drops_attention_weights_in_training_only():
    torch.manual_seed(0)
    layer = GATConv(6, 4, heads=2, dropout=0.5)
    x = torch.randn(20, 6)
    ei = random_edges(20, seed=1)
    layer.eval()
    a, b = layer(x, ei), layer(x, ei)
    assert torch.equal(a, b)
    layer.train()
    c = layer(x, ei)
    assert not torch.allclose(a, c)
    c.sum().backward()  # the dropped weights' backward runs
    assert layer.att_src.grad is not None and torch.isfinite(layer.att_src.grad).all()


def test_the_edge_list_is_cached_per_input_tensor():
    layer = GATConv(3, 2)
    x = torch.randn(6, 3)
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    first = layer._edges(ei, 6, 6, True)
    assert layer._edges(ei, 6, 6, True) is first
    ei[0, 0] = 4  # modified in place: the cache must not serve it
    out, (edges, _) = layer(x, ei, return_attention_weights=True)
    assert int(edges[0, 0]) == 4


@pytest.mark.parametrize("call,match", [
    (lambda m: m(torch.randn(6, 4), torch.tensor([[0, 1], [1, 2]])), r"GATConv: x must be a floating-point \(num_nodes, 3\)"),
    (lambda m: m(torch.randn(6, 3).long(), torch.tensor([[0, 1], [1, 2]])), r"x must be a floating-point"),
    (lambda m: m(torch.randn(6, 3), torch.tensor([[0, 1], [1, 2]]).float()), r"edge_index must hold integer node ids"),
    (lambda m: m(torch.randn(6, 3), torch.tensor([0, 1, 2])), r"edge_index must have shape \(2, E\)"),
    (lambda m: m(torch.randn(6, 3), torch.tensor([[0, -1], [1, 2]])), r"negative node id"),
    (lambda m: m(torch.randn(6, 3), torch.tensor([[0, 6], [1, 2]])),
     r"source node id 6 .*the node counts are x's rows: 6 sources"),
    (lambda m: m((torch.randn(6, 3), torch.randn(2, 3)), torch.tensor([[0, 1], [1, 2]])), r"target node id 2"),
    (lambda m: m((torch.randn(6, 3),), torch.tensor([[0], [1]])), r"x must be a tensor or a pair"),
])
def test_bad_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(GATConv(3, 2))


def test_from_pyg_refuses_what_it_does_not_copy():
    with pytest.raises(ValueError, match=r"edge_dim=4 is not supported"):
        GATConv.from_pyg(pyg.GATConv(3, 2, edge_dim=4))
    with pytest.raises(ValueError, match=r"needs a torch_geometric GATv2Conv"):
        GATv2Conv.from_pyg(pyg.GATConv(3, 2))
    with pytest.raises(ValueError, match=r"lazy"):
        GATConv.from_pyg(pyg.GATConv(-1, 2))


@pytest.mark.parametrize("cls", [GATConv, GATv2Conv, TransformerConv])
def test_message_dropout_drops_the_messages_not_the_scores(cls):
    torch.manual_seed(0)
    layer = cls(6, 4, heads=2, message_dropout=0.5)
    x = torch.randn(20, 6)
    ei = random_edges(20, seed=1)
    out_eval, (_, w_eval) = layer.eval()(x, ei, return_attention_weights=True)
    out_train, (_, w_train) = layer.train()(x, ei, return_attention_weights=True)
    torch.testing.assert_close(w_train, w_eval)  # the scores see the undropped features
    assert not torch.allclose(out_train, out_eval)
    with pytest.raises(ValueError, match=r"message_dropout must be in \[0, 1\)"):
        cls(6, 4, message_dropout=1.0)
