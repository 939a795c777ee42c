"""A graph attention network for node classification: GAT, GATv2 or TransformerConv layers.

Veličković et al., "Graph Attention Networks" (ICLR 2018), transductive setting: dropout
on the input features, a graph attention layer of ``heads`` x ``hidden`` channels
(concatenated) and ELU, dropout again, then an output layer of ``out_heads`` heads averaged
into class scores; dropout on the attention weights in every layer, and (as the authors' code
does, not PyG's example) on each layer's projected features before the aggregation. The node features may be
a sparse tensor (bag-of-words features are about 1% nonzero): the first layer then drops
and projects only the stored values. ``conv`` swaps the layer
for GATv2 (Brody et al., 2022) or TransformerConv (Shi et al., 2021), all from
:mod:`attnlab.layers.graph`. The whole graph is one input (full-batch training).

Time per forward O(N F H C + E H C); memory O(N H C + E H).
Shape legend: ``N`` nodes, ``F`` input features, ``E`` edges, ``H`` heads, ``C`` classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..layers.graph import GATConv, GATv2Conv, TransformerConv
from ..utils import sparse_csr
from .config import GATConfig
from .io import PretrainedMixin, register_model

__all__ = ["GAT", "GraphOutput", "feature_dropout"]


@dataclass
class GraphOutput:
    """What :class:`GAT` returns.

    Attributes:
        logits: ``(N, C)`` class scores per node.
        attentions: with ``return_weights``, per layer ``(edge_index, weights (E', H))``: the
            edge list the layer attended over (self-loops included) and one weight per edge and head.
        hidden_states: with ``return_weights``, each layer's input features (after dropout).
    """

    logits: Tensor
    attentions: tuple[tuple[Tensor, Tensor], ...] | None = None
    hidden_states: tuple[Tensor, ...] | None = None


def feature_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout on node features, dense or sparse (a sparse tensor keeps its pattern and drops among its values).

    Dropping a zero changes nothing, so dropping only the stored values of a sparse ``x`` is the
    same random function, at O(nnz) draws instead of O(N F) (Cora: 49 thousand instead of 3.9 million).
    """
    if not training or p == 0:
        return x
    if x.layout == torch.strided:
        return F.dropout(x, p, True)
    keep = torch.rand(x.values().shape, device=x.device) >= p  # uniform draws: faster than bernoulli_ on CPU
    values = x.values() * keep.to(x.dtype) * (1.0 / (1.0 - p))
    if x.layout == torch.sparse_csr:
        return sparse_csr(x.crow_indices(), x.col_indices(), values, x.shape)
    return torch.sparse_coo_tensor(x.indices(), values, x.shape, is_coalesced=x.is_coalesced(), check_invariants=False)


def _conv(cfg: GATConfig, n_in: int, n_out: int, heads: int, concat: bool) -> nn.Module:
    if cfg.conv == "transformer":
        return TransformerConv(n_in, n_out, heads=heads, concat=concat, dropout=cfg.attn_dropout,
                               message_dropout=cfg.message_dropout)
    cls = GATConv if cfg.conv == "gat" else GATv2Conv
    return cls(n_in, n_out, heads=heads, concat=concat, negative_slope=cfg.negative_slope, dropout=cfg.attn_dropout,
               message_dropout=cfg.message_dropout)


@register_model
class GAT(PretrainedMixin, nn.Module):
    """Node classifier of ``config.layers`` graph attention layers (see the module docstring).

    Args:
        config: a :class:`~attnlab.models.config.GATConfig`.
    """

    config_class = GATConfig

    def __init__(self, config: GATConfig):
        super().__init__()
        if not isinstance(config, GATConfig):
            raise ValueError(f"config must be a GATConfig, got {type(config).__name__}")
        self.config = config
        convs, n_in = [], config.in_channels
        for _ in range(config.layers - 1):
            convs.append(_conv(config, n_in, config.hidden, config.heads, concat=True))
            n_in = config.hidden * config.heads
        convs.append(_conv(config, n_in, config.num_classes, config.out_heads, concat=False))
        self.convs = nn.ModuleList(convs)

    def forward(self, x: Tensor, edge_index: Tensor, *, return_weights: bool = False) -> GraphOutput:
        """Class scores of every node of the graph ``(x (N, F), edge_index (2, E))``, source -> target."""
        if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != self.config.in_channels:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be (num_nodes, in_channels={self.config.in_channels}), got {got}")
        attns, inputs = [], []
        for i, conv in enumerate(self.convs):
            x = feature_dropout(x, self.config.dropout, self.training)
            inputs.append(x)
            if return_weights:
                x, att = conv(x, edge_index, return_attention_weights=True)
                attns.append(att)
            else:
                x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.elu(x)
        if not return_weights:
            return GraphOutput(x)
        return GraphOutput(x, tuple(attns), tuple(inputs))
