"""Small helpers on torch modules that several layers share (models, tasks, train, viz, bench).

This module imports nothing from attnlab, so every layer may use it; the import contract
in ``pyproject.toml`` keeps it at the bottom.
"""

from __future__ import annotations

import contextlib
import platform
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn

__all__ = ["cpu_model", "eval_mode", "sparse_csr", "to_sparse_csr"]


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
