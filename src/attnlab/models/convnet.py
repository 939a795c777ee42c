"""A small convolutional classifier: the whole-image baseline of the glimpse models.

``layers`` blocks of a 3x3 convolution (padding 1) and ReLU, each but the last followed by
2x2 max pooling, with ``dim, 2 dim, 4 dim, ...`` channels; then the mean over the remaining
positions (translation invariant: a digit anywhere on a canvas reads the same) and a linear
head. It sees every pixel of the image: what :class:`~attnlab.models.RecurrentAttention`'s
glimpses are compared against.

Time per image O(sum_i (S / 2^i)^2 9 dim_i dim_{i-1}); memory O(B dim S^2).
Shape legend: ``B`` batch, ``C`` channels, ``S`` image side, ``K`` classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .common import check_images
from .config import ConvConfig
from .io import PretrainedMixin, register_model

__all__ = ["ConvClassifier", "ConvOutput"]


@dataclass
class ConvOutput:
    """What :class:`ConvClassifier` returns.

    Attributes:
        logits: ``(B, K)``.
        attentions: always None (the trainer's interface).
    """

    logits: Tensor
    attentions: tuple[Tensor, ...] | None = None


@register_model
class ConvClassifier(PretrainedMixin, nn.Module):
    """Convolution blocks, a global mean and a linear head.

    Args:
        config: a :class:`~attnlab.models.config.ConvConfig`.
    """

    config_class = ConvConfig

    def __init__(self, config: ConvConfig):
        self._keep_config(config)
        widths = [config.channels] + [config.dim * 2 ** i for i in range(config.layers)]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(widths[:-1], widths[1:]))
        self.drop = nn.Dropout(config.dropout)
        self.head = nn.Linear(widths[-1], config.num_classes)

    def forward(self, images: Tensor) -> ConvOutput:
        """Class scores of ``images (B, C, S, S)``."""
        c = self.config
        check_images(images, c.channels, c.image_size)
        x = images
        for i, conv in enumerate(self.convs):
            x = F.relu(conv(x))  # (B, dim 2^i, S / 2^i, S / 2^i)
            if i < len(self.convs) - 1:
                x = F.max_pool2d(x, 2)  # (B, dim 2^i, S / 2^(i+1), S / 2^(i+1))
        return ConvOutput(self.head(self.drop(x.mean((2, 3)))))  # (B, K)
