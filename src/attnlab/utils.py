"""Small helpers that several layers share: argument validators (every layer, config and suite), torch modules.

This module imports nothing from attnlab, so every layer may use it; the import contract
in ``pyproject.toml`` keeps it at the bottom.
"""

from __future__ import annotations

import contextlib
import platform
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["cpu_model", "eval_mode", "int_at_least", "positive_int", "positive_number", "probability", "sparse_csr",
           "to_sparse_csr"]


# -- argument validators: the one copy of each check, and of its error's words ----------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any, name: str, *, allow_none: bool = False) -> Any:
    """``value`` when it is an int >= 1 (or None, with ``allow_none``).

    Raises:
        ValueError: ``"{name} must be a positive int, got {value!r}"`` (``... or None``).
    """
    if value is None and allow_none:
        return None
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {value!r}")
    return value


def int_at_least(value: Any, name: str, minimum: int) -> int:
    """``value`` when it is an int >= ``minimum`` (:func:`positive_int` for a minimum of 1).

    Raises:
        ValueError: ``"{name} must be an int >= {minimum}, got {value!r}"``.
    """
    if minimum == 1:
        return positive_int(value, name)
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def positive_number(value: Any, name: str, *, allow_none: bool = False) -> Any:
    """``value`` when it is an int or float > 0 (or None, with ``allow_none``).

    Raises:
        ValueError: ``"{name} must be a positive number, got {value!r}"`` (``... or None``).
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a positive number{' or None' if allow_none else ''}, got {value!r}")
    return value


def probability(value: Any, name: str) -> Any:
    """``value`` when it is a number in [0, 1) (a dropout rate).

    Raises:
        ValueError: ``"{name} must be a number in [0, 1), got {value!r}"``.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return value


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


_csr_warned = False


def sparse_csr(crow: Tensor, col: Tensor, values: Tensor, shape) -> Tensor:
    """``torch.sparse_csr_tensor`` without its invariant checks and without PyTorch's once-per-process
    "sparse CSR is in beta" warning (the callers' kernels are tested against dense references)."""
    global _csr_warned
    if _csr_warned:
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)
    _csr_warned = True
    return out


def to_sparse_csr(x: Tensor) -> Tensor:
    """A dense ``(N, F)`` matrix as a sparse CSR one (through :func:`sparse_csr`: no beta warning)."""
    rows, cols = x.nonzero(as_tuple=True)  # row-major: sorted by row, then column
    crow = torch.zeros(x.shape[0] + 1, dtype=torch.int64, device=x.device)
    torch.cumsum(torch.bincount(rows, minlength=x.shape[0]), 0, out=crow[1:])
    return sparse_csr(crow, cols, x[rows, cols], x.shape)
