"""Transformer decoder stack with a KV cache: causal self-attention, optional cross-attention.

Vaswani et al., 2017, section 3.1 (the decoder). Position ``t`` may see positions
``0..t`` of its own sequence and, in encoder-decoder models, every kept position of the
encoder output. With a :class:`DecoderCache`, each call processes only the new
positions: keys/values of earlier ones come from the per-layer caches and the absolute
position code continues from the cache length, so an incremental forward computes what
a full forward would.

Time per call of ``N`` new positions over ``T`` cached ones: O(layers * (B N dim^2 +
B H N (T + N) D)) with exact attention; the cache holds O(layers * B Hkv (T + S) D).

Shape legend: ``B`` batch, ``N`` new positions, ``T`` cached positions, ``M = T + N``
keys, ``S`` source (memory) length, ``H`` heads, ``D`` head dim, ``dim`` model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import masks
from ..layers import KVCache
from .blocks import DecoderLayer, PositionalParts, checkpointed
from .config import TransformerConfig
from .encoder import as_key_mask

__all__ = ["Decoder", "DecoderCache", "DecoderOutput", "DecodingState"]


class DecoderCache:
    """The KV caches of a decoder stack: one growing self-attention cache per layer and,
    with cross-attention, one static cache per layer for the projected encoder output.

    Args:
        layers: number of decoder layers.
        cross_attention: also hold static cross-attention caches.
        capacity: initial positions preallocated per self-attention cache.
    """

    def __init__(self, layers: int, cross_attention: bool = False, capacity: int = 16):
        self.self_caches = [KVCache(capacity=capacity) for _ in range(layers)]
        self.cross_caches = [KVCache(static=True) for _ in range(layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """Positions already processed ``T`` (the next position index)."""
        return self.self_caches[0].length

    def reorder(self, index: Tensor) -> None:
        """Select batch rows ``index (B',)`` of every cache (beam search, batch expansion)."""
        for c in self.self_caches:
            c.reorder(index)
        for c in self.cross_caches or ():
            c.reorder(index)

    def reset(self) -> None:
        """Forget every cached position."""
        for c in self.self_caches + (self.cross_caches or []):
            c.reset()

    def __repr__(self) -> str:
        return f"DecoderCache(layers={len(self.self_caches)}, length={self.length}, cross={self.cross_caches is not None})"


@dataclass
class DecodingState:
    """What a decoder model carries from one generation step to the next.

    The state that :class:`~attnlab.models.CausalLM` and
    :class:`~attnlab.models.EncoderDecoder` hand to :func:`~attnlab.models.generate`
    (see :class:`~attnlab.models.search.Generative`); the search only ever calls
    :meth:`reorder`.

    Attributes:
        cache: the stack's KV caches, or None to recompute the whole prefix every step.
        memory: encoder-decoder models: the encoder output ``(B, S, dim)``, else None.
        memory_mask: its keep mask ``(B, S)`` (True = token), or None (keep all).
    """

    cache: DecoderCache | None = None
    memory: Tensor | None = None
    memory_mask: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index (B',)`` (the beams that survive, or a batch expanded to beams)."""
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)  # (B', S, dim)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)  # (B', S)
        if self.cache is not None:
            self.cache.reorder(index)


@dataclass
class DecoderOutput:
    """What :class:`Decoder` returns.

    Attributes:
        last_hidden_state: ``(B, N, dim)`` states of the new positions.
        hidden_states: with ``output_hidden_states``, ``layers + 1`` tensors ``(B, N, dim)``.
        attentions: with ``return_weights``, per layer ``(B, H, N, M)``.
        cross_attentions: with ``return_weights`` and cross-attention, per layer ``(B, H, N, S)``.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None


class Decoder(nn.Module):
    """A stack of :class:`DecoderLayer` (causal), optionally with cross-attention.

    Args:
        cfg: stack settings.
        layers: number of layers (default ``cfg.layers``).
        cross_attention: layers attend to a memory (encoder output) as well.
        positional: positional parts (default: built from ``cfg``, causal forms).
    """

    def __init__(self, cfg: TransformerConfig, layers: int | None = None, cross_attention: bool = False,
                 positional: PositionalParts | None = None):
        super().__init__()
        self.cfg = cfg
        self.num_layers = cfg.layers if layers is None else layers
        self.cross_attention = cross_attention
        self.positional = positional if positional is not None else PositionalParts(cfg, causal=True)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross_attention) for _ in range(self.num_layers))
        self.final_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps) if cfg.norm_first else nn.Identity()
        # an attnlab.distributed.SequenceParallel while the input is a shard of the sequence (set, with the
        # layers' self-attention, by attnlab.distributed.sequence_parallel(model, setting))
        self.sequence_parallel = None

    def new_cache(self, capacity: int = 16) -> DecoderCache:
        """An empty :class:`DecoderCache` for this stack."""
        return DecoderCache(self.num_layers, self.cross_attention, capacity)

    def forward(
        self,
        x: Tensor,
        attention_mask=None,
        *,
        memory: Tensor | None = None,
        memory_mask=None,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
        output_hidden_states: bool = False,
    ) -> DecoderOutput:
        """Decode embedded inputs.

        Args:
            x: ``(B, N, dim)`` embeddings of the new positions (no positions added).
            attention_mask: ``(B, M)`` keep mask over all keys (cached + new; 1/True =
                real token) combined with the causal mask, or an attnlab mask used
                *instead of* the causal one.
            memory: encoder output ``(B, S, dim)`` (cross-attention stacks; may be None
                once the cache's cross-attention caches are filled).
            memory_mask: ``(B, S)`` keep mask of the memory or an attnlab mask.
            cache: a :class:`DecoderCache` (from :meth:`new_cache`) for incremental decoding.
            return_weights, output_hidden_states: as in :class:`~attnlab.models.encoder.Encoder`.
        """
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.cfg.dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (batch, seq, dim={self.cfg.dim}), got {shape}")
        if self.cross_attention and memory is None and (cache is None or not cache.cross_caches[0].filled):
            raise ValueError("memory (the encoder output, (batch, src_len, dim)) is required for cross-attention")
        if cache is not None and len(cache.self_caches) != self.num_layers:
            raise ValueError(f"cache has {len(cache.self_caches)} layers but the decoder has {self.num_layers}")
        n = x.shape[1]
        past = 0 if cache is None else cache.length
        m = past + n
        sp = self.sequence_parallel
        if sp is not None:
            if cache is not None or return_weights or not isinstance(attention_mask, (masks.Mask, type(None))):
                raise ValueError("a sequence-parallel decoder takes no cache, returns no weights, and takes its "
                                 "attention_mask as an attnlab mask over global positions")
            if any(layer.self_attn.sequence_parallel is not sp for layer in self.layers):
                raise ValueError("the decoder is sequence-parallel but its layers' self-attention is not: set both "
                                 "with attnlab.distributed.sequence_parallel(model, setting)")
        if isinstance(attention_mask, masks.Mask):
            mask = attention_mask
        else:
            keep = as_key_mask(attention_mask, length=m)
            # one new query over all keys: causal allows everything, so skip the mask
            mask = masks.causal() if n > 1 or sp is not None else None
            if keep is not None:
                mask = keep if mask is None else mask & keep
        mem_mask = as_key_mask(memory_mask, "memory_mask")
        if sp is not None:  # absolute codes at the global positions of each run of this rank's shard
            x = torch.cat([self.positional.embed(x[:, lo: lo + size], start)
                           for start, lo, size in sp.ranges(n, x.device)], dim=1)  # (B, N, dim)
        else:
            x = self.positional.embed(x, past)
        bias = self.positional.bias(n, m)
        rotary = self.positional.rotary
        hidden = [x] if output_hidden_states else None
        attns = [] if return_weights else None
        cross = [] if return_weights and self.cross_attention else None
        use_ckpt = self.cfg.checkpointing and self.training and torch.is_grad_enabled() and cache is None
        for i, layer in enumerate(self.layers):
            kw = dict(
                memory=memory, memory_mask=mem_mask, bias=bias, rotary=rotary, return_weights=return_weights,
                cache=None if cache is None else cache.self_caches[i],
                cross_cache=None if cache is None or cache.cross_caches is None else cache.cross_caches[i],
            )
            if use_ckpt:
                x, w, wc = checkpointed(layer, x, mask, **kw)
            else:
                x, w, wc = layer(x, mask, **kw)
            if hidden is not None:
                hidden.append(x)
            if attns is not None:
                attns.append(w)
            if cross is not None:
                cross.append(wc)
        x = self.final_norm(x)
        if hidden is not None:
            hidden[-1] = x
        return DecoderOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden) if hidden is not None else None,
            attentions=tuple(attns) if attns is not None else None,
            cross_attentions=tuple(cross) if cross is not None else None,
        )
