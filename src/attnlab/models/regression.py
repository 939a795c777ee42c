"""A causal Transformer that learns linear functions in context, from the pairs in its prompt.

Garg, Tsipras, Liang and Valiant, 2022, "What Can Transformers Learn In-Context? A Case
Study of Simple Function Classes". A prompt of ``k`` pairs ``(x_i, y_i)`` becomes ``2k``
tokens ``x_1, y_1, x_2, y_2, ...`` of width ``d + 1``: an x token is ``(0, x_i)`` and a
y token is ``(y_i, 0, ..., 0)``. A linear read-in maps them to the model width, a causal
encoder stack runs over them (token ``t`` sees tokens ``0..t``), and a linear read-out at
each x token predicts the ``y`` that follows it from the ``i - 1`` pairs before it and
``x_i`` itself: no weight changes between prompts, the function is learned from the prompt.

Time O(layers (B k dim^2 + B H k^2 D)); memory O(layers B k dim).
Shape legend: ``B`` batch, ``k`` pairs per prompt, ``d`` input dimension, ``dim`` width,
``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import masks
from .blocks import PositionalParts
from .config import RegressionConfig
from .encoder import Encoder
from .io import PretrainedMixin, register_model

__all__ = ["InContextRegressor", "RegressionOutput", "interleave"]


def interleave(xs: Tensor, ys: Tensor) -> Tensor:
    """``xs (B, k, d)``, ``ys (B, k)`` -> tokens ``(B, 2k, d + 1)``: ``(0, x_1), (y_1, 0), (0, x_2), ...``."""
    B, k, d = xs.shape
    x_tok = torch.cat([xs.new_zeros(B, k, 1), xs], dim=-1)  # (B, k, d + 1)
    y_tok = torch.cat([ys[..., None], ys.new_zeros(B, k, d)], dim=-1)  # (B, k, d + 1)
    return torch.stack([x_tok, y_tok], dim=2).reshape(B, 2 * k, d + 1)  # (B, 2k, d + 1)


@dataclass
class RegressionOutput:
    """What :class:`InContextRegressor` returns.

    Attributes:
        predictions: ``(B, k)``: entry ``i`` is the prediction of ``y_i`` from pairs ``< i`` and ``x_i``.
        attentions: with ``return_weights``, per layer ``(B, H, 2k, 2k)``.
    """

    predictions: Tensor
    attentions: tuple[Tensor, ...] | None = None


@register_model
class InContextRegressor(PretrainedMixin, nn.Module):
    """Read-in, causal Transformer encoder, read-out at the x tokens.

    Args:
        config: a :class:`~attnlab.models.config.RegressionConfig`.
    """

    config_class = RegressionConfig

    def __init__(self, config: RegressionConfig):
        self._keep_config(config)
        self.read_in = nn.Linear(config.n_dims + 1, config.dim)
        self.encoder = Encoder(config, PositionalParts(config, causal=True))
        self.read_out = nn.Linear(config.dim, 1)

    def forward(self, xs: Tensor, ys: Tensor, *, return_weights: bool = False) -> RegressionOutput:
        """Predictions of every ``y_i`` of prompts ``xs (B, k, d)``, ``ys (B, k)``."""
        d = self.config.n_dims
        if not isinstance(xs, Tensor) or xs.ndim != 3 or xs.shape[-1] != d:
            raise ValueError(f"xs must have shape (batch, pairs, n_dims={d}), got "
                             f"{tuple(xs.shape) if isinstance(xs, Tensor) else type(xs).__name__}")
        if not isinstance(ys, Tensor) or tuple(ys.shape) != tuple(xs.shape[:2]):
            raise ValueError(f"ys must have shape (batch, pairs) = {tuple(xs.shape[:2])}, got "
                             f"{tuple(ys.shape) if isinstance(ys, Tensor) else type(ys).__name__}")
        h = self.read_in(interleave(xs, ys))  # (B, 2k, dim)
        out = self.encoder(h, masks.causal(), return_weights=return_weights)
        pred = self.read_out(out.last_hidden_state[:, 0::2])[..., 0]  # (B, k): the x tokens
        return RegressionOutput(pred, out.attentions)
