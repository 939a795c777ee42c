"""MaxViT's block and grid attention: self-attention in local windows, or across a sparse grid.

Tu et al., 2022, "MaxViT: Multi-Axis Vision Transformer". A MaxViT stage alternates
``kind="block"`` (windows of ``size`` cells: local mixing, :func:`attnlab.masks.block_2d`,
timm's ``window_partition``) and ``kind="grid"`` (a ``size`` grid of cells spread over the
whole image: global, dilated mixing, :func:`attnlab.masks.grid_2d`, timm's
``grid_partition``), each ``x = x + attn(norm(x))``. One layer with a ``kind``: the two
differ only in their mask, so they share every line of code.

When ``size`` divides the image the mask is a pure reshape and ``auto`` runs it on the
``regroup`` backend, ``G`` dense attentions of ``size_h x size_w`` cells: time
O(B heads N size_h size_w D). Otherwise ``chunked`` skips the mask's empty tiles.

Shape legend: ``B`` batch, ``N`` = H W (or T H W) tokens, ``dim`` width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from .. import masks
from ..mechanisms import Exact
from .multihead import MultiHeadAttention

__all__ = ["MaxViTAttention"]

_KINDS = ("block", "grid")


class MaxViTAttention(nn.Module):
    """A pre-norm residual attention over MaxViT's windows (``block``) or grid (``grid``).

    Args:
        dim: token width.
        heads: attention heads.
        size: window size (``block``) or grid size (``grid``), an int or ``(rows, columns)``
            (MaxViT uses 7).
        kind: ``"block"`` or ``"grid"``.
        dropout: dropout on the residual branch (training mode only).
        norm_eps: LayerNorm epsilon.
        backend: exact attention backend.
    """

    def __init__(self, dim: int, heads: int, size: int | tuple[int, int], kind: str = "block", *,
                 dropout: float = 0.0, norm_eps: float = 1e-5, backend: str = "auto"):
        super().__init__()
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {list(_KINDS)}, got {kind!r}")
        self.dim, self.heads, self.size, self.kind = dim, heads, size, kind
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadAttention(dim, heads, mechanism=Exact(backend=backend))
        self.drop = nn.Dropout(dropout)

    def mask(self, shape: Sequence[int]) -> masks.Mask:
        """The mask of this layer over a grid of ``shape`` (``(H, W)`` or ``(T, H, W)``)."""
        return (masks.block_2d if self.kind == "block" else masks.grid_2d)(shape, self.size)

    def forward(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """``x (B, N, dim) -> (B, N, dim)``, the residual included.

        Raises:
            ValueError: for a shape whose product is not ``N``, or a size larger than the shape.
        """
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (batch, tokens, {self.dim}), got {got}")
        mask = self.mask(shape)
        if math.prod(tuple(shape)) != x.shape[1]:
            raise ValueError(f"shape {tuple(shape)} has {math.prod(tuple(shape))} positions but x holds "
                             f"{x.shape[1]} tokens")
        return x + self.drop(self.attn(self.norm(x), mask=mask))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, size={self.size}, kind={self.kind!r}"
