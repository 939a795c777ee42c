"""A video classifier whose variants differ only in attention: joint, divided, space-only, axial.

Frames are cut into ``P x P`` patches (one strided convolution shared by all frames), the
``(T, H, W)`` tokens (attnlab's layout, :mod:`attnlab.masks.structured`) get a 3-D sin-cos
code (or TimeSformer's learned time and space embeddings), ``layers`` pre-norm blocks run (an attention sub-block, then a feed-forward one), a
final norm, the mean over all (real) tokens and a linear head give the class scores. The
attention sub-block is the one thing ``VideoConfig.attention`` changes:

* ``joint``: every token sees every token, ``x + attn(norm(x))``, O((T H W)^2) per head;
* ``divided``: :class:`attnlab.layers.DividedSpaceTimeAttention` (TimeSformer: time, then
  space, each residual), O(T H W (T + H W));
* ``space``: ``x + attn(norm(x))`` within the frame (:func:`attnlab.masks.same_frame`): frames
  meet only in the final mean, which cannot tell their order, so the model cannot see motion;
* ``axial``: :class:`attnlab.layers.AxialAttention` over time, rows, then columns, O(T H W (T + H + W)).

No class token: every variant pools the same way. Time per layer O(B n dim^2) for the
projections and feed-forward plus the attention's; memory O(layers B n dim).

Shape legend: ``B`` batch, ``T`` frames, ``C`` channels, ``S`` frame side, ``P`` patch side,
``H = W = S / P``, ``n = T H W`` tokens, ``dim`` width, ``K`` classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .. import masks
from ..layers import AxialAttention, DividedSpaceTimeAttention, MultiHeadAttention
from ..layers.spacetime import frame_counts
from ..positional import SinusoidalND
from .blocks import FeedForward, build_mechanism
from .config import VideoConfig
from .io import PretrainedMixin, register_model

__all__ = ["VideoTransformer", "VideoOutput"]


@dataclass
class VideoOutput:
    """What :class:`VideoTransformer` returns.

    Attributes:
        logits: ``(B, K)``.
        last_hidden_state: ``(B, n, dim)`` in the ``(T, H, W)`` layout.
        attentions: always None (the structured variants run several attentions per layer).
    """

    logits: Tensor
    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None = None


class _VideoBlock(nn.Module):
    """The attention sub-block ``cfg.attention`` names, then a pre-norm feed-forward sub-block."""

    def __init__(self, cfg: VideoConfig):
        super().__init__()
        self.kind = cfg.attention
        backend = cfg.mechanism_settings.get("backend", "auto")
        if self.kind in ("joint", "space"):
            self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
            self.attn = MultiHeadAttention(cfg.dim, cfg.heads, kv_heads=cfg.kv_heads, bias=cfg.bias,
                                           mechanism=build_mechanism(cfg))
        elif self.kind == "divided":
            self.attn = DividedSpaceTimeAttention(cfg.dim, cfg.heads, dropout=cfg.dropout, norm_eps=cfg.norm_eps,
                                                  backend=backend)
        else:
            self.attn = AxialAttention(cfg.dim, cfg.heads, ndim=3, dropout=cfg.dropout, norm_eps=cfg.norm_eps,
                                       backend=backend)
        self.ff_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.ff = FeedForward(cfg.dim, cfg.ff, cfg.activation, cfg.dropout, cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, shape: tuple[int, int, int], frames: Tensor | None) -> Tensor:
        keep = None if frames is None else masks.padding(frames * (shape[1] * shape[2]))
        if self.kind == "joint":
            x = x + self.drop(self.attn(self.norm(x), mask=keep))
        elif self.kind == "space":
            frame = masks.same_frame(shape)
            x = x + self.drop(self.attn(self.norm(x), mask=frame if keep is None else frame & keep))
        elif self.kind == "divided":
            x = self.attn(x, shape, frames=frames)
        else:
            x = self.attn(x, shape, mask=keep)
        return x + self.drop(self.ff(self.ff_norm(x)))


@register_model
class VideoTransformer(PretrainedMixin, nn.Module):
    """Patch embedding, 3-D positions, blocks of the configured attention, mean pooling, head.

    Args:
        config: a :class:`~attnlab.models.config.VideoConfig`.
    """

    config_class = VideoConfig

    def __init__(self, config: VideoConfig):
        super().__init__()
        if not isinstance(config, VideoConfig):
            raise ValueError(f"config must be a VideoConfig, got {type(config).__name__}")
        self.config = config
        self.patches = nn.Conv2d(config.channels, config.dim, kernel_size=config.patch_size, stride=config.patch_size)
        coded = 6 * (config.dim // 6)  # SinusoidalND gives each of the 3 axes sin/cos pairs
        self.code = SinusoidalND(coded, config.grid) if config.positional == "sinusoidal" and coded else None
        if config.positional == "learned":  # TimeSformer's: one vector per frame, one per patch position
            t, h, w = config.grid
            self.time_embed = nn.Parameter(torch.randn(t, 1, config.dim) * 0.5)  # (T, 1, dim)
            self.space_embed = nn.Parameter(torch.randn(1, h * w, config.dim) * 0.5)  # (1, H W, dim)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(_VideoBlock(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes)

    def forward(self, videos: Tensor, frames=None, *, return_weights: bool = False) -> VideoOutput:
        """Class scores of ``videos (B, T, C, S, S)``.

        Args:
            videos: the frames, ``(B, t, C, S, S)`` with ``t <= T``: a shorter video gets the positions
                of the first ``t`` frames, so a model built for ``T`` frames trains on shorter videos
                first (a length curriculum) and is the same model at every ``t``.
            frames: real frames per video ``(B,)`` (the rest is padding), or None (all ``t``).
            return_weights: not offered (raises ValueError): the structured variants run
                several attentions per layer.
        """
        c, s, most = self.config.channels, self.config.image_size, self.config.frames
        if (not isinstance(videos, Tensor) or videos.ndim != 5 or tuple(videos.shape[2:]) != (c, s, s)
                or not 1 <= videos.shape[1] <= most):
            shape = tuple(videos.shape) if isinstance(videos, Tensor) else type(videos).__name__
            raise ValueError(f"videos must have shape (batch, t, {c}, {s}, {s}) with 1 <= t <= {most}, got {shape}")
        if return_weights:
            raise ValueError("VideoTransformer does not return attention weights")
        b, t = videos.shape[:2]
        shape = (t, *self.config.grid[1:])  # (t, H, W): a shorter video is the first t frames' tokens
        real = frame_counts(frames, b, t, videos.device)
        x = self.patches(videos.reshape(b * t, c, s, s))  # (B T, dim, H, W)
        x = x.flatten(2).transpose(1, 2).reshape(b, -1, self.config.dim)  # (B, n, dim): frame after frame
        if self.code is not None:
            pe = self.code.table()[: x.shape[1]]  # (n, coded): time is the slowest axis, so the first t frames
            x = x + F.pad(pe, (0, self.config.dim - pe.shape[1])).to(x.dtype)
        elif self.config.positional == "learned":
            pe = (self.time_embed[:t] + self.space_embed).reshape(1, -1, self.config.dim)  # (1, n, dim): frame by frame
            x = x + pe
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x, shape, real)
        x = self.final_norm(x)
        if real is None:
            pooled = x.mean(1)  # (B, dim)
        else:
            per_frame = shape[1] * shape[2]
            w = (torch.arange(x.shape[1], device=x.device) < (real * per_frame)[:, None]).to(x.dtype)  # (B, n)
            pooled = (x * w[..., None]).sum(1) / w.sum(1, keepdim=True)
        return VideoOutput(self.head(pooled), x)

    def loss(self, videos: Tensor, labels: Tensor) -> Tensor:
        """Cross-entropy of the class scores against ``labels (B,)``."""
        return F.cross_entropy(self(videos).logits, labels)
