"""Axial attention: one attention pass along each axis of a grid, in turn.

Ho, Kalchbrenner, Weissenborn and Salimans, 2019, "Axial Attention in Multidimensional
Transformers". Over the tokens of an ``(H, W)`` image or a ``(T, H, W)`` video (attnlab's
layout, :mod:`attnlab.masks.structured`), axis by axis, first to last:
``x = x + attn_a(norm_a(x))`` with ``attn_a`` restricted to :func:`attnlab.masks.axial`
``(shape, a)``: the positions that differ from the query only along axis ``a``.

Sequential, not summed. After the row pass every token holds a summary of its row, so the
column pass that follows reaches the whole image: one layer covers the grid in two hops (three
for a video), as divided space-time attention does. Summing independent passes over the
same input (``x + sum_a attn_a(x)``, lucidrains/axial-attention's default) reaches only the
cross of a token's row and column in one layer, so it needs a second layer to cover what one
sequential layer covers, at the same cost per layer.

Every pass is a mask that is a pure reshape, which ``auto`` runs on the ``regroup`` backend:
time O(B heads N (sum of the axes) D) instead of O(B heads N^2 D).

Shape legend: ``B`` batch, ``N`` = prod(shape) tokens, ``dim`` width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from .. import masks
from ..mechanisms import Exact
from .multihead import MultiHeadAttention

__all__ = ["AxialAttention"]


class AxialAttention(nn.Module):
    """One pre-norm residual attention pass per axis, in order (see the module docstring).

    Args:
        dim: token width.
        heads: heads of every pass.
        ndim: axes of the grids it receives (2 for images, 3 for videos); one pass each.
        dropout: dropout on every residual branch (training mode only).
        norm_eps: LayerNorm epsilon.
        backend: exact attention backend (``auto`` regroups the passes).
    """

    def __init__(self, dim: int, heads: int, ndim: int = 2, *, dropout: float = 0.0, norm_eps: float = 1e-5,
                 backend: str = "auto"):
        super().__init__()
        if not isinstance(ndim, int) or isinstance(ndim, bool) or not 1 <= ndim <= 4:
            raise ValueError(f"ndim must be an int in [1, 4] (2 for images, 3 for videos), got {ndim!r}")
        self.dim, self.heads, self.ndim = dim, heads, ndim
        self.norms = nn.ModuleList(nn.LayerNorm(dim, eps=norm_eps) for _ in range(ndim))
        self.attns = nn.ModuleList(MultiHeadAttention(dim, heads, mechanism=Exact(backend=backend)) for _ in range(ndim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, shape: Sequence[int], *, mask=None) -> Tensor:
        """``x (B, N, dim) -> (B, N, dim)``, residuals included.

        Args:
            x: tokens of a grid of ``shape`` in the row-major layout.
            shape: ``ndim`` sizes whose product is ``N``.
            mask: a key mask to add to every pass (``masks.padding(...)`` for padded frames).

        Raises:
            ValueError: for a shape of the wrong rank or whose product is not ``N``.
        """
        shape = tuple(shape)
        if len(shape) != self.ndim:
            raise ValueError(f"shape must have {self.ndim} axes (this layer's ndim), got {shape!r}")
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (batch, tokens, {self.dim}), got {got}")
        if math.prod(shape) != x.shape[1]:
            raise ValueError(f"shape {shape} has {math.prod(shape)} positions but x holds {x.shape[1]} tokens")
        for axis, (norm, attn) in enumerate(zip(self.norms, self.attns)):
            along = masks.axial(shape, axis)
            x = x + self.drop(attn(norm(x), mask=along if mask is None else along & mask))
        return x

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, ndim={self.ndim}"
