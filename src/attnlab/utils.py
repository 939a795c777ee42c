"""Small helpers on torch modules that several layers share (models, tasks, train, viz, bench).

This module imports nothing from attnlab, so every layer may use it; the import contract
in ``pyproject.toml`` keeps it at the bottom.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["eval_mode"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode (no dropout) for the block, then back in the mode it was in."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)
