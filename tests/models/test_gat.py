"""The GAT node classifier: shapes, per-layer attention, sparse features equal dense ones, config checks."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import GAT, GATConfig
from attnlab.models.gat import feature_dropout
from helpers import random_edges


@pytest.mark.parametrize("conv", ["gat", "gatv2", "transformer"])
def test_forward_and_attention_per_layer(conv):
    torch.manual_seed(0)
    cfg = GATConfig(in_channels=10, num_classes=4, hidden=3, heads=2, layers=3, conv=conv)
    model = GAT(cfg).eval()
    x = torch.randn(17, 10)
    ei = random_edges(17, seed=1)
    out = model(x, ei, return_weights=True)
    assert out.logits.shape == (17, 4) and len(out.attentions) == 3 and len(out.hidden_states) == 3
    for (edges, w), heads in zip(out.attentions, (2, 2, 1)):
        assert w.shape == (edges.shape[1], heads)
        sums = torch.zeros(17, heads).index_add_(0, edges[1], w)
        has = torch.bincount(edges[1], minlength=17) > 0
        torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))  # a softmax over each node's edges
    assert torch.equal(model(x, ei).logits, out.logits)


def test_sparse_features_give_the_dense_result():
    torch.manual_seed(0)
    model = GAT(GATConfig(in_channels=30, num_classes=3)).eval()
    x = torch.rand(25, 30) * (torch.rand(25, 30) < 0.1)
    ei = random_edges(25, seed=2)
    dense = model(x, ei).logits
    for sparse in (x.to_sparse_csr(), x.to_sparse()):
        torch.testing.assert_close(model(sparse, ei).logits, dense, rtol=1e-5, atol=1e-6)
    model.train()
    model(x.to_sparse_csr(), ei).logits.sum().backward()  # the sparse projection's backward reaches the weights
    assert model.convs[0].lin.weight.grad is not None


def test_feature_dropout_drops_the_stored_values_at_rate_p():
    torch.manual_seed(0)
    x = (torch.rand(400, 500) < 0.05).float()
    y = feature_dropout(x.to_sparse_csr(), 0.6, True).to_dense()
    kept = (y[x > 0] != 0).float().mean()
    assert abs(kept.item() - 0.4) < 0.02 and torch.allclose(y[y != 0], torch.full_like(y[y != 0], 2.5))
    assert feature_dropout(x, 0.6, False) is x


@pytest.mark.parametrize("kw,match", [({"heads": 0}, "heads must be"), ({"conv": "gcn"}, "conv must be one of"),
                                      ({"dropout": 1.0}, "dropout must be"), ({"num_classes": 1}, "num_classes must be")])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        GATConfig(**kw)


def test_wrong_feature_count_is_named():
    model = GAT(GATConfig(in_channels=8))
    with pytest.raises(ValueError, match=r"x must be \(num_nodes, in_channels=8\), got \(5, 9\)"):
        model(torch.randn(5, 9), torch.zeros(2, 0, dtype=torch.long))
