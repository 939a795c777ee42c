"""Several seeds of one run, and the mean and standard deviation of their final metrics.

``attnlab train TASK --seeds N`` trains the run spec with seeds ``s, s+1, ..., s+N-1`` (``s``
the spec's seed, default 0), each into ``OUT/seed-S``, and writes ``OUT/seeds.json``: every
run's final metrics and, per split and metric, the mean, the sample standard deviation
(``N - 1`` in the denominator; 0 for one run) and the values. Papers report small-data results
so (GAT: mean and std over 100 runs), since one seed's accuracy varies by a point or more.

Time: N runs, one after the other.
"""

from __future__ import annotations

import json
import statistics
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils import positive_int
from .config import RunSpec, TrainResult
from .trainer import train

__all__ = ["SeedsResult", "format_summary", "train_seeds"]


@dataclass
class SeedsResult:
    """What :func:`train_seeds` returns.

    Attributes:
        seeds: the seeds, in order.
        runs: each seed's :class:`~attnlab.train.config.TrainResult`.
        summary: ``{split: {metric: {"mean", "std", "values"}}}`` over the runs.
    """

    seeds: list[int]
    runs: list[TrainResult]
    summary: dict[str, dict[str, dict[str, Any]]]

    def to_dict(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "summary": self.summary,
                "runs": [{"seed": s, "step": r.step, "best_step": r.best_step, "seconds": round(r.seconds, 2),
                          "metrics": r.metrics, "checkpoint": str(r.checkpoint) if r.checkpoint else None}
                         for s, r in zip(self.seeds, self.runs)]}


def _summary(runs: list[TrainResult]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for split in runs[0].metrics:
        for metric in runs[0].metrics[split]:
            values = [float(r.metrics[split][metric]) for r in runs if metric in r.metrics.get(split, {})]
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            out.setdefault(split, {})[metric] = {"mean": statistics.fmean(values), "std": std, "values": values}
    return out


def train_seeds(spec: RunSpec, out: str | Path, n: int, *, quiet: bool = False) -> SeedsResult:
    """Train ``spec`` with ``n`` consecutive seeds into ``out/seed-S``; summarize their final metrics.

    Raises:
        ValueError: when ``n < 1``, or from the runs themselves.
    """
    positive_int(n, "seeds")
    out = Path(out)
    first = int(spec.train.get("seed", 0))
    seeds = list(range(first, first + n))
    runs = []
    for s in seeds:
        one = deepcopy(spec)
        one.train["seed"] = s
        runs.append(train(one, out / f"seed-{s}", quiet=quiet))
    result = SeedsResult(seeds, runs, _summary(runs) if runs[0].metrics else {})
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    return result


def format_summary(result: SeedsResult) -> list[str]:
    """One line per split and metric: ``test accuracy 0.8310 +- 0.0052 (10 seeds: 0..9)``."""
    span = f"{result.seeds[0]}..{result.seeds[-1]}" if len(result.seeds) > 1 else str(result.seeds[0])
    return [f"{split} {metric} {v['mean']:.4f} +- {v['std']:.4f} ({len(v['values'])} seeds: {span})"
            for split, metrics in result.summary.items() for metric, v in metrics.items()]
