"""Small helpers on torch modules that several layers share (models, tasks, train, viz, bench).

This module imports nothing from attnlab, so every layer may use it; the import contract
in ``pyproject.toml`` keeps it at the bottom.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator

from torch import nn

__all__ = ["cpu_model", "eval_mode"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode (no dropout) for the block, then back in the mode it was in."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where it exists, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
