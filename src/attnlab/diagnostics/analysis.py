"""Per-head analysis of attention maps: entropy, distance, pattern labels, redundancy.

Clark et al., 2019, "What Does BERT Look At? An Analysis of BERT's Attention" and
Kovaleva et al., 2019, "Revealing the Dark Secrets of BERT" catalogue the patterns
heads fall into: attending to oneself, to the previous/next token, to a local band,
to a few global positions, piling onto ``[CLS]``/``[SEP]`` (a "sink" that often means
the head is idle), or spreading broadly. This module scores each of them from the
weights and names the best fit; the tutorials advise to watch for the sink case, so it
is flagged ``abnormal``.

Pattern scores (all in ``[0, 1]``, averaged over the valid query rows: rows with any
weight; a fully masked row is skipped):

* ``self``: weight on the key at the query's own position (the diagonal).
* ``previous`` / ``next``: weight on the key one position before / after.
* ``local``: weight within ``band`` positions of the diagonal (the diagonal included).
* ``global``: weight on the ``max(1, ceil(global_fraction * M))`` keys that receive the
  most attention, special tokens excluded (vertical stripes: "everyone attends to a
  few positions").
* ``sink``: weight on the special positions (the first token and separators).
* ``broad``: mean normalized entropy ``H / log(#allowed keys)`` (1 = uniform).

The label is ``sink`` when the sink mass reaches ``sink_threshold`` (the head is then
also flagged ``abnormal``); otherwise the most specific pattern (in the order above)
whose score is within ``margin`` of the best score among those reaching ``min_score``
(``broad_min`` for ``broad``, since short rows look broad easily); otherwise ``mixed``.
A pure diagonal scores 1 on both ``self`` and ``local`` and is labelled ``self``.

Query ``i`` sits at key position ``i + (M - N)`` (the bottom-right alignment of
:mod:`attnlab.masks`). Time O(L H B N M), memory O(B N M) per head;
:func:`head_similarity` is O((L H)^2 B N M) time in blocks of heads.
Shape legend: ``L`` layers, ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

__all__ = [
    "PATTERNS",
    "SEPARATOR_TOKENS",
    "HeadStats",
    "analyze_heads",
    "format_head_table",
    "head_similarity",
    "pattern_scores",
    "redundant_heads",
    "special_positions",
]

#: pattern names, most specific first (ties are broken in this order)
PATTERNS = ("sink", "self", "previous", "next", "local", "global", "broad")

#: token strings treated as separators (the first token is always special)
SEPARATOR_TOKENS = frozenset({"[SEP]", "[CLS]", "</s>", "<s>", "<eos>", "<bos>", "<sep>", "<|endoftext|>", "[EOS]"})


@dataclass(frozen=True)
class HeadStats:
    """What :func:`analyze_heads` finds in one head.

    Attributes:
        layer, head: where the head is.
        entropy: mean row entropy in nats.
        mean_distance: mean over rows of ``sum_j p_ij |pos_i - j|`` (in positions).
        label: the pattern name (one of :data:`PATTERNS` or ``"mixed"``).
        score: the label's score in ``[0, 1]`` (for ``mixed``, the best score).
        scores: every pattern's score.
        sink_mass: weight on the first token and separators (the ``sink`` score).
        abnormal: ``sink_mass >= sink_threshold``: the head mostly attends to
            separators or the first token.
    """

    layer: int
    head: int
    entropy: float
    mean_distance: float
    label: str
    score: float
    scores: dict[str, float] = field(default_factory=dict)
    sink_mass: float = 0.0
    abnormal: bool = False

    def to_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)


def special_positions(tokens: Sequence[str] | None, m: int) -> list[int]:
    """The first position and every position whose token is in :data:`SEPARATOR_TOKENS`."""
    out = {0}
    if tokens is not None:
        out |= {i for i, t in enumerate(tokens[:m]) if t in SEPARATOR_TOKENS}
    return sorted(out)


def _as_4d(w: Tensor | object, name: str) -> Tensor:
    t = torch.as_tensor(w)
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must hold floating-point weights, got dtype {t.dtype}")
    while t.ndim < 4:
        t = t.unsqueeze(0)
    if t.ndim != 4:
        raise ValueError(f"{name} must be (N, M), (H, N, M) or (B, H, N, M), got shape {tuple(t.shape)}")
    return t.double()  # (B, H, N, M)


def _layers(weights) -> list[Tensor]:
    """A tensor ``(B, H, N, M)`` (one layer) or a sequence of them, as a list of 4-D float64."""
    if isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError("weights must hold at least one layer, got an empty sequence")
        return [_as_4d(w, f"weights[{i}]") for i, w in enumerate(weights)]
    return [_as_4d(weights, "weights")]


def _entropy(p: Tensor) -> Tensor:
    """Row entropy in nats of ``p (..., M)`` (0 log 0 = 0)."""
    return -(p * torch.log(p.clamp_min(1e-300))).sum(-1)


def pattern_scores(
    w: Tensor,
    specials: Sequence[int] = (0,),
    *,
    band: int = 2,
    global_fraction: float = 0.1,
) -> tuple[dict[str, float], float, float]:
    """Pattern scores, mean entropy and mean distance of one head.

    Args:
        w: weights ``(B, N, M)`` (or ``(N, M)``) of one head; rows sum to 1 or are all 0.
        specials: key positions counted as sinks (first token, separators).
        band: half-width of the ``local`` band.
        global_fraction: fraction of the keys counted as the few ``global`` positions.

    Returns:
        ``(scores, entropy, mean_distance)``: scores keyed by :data:`PATTERNS`.
    """
    w = torch.as_tensor(w).double()
    if w.ndim == 2:
        w = w.unsqueeze(0)  # (B, N, M)
    if w.ndim != 3:
        raise ValueError(f"w must be (N, M) or (B, N, M), got shape {tuple(w.shape)}")
    _, n, m = w.shape
    valid = w.sum(-1) > 0.5  # (B, N): rows that carry a distribution
    nv = int(valid.sum())
    if nv == 0:
        return {p: 0.0 for p in PATTERNS}, 0.0, 0.0
    pos = torch.arange(n, dtype=torch.float64).view(n, 1) + (m - n)  # (N, 1) key position of each query
    keys = torch.arange(m, dtype=torch.float64).view(1, m)  # (1, M)
    off = keys - pos  # (N, M) signed offset key - query

    def mean_rows(x: Tensor) -> float:  # x (B, N)
        return float(x[valid].sum() / nv)

    sc = {
        "self": mean_rows((w * (off == 0)).sum(-1)),
        "previous": mean_rows((w * (off == -1)).sum(-1)),
        "next": mean_rows((w * (off == 1)).sum(-1)),
        "local": mean_rows((w * (off.abs() <= band)).sum(-1)),
    }
    spec = torch.zeros(m, dtype=torch.bool)
    spec[[s for s in specials if 0 <= s < m]] = True
    sc["sink"] = mean_rows(w[..., spec].sum(-1))
    received = (w * valid.unsqueeze(-1)).sum(dim=(0, 1))  # (M,)
    received[spec] = -1.0
    g = min(max(1, math.ceil(global_fraction * m)), int((~spec).sum()))
    if g > 0:
        top = received.topk(g).indices
        sc["global"] = mean_rows(w[..., top].sum(-1))
    else:
        sc["global"] = 0.0
    allowed = (w > 0).sum(-1).clamp_min(2).double()  # (B, N); weights underflowing to 0 count as masked
    ent = _entropy(w)  # (B, N)
    sc["broad"] = mean_rows((ent / torch.log(allowed)).clamp(0.0, 1.0))
    dist = mean_rows((w * off.abs()).sum(-1))
    return {p: sc[p] for p in PATTERNS}, mean_rows(ent), dist


def _label(scores: dict[str, float], margin: float, min_score: float, sink_threshold: float,
           broad_min: float) -> tuple[str, float]:
    if scores["sink"] >= sink_threshold:
        return "sink", scores["sink"]
    cand = {p: s for p, s in scores.items() if s >= (broad_min if p == "broad" else min_score)}
    if not cand:
        return "mixed", max(scores.values())
    best = max(cand.values())
    for p in PATTERNS:
        if p in cand and cand[p] >= best - margin:
            return p, cand[p]
    raise AssertionError("unreachable: the best pattern is within the margin of itself")


def analyze_heads(
    weights,
    tokens: Sequence[str] | None = None,
    *,
    specials: Sequence[int] | None = None,
    band: int = 2,
    global_fraction: float = 0.1,
    margin: float = 0.1,
    min_score: float = 0.4,
    sink_threshold: float = 0.5,
    broad_min: float = 0.8,
) -> list[HeadStats]:
    """Entropy, mean distance, pattern label and abnormal flag of every head.

    Args:
        weights: attention weights: one tensor ``(B, H, N, M)`` / ``(H, N, M)`` /
            ``(N, M)``, or a sequence of them (one per layer, as models return with
            ``return_weights=True``). Fully masked rows (all zero) are skipped.
        tokens: key tokens; separators among them (:data:`SEPARATOR_TOKENS`) count as sinks.
        specials: explicit sink positions (overrides ``tokens``; default: first token
            plus separators found in ``tokens``).
        band: half-width of the ``local`` band.
        global_fraction: fraction of keys counted as ``global`` positions.
        margin: a more specific pattern wins when within ``margin`` of the best score.
        min_score: below this best score the head is ``mixed``.
        sink_threshold: sink mass at or above which a head is flagged ``abnormal``
            (and labelled ``sink`` whatever else it scores).
        broad_min: the ``broad`` label needs at least this normalized entropy.

    Returns:
        One :class:`HeadStats` per (layer, head), layer-major.
    """
    for name, val, lo, hi in (("global_fraction", global_fraction, 0.0, 1.0), ("margin", margin, 0.0, 1.0),
                              ("min_score", min_score, 0.0, 1.0), ("sink_threshold", sink_threshold, 0.0, 1.0),
                              ("broad_min", broad_min, 0.0, 1.0)):
        if not lo <= val <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {val!r}")
    if not isinstance(band, int) or band < 0:
        raise ValueError(f"band must be a non-negative int, got {band!r}")
    layers = _layers(weights)
    out = []
    for li, w in enumerate(layers):
        m = w.shape[-1]
        spec = list(specials) if specials is not None else special_positions(tokens, m)
        for h in range(w.shape[1]):
            sc, ent, dist = pattern_scores(w[:, h], spec, band=band, global_fraction=global_fraction)
            label, score = _label(sc, margin, min_score, sink_threshold, broad_min)
            out.append(HeadStats(li, h, ent, dist, label, score, sc, sc["sink"], sc["sink"] >= sink_threshold))
    return out


def head_similarity(weights, *, metric: str = "js", block: int | None = None) -> Tensor:
    """Similarity between every pair of heads of every layer, ``(L*H, L*H)`` (layer-major).

    Args:
        weights: as in :func:`analyze_heads`; all layers must share ``(B, N, M)``.
        metric: ``"js"``: ``1 - JS / log 2`` averaged over valid query rows, where JS is
            the Jensen-Shannon divergence of the two heads' rows (1 = same distributions,
            0 = disjoint supports); ``"cosine"``: cosine of the flattened maps.
        block: heads compared at once (memory ``block^2 B N M``; default keeps it
            near 2^24 elements).

    Returns:
        A symmetric float64 matrix with ones on the diagonal.
    """
    layers = _layers(weights)
    shapes = {tuple(w.shape[i] for i in (0, 2, 3)) for w in layers}
    if len(shapes) != 1:
        raise ValueError(f"weights must share (B, N, M) across layers, got {sorted(shapes)}")
    allh = torch.cat([w.transpose(0, 1) for w in layers], dim=0)  # (L*H, B, N, M)
    n_heads = allh.shape[0]
    if metric == "cosine":
        flat = allh.reshape(n_heads, -1)  # (L*H, B*N*M)
        flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-300)
        return (flat @ flat.T).clamp(-1.0, 1.0)
    if metric != "js":
        raise ValueError(f"metric must be 'js' or 'cosine', got {metric!r}")
    valid = (allh.sum(-1) > 0.5).all(dim=0)  # (B, N): rows valid in every head
    nv = max(1, int(valid.sum()))
    rows = allh[:, valid]  # (L*H, R, M)
    ent = _entropy(rows)  # (L*H, R)
    if block is None:
        block = max(1, int(math.sqrt((1 << 24) / max(1, rows.shape[1] * rows.shape[2]))))
    sim = torch.empty(n_heads, n_heads, dtype=torch.float64)
    for a0 in range(0, n_heads, block):
        a = rows[a0:a0 + block]  # (ba, R, M)
        for b0 in range(0, n_heads, block):
            b = rows[b0:b0 + block]  # (bb, R, M)
            mix = 0.5 * (a.unsqueeze(1) + b.unsqueeze(0))  # (ba, bb, R, M)
            js = _entropy(mix) - 0.5 * (ent[a0:a0 + block].unsqueeze(1) + ent[b0:b0 + block].unsqueeze(0))
            sim[a0:a0 + block, b0:b0 + block] = 1.0 - js.clamp_min(0).sum(-1) / (nv * math.log(2.0))
    sim = 0.5 * (sim + sim.T)
    sim.fill_diagonal_(1.0)
    return sim.clamp(0.0, 1.0)


def redundant_heads(sim: Tensor, heads_per_layer: int, threshold: float = 0.9) -> list[tuple[tuple[int, int], tuple[int, int], float]]:
    """Pairs of heads whose similarity is at least ``threshold``, most similar first.

    Returns:
        ``[((layer_a, head_a), (layer_b, head_b), similarity), ...]`` with ``a < b``.
    """
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"sim must be a square matrix, got shape {tuple(sim.shape)}")
    if heads_per_layer < 1 or sim.shape[0] % heads_per_layer:
        raise ValueError(f"heads_per_layer must divide {sim.shape[0]}, got {heads_per_layer!r}")
    i, j = torch.triu_indices(sim.shape[0], sim.shape[0], offset=1)
    vals = sim[i, j]
    keep = vals >= threshold
    pairs = sorted(zip(i[keep].tolist(), j[keep].tolist(), vals[keep].tolist()), key=lambda t: -t[2])
    h = heads_per_layer
    return [((a // h, a % h), (b // h, b % h), float(s)) for a, b, s in pairs]


def format_head_table(stats: Sequence[HeadStats]) -> str:
    """A plain-text table: layer, head, label, score, entropy, distance, sink mass, flag."""
    lines = [f"{'layer':>5} {'head':>4}  {'pattern':<9} {'score':>5}  {'entropy':>7}  {'distance':>8}  {'sink':>5}  flag"]
    for s in stats:
        flag = "ABNORMAL (sink)" if s.abnormal else ""
        lines.append(
            f"{s.layer:>5} {s.head:>4}  {s.label:<9} {s.score:>5.2f}  {s.entropy:>7.3f}  {s.mean_distance:>8.2f}"
            f"  {s.sink_mass:>5.2f}  {flag}".rstrip()
        )
    return "\n".join(lines)
