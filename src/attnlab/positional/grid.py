"""N-dimensional sinusoidal positions for image patches (2-D) and video grids (3-D).

The 1-D sinusoidal code of Vaswani et al. (2017) applied per axis, as in the 2-D
sin-cos embedding of MAE (He et al., 2022) and its 3-D (time, height, width) extension
for video (Feichtenhofer et al., 2022, "Masked Autoencoders As Spatiotemporal
Learners"). Tokens are the grid cells flattened row-major (the last axis varies
fastest): cell ``(t, h, w)`` of grid ``(T, H, W)`` is token ``t*H*W + h*W + w``, the
order of ``x.flatten(2).transpose(1, 2)`` on a ``(B, C, T, H, W)`` feature map.

Split of the width. With ``k = len(grid)`` axes the ``dim`` channels are cut into
``k`` equal contiguous slices of ``dim // k`` channels; slice ``a`` holds the 1-D
sinusoidal code (:func:`attnlab.positional.absolute.sinusoidal_table`, sin/cos
interleaved) of the cell's coordinate along axis ``a``. So ``dim`` must be divisible
by ``2 * k`` (every slice needs sin/cos pairs): 2-D needs a multiple of 4, 3-D of 6.

Time O(B N dim) per call, memory O(N dim) for the table, ``N = prod(grid)``.
Shape legend: ``B`` batch, ``N`` tokens (grid cells), ``dim`` model width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .absolute import _check_offset, _check_x, sinusoidal_table

__all__ = ["SinusoidalND"]


class SinusoidalND(nn.Module):
    """Fixed sinusoidal codes for the cells of a ``(H, W)`` or ``(T, H, W)`` grid.

    Args:
        dim: model width; a multiple of ``2 * len(grid)``.
        grid: size of each axis, e.g. ``(14, 14)`` patches or ``(8, 14, 14)`` frames x
            patches. Any number of axes >= 1 works (one axis is the 1-D code).
        base: wavelength base of every axis (10000 as in 1-D).
    """

    def __init__(self, dim: int, grid: Sequence[int], base: float = 10000.0):
        super().__init__()
        grid = tuple(grid)
        if not grid or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid):
            raise ValueError(f"grid must be a non-empty sequence of positive ints, got {grid!r}")
        k = len(grid)
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1 or dim % (2 * k) != 0:
            raise ValueError(
                f"dim must be a positive multiple of 2 * len(grid) = {2 * k} (each of the {k} axes gets "
                f"dim // {k} channels of sin/cos pairs), got dim={dim!r} for grid={grid}"
            )
        if not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"base must be a number > 1, got {base!r}")
        self.dim, self.grid, self.base = dim, grid, float(base)
        self.register_buffer("_table", torch.empty(0, dim, dtype=torch.float64), persistent=False)  # (N, dim)

    @property
    def num_positions(self) -> int:
        """Number of grid cells ``prod(grid)``."""
        return math.prod(self.grid)

    def table(self) -> Tensor:
        """Codes of every cell, flattened row-major: ``(prod(grid), dim)`` (float64)."""
        if self._table.shape[0] != self.num_positions:
            dev = self._table.device
            per_axis = self.dim // len(self.grid)
            coords = torch.meshgrid(*[torch.arange(g, device=dev) for g in self.grid], indexing="ij")
            parts = [sinusoidal_table(c.reshape(-1), per_axis, self.base) for c in coords]  # each (N, dim/k)
            self._table = torch.cat(parts, dim=1).to(self._table.dtype)  # (N, dim)
        return self._table

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (B, N, dim) -> x + table()[offset : offset + N]``.

        ``offset`` is the flattened index of ``x[:, 0]`` (for decoding a grid cell by
        cell with a KV cache); ``offset + N`` may not exceed ``prod(grid)``.
        """
        _check_x(x, self.dim)
        _check_offset(offset)
        n = x.shape[1]
        if offset + n > self.num_positions:
            raise ValueError(
                f"x has {n} tokens at offset {offset} but grid {self.grid} has only "
                f"{self.num_positions} cells (prod(grid))"
            )
        pe = self.table()[offset : offset + n]  # (N, dim)
        return x + pe.to(device=x.device, dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid={self.grid}, base={self.base:g}"
