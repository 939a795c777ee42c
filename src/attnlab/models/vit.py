"""Vision Transformer: images as sequences of patches.

Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words". The image is cut into
non-overlapping ``P x P`` patches, each linearly embedded (a strided convolution), a
learned class token is prepended, positions are added (2-D sin-cos code of the patch
grid, or learned), a Transformer encoder runs over the ``1 + (S/P)^2`` tokens and a
linear head reads the class token (or the mean of the patch tokens).

Time O(layers * (B N dim^2 + B H N^2 D)) with ``N = 1 + (S/P)^2``; memory O(layers B N dim).
Shape legend: ``B`` batch, ``C`` channels, ``S`` image side, ``P`` patch side, ``N``
tokens, ``H`` heads, ``D`` head dim, ``dim`` width, ``K`` classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..positional import SinusoidalND
from .blocks import PositionalParts
from .config import ViTConfig
from .encoder import Encoder
from .io import PretrainedMixin, register_model

__all__ = ["ViT", "ViTOutput", "PatchEmbedding"]


class PatchEmbedding(nn.Module):
    """``(B, C, S, S) -> (B, (S/P)^2, dim)``: one linear map per non-overlapping patch, row-major order."""

    def __init__(self, channels: int, dim: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        x = self.proj(images)  # (B, dim, S/P, S/P)
        return x.flatten(2).transpose(1, 2)  # (B, (S/P)^2, dim)


class _GridPositions(nn.Module):
    """2-D sin-cos codes added to the patch tokens (``x[:, 1:]``); the class token gets none."""

    def __init__(self, dim: int, grid: tuple[int, int]):
        super().__init__()
        self.code = SinusoidalND(dim, grid)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if offset != 0:
            raise ValueError(f"offset must be 0 for image tokens, got {offset}")
        return torch.cat([x[:, :1], self.code(x[:, 1:])], dim=1)  # (B, N, dim)


@dataclass
class ViTOutput:
    """What :class:`ViT` returns.

    Attributes:
        logits: ``(B, K)``.
        last_hidden_state: ``(B, N, dim)`` (token 0 is the class token).
        attentions: with ``return_weights``, per layer ``(B, H, N, N)``.
    """

    logits: Tensor
    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None = None


@register_model
class ViT(PretrainedMixin, nn.Module):
    """Patch embedding, class token, positions, encoder, classification head.

    Args:
        config: a :class:`~attnlab.models.config.ViTConfig`.
    """

    config_class = ViTConfig

    def __init__(self, config: ViTConfig):
        self._keep_config(config)
        self.patches = PatchEmbedding(config.channels, config.dim, config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))  # (1, 1, dim)
        nn.init.normal_(self.cls_token, std=0.02)
        absolute = _GridPositions(config.dim, config.grid) if config.positional == "sinusoidal" else None
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config, PositionalParts(config, causal=False, absolute=absolute))
        self.head = nn.Linear(config.dim, config.num_classes)

    def forward(self, images: Tensor, *, return_weights: bool = False) -> ViTOutput:
        """Class scores of ``images (B, C, S, S)``.

        ``return_weights`` also returns per-layer weights ``(B, H, N, N)``.
        """
        c, s = self.config.channels, self.config.image_size
        if not isinstance(images, Tensor) or images.ndim != 4 or tuple(images.shape[1:]) != (c, s, s):
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must have shape (batch, {c}, {s}, {s}), got {shape}")
        x = self.patches(images)  # (B, (S/P)^2, dim)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, N, dim)
        out = self.encoder(self.dropout(x), return_weights=return_weights)
        h = out.last_hidden_state
        pooled = h[:, 0] if self.config.pooling == "cls" else h[:, 1:].mean(dim=1)  # (B, dim)
        return ViTOutput(self.head(pooled), h, out.attentions)

    def loss(self, images: Tensor, labels: Tensor) -> Tensor:
        """Cross-entropy of the class scores against ``labels (B,)``."""
        return F.cross_entropy(self(images).logits, labels)
