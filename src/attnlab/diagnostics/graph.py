"""What a trained graph attention model attends to: a node's neighbours, head entropy, static vs dynamic attention.

* :func:`node_neighbours` - for one target node, each incoming edge's source and its weight
  per head, per layer (the self-loop included), highest first.
* :func:`head_entropy` - per layer and head, the mean entropy of the nodes' neighbour
  distributions against the uniform distribution over the same neighbours (``log deg``),
  over the nodes with at least two incoming edges. A ratio near 1 means the head barely
  prefers any neighbour (a GAT trained on Cora measures 0.999-1.000, docs/graphs.md).
* :func:`ranking_agreement` - Brody et al., "How Attentive are Graph Attention Networks?"
  (ICLR 2022) show that GAT's attention is *static*: ``LeakyReLU(a_dst . Wh_i + a_src . Wh_j)``
  ranks the keys ``j`` by ``a_src . Wh_j`` whatever the query ``i``, so one key is the top
  choice of every query. GATv2's ``a . LeakyReLU(W_r h_i + W_l h_j)`` is *dynamic*. On a
  sample of queries and keys (neighbours or not, since static-ness is a property of the
  score function), scored in float64, per head: the share of queries whose top key is the
  most common top key, and the discordance: the share of key pairs that two queries order
  differently (ties left out), over all query pairs. GAT gives 1 and 0.
* :func:`analyze_graph_model` - all three for a model on its graph, as a :class:`GraphReport`
  (``to_dict`` for JSON, :func:`format_graph_report` for text).

Time: one forward with weights O(E H); the ranking O(layers H Q K C) for ``Q`` queries and
``K`` keys. Shape legend: ``N`` nodes, ``E`` edges, ``H`` heads, ``Q`` queries, ``K`` keys.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from ..utils import eval_mode

__all__ = ["GraphReport", "HeadEntropy", "analyze_graph_model", "discordance", "format_graph_report",
           "head_entropy", "node_neighbours", "ranking_agreement"]


@dataclass
class HeadEntropy:
    """One head's neighbour entropy (nats), averaged over the nodes with at least two neighbours."""

    layer: int
    head: int
    entropy: float  # mean of -sum w log w
    uniform: float  # mean of log(deg)
    ratio: float  # entropy / uniform (1 = uniform over the neighbours)
    top_share: float | None = None  # ranking agreement: queries whose top key is the most common one
    discordance: float | None = None  # key pairs two queries order differently, mean over query pairs

    @property
    def static(self) -> bool:
        """Every sampled query ranks the keys alike (GAT's attention)."""
        return self.discordance is not None and self.discordance < 1e-9


@dataclass
class GraphReport:
    """:func:`analyze_graph_model`'s findings for one model and one node."""

    name: str
    conv: str
    node: int
    degree: int
    neighbours: list[list[dict]]  # per layer: [{"source": j, "weights": [w per head]}], highest mean first
    heads: list[HeadEntropy] = field(default_factory=list)
    sample: tuple[int, int] = (0, 0)  # (queries, keys) of the ranking agreement

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sample"] = list(self.sample)
        for row, h in zip(d["heads"], self.heads):
            row["static"] = h.static
        return d


def node_neighbours(attentions, node: int) -> list[tuple[Tensor, Tensor]]:
    """Per layer, ``(sources (K,), weights (K, H))`` of the edges into ``node``, by mean weight, highest first.

    ``attentions``: per layer ``(edge_index (2, E), weights (E, H))`` (what the graph layers return).
    """
    out = []
    for ei, w in attentions:
        into = (ei[1] == node).nonzero().flatten()
        src, wt = ei[0, into], w[into].float()
        order = torch.argsort(wt.mean(1), descending=True, stable=True)
        out.append((src[order], wt[order]))
    return out


def head_entropy(edge_index: Tensor, weights: Tensor, num_nodes: int) -> list[tuple[float, float, float]]:
    """Per head ``(mean entropy, mean log(deg), ratio)`` over the targets with at least two incoming edges."""
    w = weights.double()
    deg = torch.bincount(edge_index[1], minlength=num_nodes)
    ent = torch.zeros(num_nodes, w.shape[1], dtype=torch.float64)
    ent.index_add_(0, edge_index[1], -(w * torch.log(w.clamp_min(1e-300))))  # (N, H)
    sel = deg >= 2
    if not bool(sel.any()):
        return [(0.0, 0.0, float("nan"))] * w.shape[1]
    uniform = torch.log(deg[sel].double()).mean().item()
    out = []
    for h in range(w.shape[1]):
        e = ent[sel, h].mean().item()
        out.append((e, uniform, e / uniform))
    return out


def discordance(scores: Tensor) -> float:
    """The share of column pairs that two rows order differently, over the pairs both rows order (no tie).

    Averaged over row pairs: ``scores (Q, K)``; 0 when every row ranks the columns alike. Two keys
    with equal scores (nodes with identical features) are left out rather than counted, as in
    Kendall's tau-b. O(Q^2 K^2) time in products of ``(Q, K^2)`` sign matrices.
    """
    q, k = scores.shape
    if q < 2 or k < 2:
        return 0.0
    sign = torch.sign(scores[:, :, None] - scores[:, None, :]).reshape(q, k * k)  # (Q, K*K) in {-1, 0, +1}
    agree = sign @ sign.t()  # (Q, Q): ordered alike minus ordered differently
    both = sign.abs() @ sign.abs().t()  # (Q, Q): pairs both rows order
    off = ~torch.eye(q, dtype=torch.bool)
    disagree = (both - agree)[off].sum() / 2
    total = both[off].sum()
    return float(disagree / total) if total > 0 else 0.0


def ranking_agreement(conv: nn.Module, x, queries: Tensor, keys: Tensor) -> list[tuple[float, float]]:
    """Per head ``(top_share, discordance)`` of ``conv.attention_scores(x, queries, keys)`` (see the module).

    Scored in float64 (a copy of ``conv``), so that GAT's equal rankings are not broken by rounding.
    """
    conv64 = copy.deepcopy(conv).double()
    with torch.no_grad():
        s = conv64.attention_scores(x.to(torch.float64), queries, keys)  # (H, Q, K)
    out = []
    for h in range(s.shape[0]):
        top = s[h].argmax(1)  # (Q,)
        share = torch.bincount(top, minlength=s.shape[2]).max().item() / s.shape[1]
        out.append((share, discordance(s[h])))
    return out


def analyze_graph_model(model: nn.Module, x, edge_index: Tensor, node: int, *, name: str = "model",
                        queries: int = 128, keys: int = 128, seed: int = 0) -> GraphReport:
    """Neighbour weights of ``node``, head entropies and ranking agreement of a graph model (eval mode).

    ``model(x, edge_index, return_weights=True)`` must return ``attentions`` and ``hidden_states``
    (:class:`attnlab.models.GAT` does), and its layers ``convs`` must offer ``attention_scores``.

    Raises:
        ValueError: for a node outside the graph.
    """
    n = int(x.shape[0])
    if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node < n:
        raise ValueError(f"node must be a node id in [0, {n}), got {node!r}")
    with eval_mode(model), torch.no_grad():
        out = model(x, edge_index, return_weights=True)
    g = torch.Generator().manual_seed(seed)
    qi = torch.randperm(n, generator=g)[: min(queries, n)]
    ki = torch.randperm(n, generator=g)[: min(keys, n)]
    report = GraphReport(name=name, conv=getattr(getattr(model, "config", None), "conv", type(model).__name__),
                         node=node, degree=0, neighbours=[], sample=(int(qi.numel()), int(ki.numel())))
    for layer, ((ei, w), (src, wt)) in enumerate(zip(out.attentions, node_neighbours(out.attentions, node))):
        report.neighbours.append([{"source": int(j), "weights": [round(float(v), 6) for v in row]}
                                  for j, row in zip(src, wt)])
        if layer == 0:
            report.degree = int(src.numel())
        with eval_mode(model):
            agree = ranking_agreement(model.convs[layer], out.hidden_states[layer], qi, ki)
        for h, ((e, u, r), (share, corr)) in enumerate(zip(head_entropy(ei, w, n), agree)):
            report.heads.append(HeadEntropy(layer, h, e, u, r, share, corr))
    return report


def format_graph_report(report: GraphReport, top: int = 10) -> str:
    """The report as text: the node's neighbours per layer and head, then one line per head."""
    lines = [f"{report.name} ({report.conv}): node {report.node}, {report.degree} incoming edges "
             f"(self-loop included)"]
    for layer, rows in enumerate(report.neighbours):
        heads = len(rows[0]["weights"]) if rows else 0
        lines.append(f"layer {layer}: neighbour  " + "  ".join(f"head {h:<2}" for h in range(heads)))
        for r in rows[:top]:
            mark = " (self)" if r["source"] == report.node else ""
            lines.append(f"  {r['source']:>8}{mark:<7} " + "  ".join(f"{v:7.4f}" for v in r["weights"]))
        if len(rows) > top:
            lines.append(f"  ... {len(rows) - top} more")
    q, k = report.sample
    lines.append("")
    lines.append(f"per head: entropy of the neighbour weights against uniform (nodes with >= 2 neighbours); over "
                 f"{q} queries x {k} keys, the share of queries with the most common top key and the share of key "
                 f"pairs two queries order differently (0: static attention)")
    lines.append("layer head  entropy  uniform  ratio  top-key share  discordance")
    for h in report.heads:
        lines.append(f"{h.layer:>5} {h.head:>4}  {h.entropy:7.4f}  {h.uniform:7.4f}  {h.ratio:5.3f}  "
                     f"{h.top_share:13.3f}  {h.discordance:11.5f}  {'static' if h.static else 'dynamic'}")
    static = sum(h.static for h in report.heads)
    lines.append(f"{static} of {len(report.heads)} heads rank the keys the same way for every query (static)")
    if any(math.isnan(h.ratio) for h in report.heads):
        lines.append("(no node has two neighbours: entropy ratios are undefined)")
    return "\n".join(lines)
