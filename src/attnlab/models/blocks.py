"""Transformer layers: encoder layer, decoder layer, feed-forward block, positional parts.

Vaswani et al., 2017, "Attention Is All You Need", sections 3.1-3.3. An encoder layer
is self-attention then a position-wise feed-forward block; a decoder layer adds
cross-attention to the encoder output between them. Each sub-block is wrapped as

* post-norm (the paper, BERT): ``x = norm(x + dropout(f(x)))``
* pre-norm (GPT-2 and later): ``x = x + dropout(f(norm(x)))`` (the stack adds a final norm)

Time per layer O(B N dim^2) for projections and feed-forward plus the attention
mechanism's cost (O(B H N M D) for exact attention); memory O(B N dim) activations plus
the mechanism's.

Shape legend: ``B`` batch, ``N`` queries (this sequence), ``M`` keys (cached prefix
plus this sequence, or the encoder output), ``S`` source length, ``H`` heads,
``dim`` model width.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

from ..layers import KVCache, MultiHeadAttention
from ..mechanisms import Mechanism, create, mechanisms
from ..positional import ALiBi, LearnedPositional, RotaryEmbedding, SinusoidalPositional, T5RelativeBias
from ..utils import eval_mode  # re-exported: it lived here before moving below every layer that uses it
from .config import TransformerConfig

__all__ = ["FeedForward", "EncoderLayer", "DecoderLayer", "PositionalParts", "build_mechanism", "checkpointed",
           "eval_mode", "init_token_embeddings"]

_ACT: dict[str, Callable[[], nn.Module]] = {
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
    "silu": lambda: nn.SiLU(),
}


def build_mechanism(cfg: TransformerConfig) -> Mechanism:
    """A fresh mechanism from ``cfg.mechanism`` and ``cfg.mechanism_settings``.

    A mechanism that takes a ``dropout`` setting (``exact``, ``bigbird``, ``longformer``)
    gets ``cfg.attn_dropout`` unless the settings name one, and the settings the mechanism
    asks of a model (:meth:`~attnlab.mechanisms.Mechanism.model_settings`: adaptive span's
    ``heads`` and ``max_span``) unless they name them. Each layer gets its own instance
    (some mechanisms hold parameters).
    """
    cls = mechanisms()[cfg.mechanism]
    settings = {**cls.model_settings(cfg.heads, cfg.max_len), **cfg.mechanism_settings}
    if "dropout" in inspect.signature(cls.__init__).parameters:
        settings.setdefault("dropout", cfg.attn_dropout)
    return create(cfg.mechanism, **settings)


class FeedForward(nn.Module):
    """Position-wise feed-forward: ``fc2(dropout(act(fc1(x))))``, ``(B, N, dim) -> (B, N, dim)``."""

    def __init__(self, dim: int, hidden: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if activation not in _ACT:
            raise ValueError(f"activation must be one of {sorted(_ACT)}, got {activation!r}")
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = _ACT[activation]()
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class PositionalParts(nn.Module):
    """The positional encoding of a stack, split by where it acts.

    Built from ``cfg.positional``: ``absolute`` (added to the embeddings: sinusoidal,
    learned, or a model's own such as ViT's 2-D code), ``rotary`` (a q/k transform
    handed to self-attention) and ``score_bias`` (ALiBi / T5, a bias function of indices
    handed to self-attention). At most one of them is set.

    Args:
        cfg: the stack's config.
        causal: decoder stacks use the causal forms of ALiBi and T5.
        absolute: replaces the absolute encoding built from ``cfg`` (any module taking
            ``(x (B, N, dim), offset)``).
    """

    def __init__(self, cfg: TransformerConfig, causal: bool, absolute: nn.Module | None = None):
        super().__init__()
        kind = cfg.positional
        self.kind = kind
        self.absolute: nn.Module | None = absolute
        if absolute is None and kind == "sinusoidal":
            self.absolute = SinusoidalPositional(cfg.dim)
        elif absolute is None and kind == "learned":
            self.absolute = LearnedPositional(cfg.dim, cfg.max_len)
        self.rotary = RotaryEmbedding(cfg.head_dim, base=cfg.rope_base) if kind == "rotary" else None
        self.score_bias: nn.Module | None = None
        if kind == "alibi":
            self.score_bias = ALiBi(cfg.heads, symmetric=not causal)
        elif kind == "t5":
            self.score_bias = T5RelativeBias(
                cfg.heads, num_buckets=cfg.t5_buckets, max_distance=cfg.t5_max_distance, bidirectional=not causal
            )

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (B, N, dim)`` plus the absolute code of positions ``offset .. offset+N-1`` (if any)."""
        return x if self.absolute is None else self.absolute(x, offset)

    def bias(self, n_q: int, n_k: int):
        """The self-attention score bias function for ``n_q`` queries over ``n_k`` keys, or None."""
        return None if self.score_bias is None else self.score_bias.bias_fn(n_q, n_k)


def _residual(x: Tensor, f: Callable[[Tensor], tuple[Tensor, Tensor | None]], norm: nn.LayerNorm,
              drop: nn.Dropout, norm_first: bool) -> tuple[Tensor, Tensor | None]:
    """Apply one pre- or post-norm residual sub-block; ``f`` returns (output, weights or None)."""
    if norm_first:
        out, w = f(norm(x))
        return x + drop(out), w
    out, w = f(x)
    return norm(x + drop(out)), w


def _attn(layer: MultiHeadAttention, return_weights: bool, **kw) -> Callable[[Tensor], tuple[Tensor, Tensor | None]]:
    def run(h: Tensor) -> tuple[Tensor, Tensor | None]:
        res = layer(h, return_weights=return_weights, **kw)
        return res if return_weights else (res, None)

    return run


def _attention(cfg: TransformerConfig) -> MultiHeadAttention:
    """A multi-head attention sub-block of the stack's width, heads and mechanism."""
    return MultiHeadAttention(cfg.dim, cfg.heads, kv_heads=cfg.kv_heads, bias=cfg.bias, mechanism=build_mechanism(cfg))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual sub-block (pre- or post-norm).

    Args:
        cfg: width, heads, dropout, activation, norm placement and mechanism.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = _attention(cfg)
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.ff = FeedForward(cfg.dim, cfg.ff, cfg.activation, cfg.dropout, cfg.bias)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask=None, *, bias=None, rotary=None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``x (B, N, dim) -> (x' (B, N, dim), weights (B, H, N, N) or None)``.

        ``mask`` says which keys each query may see (an :mod:`attnlab.masks` mask),
        ``bias`` is a score bias (function of indices), ``rotary`` a q/k transform;
        ``return_weights`` asks for the weights.
        """
        x, w = _residual(x, _attn(self.self_attn, return_weights, mask=mask, bias=bias, positional=rotary),
                         self.norm1, self.dropout, self.norm_first)
        x, _ = _residual(x, lambda h: (self.ff(h), None), self.norm2, self.dropout, self.norm_first)
        return x, w


class DecoderLayer(nn.Module):
    """Causal self-attention, optional cross-attention to a memory, feed-forward.

    Args:
        cfg: the stack's config.
        cross_attention: include the cross-attention sub-block (encoder-decoder models).
    """

    def __init__(self, cfg: TransformerConfig, cross_attention: bool = False):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = _attention(cfg)
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.cross_attn: MultiHeadAttention | None = None
        self.norm_cross: nn.LayerNorm | None = None
        if cross_attention:
            self.cross_attn = _attention(cfg)
            self.norm_cross = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.ff = FeedForward(cfg.dim, cfg.ff, cfg.activation, cfg.dropout, cfg.bias)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        mask=None,
        *,
        memory: Tensor | None = None,
        memory_mask=None,
        bias=None,
        rotary=None,
        cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``x (B, N, dim) -> (x', self-attention weights (B, H, N, M), cross weights (B, H, N, S))``.

        Args:
            x: decoder states of the new positions.
            mask: self-attention mask over all ``M`` keys (cached + new), usually causal.
            memory: encoder output ``(B, S, dim)``; may be None once ``cross_cache`` is filled.
            memory_mask: which memory positions may be attended (e.g. source padding).
            bias, rotary: self-attention positional parts (see :class:`PositionalParts`).
            cache: growing :class:`KVCache` of this layer's self-attention.
            cross_cache: static :class:`KVCache` of the projected memory.
            return_weights: return attention weights (else None in their places).
        """
        x, w_self = _residual(
            x, _attn(self.self_attn, return_weights, mask=mask, bias=bias, positional=rotary, cache=cache),
            self.norm1, self.dropout, self.norm_first,
        )
        w_cross = None
        if self.cross_attn is not None:
            if memory is None and (cross_cache is None or not cross_cache.filled):
                raise ValueError("memory (the encoder output) is required by a decoder layer with cross-attention")
            x, w_cross = _residual(
                x, _attn(self.cross_attn, return_weights, key=memory, mask=memory_mask, cache=cross_cache),
                self.norm_cross, self.dropout, self.norm_first,
            )
        x, _ = _residual(x, lambda h: (self.ff(h), None), self.norm2, self.dropout, self.norm_first)
        return x, w_self, w_cross


def checkpointed(fn: Callable, *args, **kwargs):
    """Run ``fn`` under activation checkpointing (non-reentrant), recomputed in backward."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, **kwargs)


def init_token_embeddings(embeddings: list[nn.Embedding], dim: int, scaled: bool) -> float:
    """Initialize token embeddings and return the factor the model multiplies them by.

    ``scaled`` (Vaswani et al., 2017): weights ``N(0, dim**-0.5)`` and factor ``sqrt(dim)``,
    so tokens enter at unit scale beside a sinusoidal code and a tied output projection
    starts with unit-scale logits. Otherwise GPT-2's ``N(0, 0.02)`` and factor 1.
    """
    for e in embeddings:
        nn.init.normal_(e.weight, std=dim**-0.5 if scaled else 0.02)
    return math.sqrt(dim) if scaled else 1.0
