"""Transformer encoder stack: positional parts, N encoder layers, final norm (pre-norm).

Vaswani et al., 2017, section 3.1 (the encoder). Bidirectional self-attention: every
position may see every kept position of its sequence. Takes embedded inputs (the model
owns the token/patch embedding) and adds the absolute position code itself.

Time O(layers * (B N dim^2 + mechanism)), O(B H N^2 D) with exact attention; memory
O(layers * B N dim) activations kept for backward (O(B N dim) per layer boundary with
``checkpointing``).

Shape legend: ``B`` batch, ``N`` sequence length, ``H`` heads, ``dim`` model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import masks
from .blocks import EncoderLayer, PositionalParts, checkpointed
from .config import TransformerConfig

__all__ = ["Encoder", "EncoderOutput", "as_key_mask"]


def as_key_mask(attention_mask, name: str = "attention_mask", length: int | None = None):
    """Turn a per-token keep mask into an :mod:`attnlab.masks` key mask.

    Args:
        attention_mask: None, an :class:`attnlab.masks.Mask` (returned as is), or a
            ``(B, N)`` bool/int tensor where True/1 marks a real token and False/0
            padding (the sign of Hugging Face's ``attention_mask``; "allowed", as in
            every attnlab mask).
        length: expected ``N`` (checked when given).
    """
    if attention_mask is None or isinstance(attention_mask, masks.Mask):
        return attention_mask
    if not isinstance(attention_mask, Tensor) or attention_mask.ndim != 2:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(f"{name} must be a (batch, seq) tensor with 1/True for real tokens, got {shape}")
    if attention_mask.dtype.is_floating_point:
        raise ValueError(f"{name} must be bool or integer (1/True = real token), got dtype {attention_mask.dtype}")
    if length is not None and attention_mask.shape[1] != length:
        raise ValueError(f"{name} covers {attention_mask.shape[1]} positions but the sequence has {length}")
    return masks.key_mask(attention_mask.bool())


@dataclass
class EncoderOutput:
    """What :class:`Encoder` returns.

    Attributes:
        last_hidden_state: ``(B, N, dim)``.
        hidden_states: with ``output_hidden_states``, a tuple of ``layers + 1`` tensors
            ``(B, N, dim)``: the embeddings (positions added) and each layer's output.
        attentions: with ``return_weights``, a tuple per layer of ``(B, H, N, N)``.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class Encoder(nn.Module):
    """A stack of :class:`EncoderLayer` with its positional encoding.

    Args:
        cfg: stack settings (``cfg.layers`` layers).
        positional: the positional parts to use (default: built from ``cfg``,
            bidirectional); a model passes its own to replace the absolute code.
    """

    def __init__(self, cfg: TransformerConfig, positional: PositionalParts | None = None):
        super().__init__()
        self.cfg = cfg
        self.positional = positional if positional is not None else PositionalParts(cfg, causal=False)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))
        self.final_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps) if cfg.norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        attention_mask=None,
        *,
        return_weights: bool = False,
        output_hidden_states: bool = False,
    ) -> EncoderOutput:
        """Encode embedded inputs.

        Args:
            x: ``(B, N, dim)`` embeddings (no positions added yet).
            attention_mask: ``(B, N)`` keep mask (1/True = real token) or an attnlab mask.
            return_weights: also return per-layer weights ``(B, H, N, N)``.
            output_hidden_states: also return the embeddings and every layer's output.
        """
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.cfg.dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (batch, seq, dim={self.cfg.dim}), got {shape}")
        n = x.shape[1]
        mask = as_key_mask(attention_mask, length=n)
        x = self.positional.embed(x, 0)
        bias = self.positional.bias(n, n)
        rotary = self.positional.rotary
        hidden = [x] if output_hidden_states else None
        attns = [] if return_weights else None
        use_ckpt = self.cfg.checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            kw = dict(bias=bias, rotary=rotary, return_weights=return_weights)
            if use_ckpt:
                x, w = checkpointed(layer, x, mask, **kw)
            else:
                x, w = layer(x, mask, **kw)
            if hidden is not None:
                hidden.append(x)
            if attns is not None:
                attns.append(w)
        x = self.final_norm(x)
        if hidden is not None:
            hidden[-1] = x
        return EncoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden) if hidden is not None else None,
            attentions=tuple(attns) if attns is not None else None,
        )
