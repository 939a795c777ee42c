"""Metrics of a run: one JSON object per line in ``metrics.jsonl``, optionally TensorBoard.

Each record holds ``step`` (steps completed), ``split`` (``train``, ``val``, ``test``)
and numbers (loss, learning rate, accuracy, BLEU, throughput, elapsed seconds).
Resuming a run truncates the file to the records at or before the checkpoint's step, so
the file of a killed-and-resumed run reads like the uninterrupted one. Time and memory
O(1) per record.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "read_metrics"]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file (a torn last line is skipped)."""
    out = []
    p = Path(path)
    if not p.is_file():
        return out
    for line in p.read_text().split("\n"):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsWriter:
    """Appends records to ``path``; mirrors scalars to TensorBoard when asked.

    Args:
        path: the JSONL file.
        tensorboard_dir: a directory for ``torch.utils.tensorboard`` event files, or None.
        enabled: False (ranks other than 0) writes nothing.
        truncate_after: keep only existing records with ``step <= truncate_after``
            (resume); None keeps the file as it is, ``-1`` empties it (a fresh run).
    """

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None, *, enabled: bool = True,
                 truncate_after: int | None = -1):
        self.path = Path(path)
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None:
            keep = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= truncate_after]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("--tensorboard needs the tensorboard package: pip install tensorboard") from e
            self._tb = SummaryWriter(str(tensorboard_dir))

    def write(self, step: int, split: str, **values: Any) -> dict[str, Any]:
        """Append one record and return it."""
        record = {"step": int(step), "split": split, **{k: _clean(v) for k, v in values.items()}}
        if not self.enabled:
            return record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{split}/{k}", v, step)
        return record

    def close(self) -> None:
        """Flush TensorBoard."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
