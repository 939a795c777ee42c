"""Graph attention diagnostics: a node's neighbours, head entropy against uniform, static vs dynamic ranking."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.diagnostics.graph import (
    analyze_graph_model,
    discordance,
    format_graph_report,
    head_entropy,
    node_neighbours,
    ranking_agreement,
)
from attnlab.layers import GATConv, GATv2Conv, TransformerConv
from attnlab.models import GAT, GATConfig
from helpers import random_edges


def test_node_neighbours_lists_the_incoming_edges_highest_first():
    ei = torch.tensor([[0, 2, 3, 1], [1, 1, 1, 0]])
    w = torch.tensor([[0.2, 0.5], [0.7, 0.1], [0.1, 0.4], [1.0, 1.0]])
    (src, wt), = node_neighbours([(ei, w)], 1)
    assert src.tolist() == [2, 0, 3] and torch.equal(wt, w[[1, 0, 2]])  # by mean weight: 0.4, 0.35, 0.25


def test_head_entropy_against_uniform():
    ei = torch.tensor([[0, 1, 2, 0, 1], [3, 3, 3, 4, 4]])  # node 3: three neighbours, node 4: two
    uniform = torch.tensor([[1 / 3], [1 / 3], [1 / 3], [0.5], [0.5]])
    onehot = torch.tensor([[1.0], [0.0], [0.0], [0.0], [1.0]])
    e, u, r = head_entropy(ei, torch.cat([uniform, onehot], 1), 5)[0]
    assert e == pytest.approx(u) == pytest.approx((math.log(3) + math.log(2)) / 2) and r == pytest.approx(1.0)
    e, _, r = head_entropy(ei, torch.cat([uniform, onehot], 1), 5)[1]
    assert e == pytest.approx(0.0, abs=1e-12) and r == pytest.approx(0.0, abs=1e-12)


def test_discordance_counts_the_key_pairs_two_queries_order_differently():
    s = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    assert discordance(s) == 0.0
    assert discordance(torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])) == pytest.approx(1.0)
    assert discordance(torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, 3.0]])) == pytest.approx(1 / 3)
    # keys 0 and 1 tie (identical features): left out, not counted against a static ranking
    assert discordance(torch.tensor([[1.0, 1.0, 3.0], [5.0, 5.0, 9.0], [0.0, 0.0, 0.5]])) == 0.0


def test_gat_is_static_and_gatv2_and_transformer_are_dynamic():
    torch.manual_seed(0)
    x = torch.randn(40, 6)
    q, k = torch.arange(20), torch.arange(10, 40)
    for conv, static in ((GATConv(6, 4, heads=3), True), (GATv2Conv(6, 4, heads=3), False),
                         (TransformerConv(6, 4, heads=3), False)):
        for share, disc in ranking_agreement(conv.eval(), x, q, k):
            if static:
                assert share == 1.0 and disc == 0.0
            else:
                assert disc > 1e-3


def test_analyze_a_model_and_format_the_report():
    torch.manual_seed(0)
    model = GAT(GATConfig(in_channels=6, num_classes=3, hidden=4, heads=2))
    x = torch.randn(30, 6)
    ei = random_edges(30, seed=1)
    report = analyze_graph_model(model, x, ei, 3, name="tiny", queries=16, keys=16)
    assert report.degree == int((ei[1] == 3).sum()) + (0 if bool(((ei[0] == 3) & (ei[1] == 3)).any()) else 1)
    assert len(report.neighbours) == 2 and len(report.heads) == 3 and report.sample == (16, 16)
    assert all(h.static for h in report.heads)  # GAT
    assert abs(sum(r["weights"][0] for r in report.neighbours[0]) - 1) < 1e-5
    text = format_graph_report(report)
    assert "node 3" in text and "3 of 3 heads rank the keys the same way" in text and "(self)" in text
    d = report.to_dict()
    assert d["heads"][0]["static"] is True and d["node"] == 3
    with pytest.raises(ValueError, match=r"node must be a node id in \[0, 30\), got 30"):
        analyze_graph_model(model, x, ei, 30)
