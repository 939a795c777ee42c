"""Pictures of learned attention spans (adaptive span): each head's span over training, and per layer at the end.

The trainer writes every mechanism's :meth:`~attnlab.mechanisms.Mechanism.log_values` into each
training record of ``metrics.jsonl``; for ``adaptive-span`` that is ``"spans": [[z per head] per
layer]`` in positions. :func:`span_history` reads them back; :func:`plot_spans` draws the two
pictures of Sukhbaatar et al., 2019: the spans against the step (one line per head, a colour per
layer) and the final span of every head, grouped by layer.

Time and memory O(records x layers x heads). Shape legend: ``L`` layers, ``H`` heads, ``T`` log steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..train import read_metrics
from .plots import require_matplotlib

__all__ = ["plot_spans", "span_history"]


def span_history(run: str | Path | list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """``(steps (T,), spans (T, L, H))`` from a run directory, its ``metrics.jsonl`` or its records.

    Raises:
        ValueError: when no training record holds ``spans`` (the run's attention is not adaptive-span).
    """
    if isinstance(run, (str, Path)):
        p = Path(run)
        records = read_metrics(p / "metrics.jsonl" if p.is_dir() else p)
    else:
        records = run
    rows = [r for r in records if r.get("split") == "train" and r.get("spans")]
    if not rows:
        raise ValueError(f"run: no training record with spans in {run if isinstance(run, (str, Path)) else 'records'}"
                         " (train with --attention adaptive-span)")
    steps = np.array([r["step"] for r in rows])  # (T,)
    return steps, np.array([r["spans"] for r in rows], dtype=float)  # (T, L, H)


def plot_spans(run: str | Path | list[dict[str, Any]], *, context: int | None = None, title: str | None = None,
               path: str | Path | None = None, dpi: int = 120):
    """Draw each head's span over training (left) and every head's final span by layer (right).

    Args:
        run: a run directory, its ``metrics.jsonl`` or its records (:func:`span_history`).
        context: the training context, drawn as a dotted line (and the mean span's share of it).
        title: the figure's title (default: the mean final span).
        path: save there and return the path.

    Returns:
        The ``Figure`` (or ``path``).
    """
    plt = require_matplotlib()
    steps, spans = span_history(run)  # (T,), (T, L, H)
    L, H = spans.shape[1], spans.shape[2]
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, max(L, 1)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 3.8), dpi=dpi, gridspec_kw={"width_ratios": [3, 2]})
    for layer in range(L):
        for head in range(H):
            left.plot(steps, spans[:, layer, head], color=colours[layer], lw=1.0,
                      label=f"layer {layer}" if head == 0 else None)
    left.set_xlabel("step")
    left.set_ylabel("span (positions)")
    left.set_title("each head's span over training")
    left.legend(fontsize=7)
    final = spans[-1]  # (L, H)
    width = 0.8 / H
    for head in range(H):
        right.bar(np.arange(L) + (head - (H - 1) / 2) * width, final[:, head], width=width,
                  color=colours, edgecolor="white", lw=0.3)
    right.set_xticks(np.arange(L), [str(i) for i in range(L)])
    right.set_xlabel("layer (a bar per head)")
    right.set_ylabel("span (positions)")
    right.set_title(f"spans at step {int(steps[-1])}")
    for ax in (left, right):
        if context is not None:
            ax.axhline(context, color="grey", ls=":", lw=0.8)
    mean = float(final.mean())
    share = f" ({100 * mean / context:.1f}% of the context {context})" if context else ""
    fig.suptitle(title or f"adaptive span: mean final span {mean:.1f}{share}", fontsize=10)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        return path
    return fig
