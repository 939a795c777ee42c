"""Encoder-decoder Transformer for sequence-to-sequence tasks (translation).

Vaswani et al., 2017, "Attention Is All You Need", figure 1: the encoder reads the
source with bidirectional self-attention (source padding masked out of every key set);
the decoder reads the target prefix with causal self-attention and attends to the
encoder output through cross-attention (again without the padded source positions).
Trains with teacher forcing (:meth:`EncoderDecoder.loss`); generates with the KV cache,
the encoder output projected once per layer into a static cross-attention cache.

Time O(L_enc (B S dim^2 + B H S^2 D) + L_dec (B T dim^2 + B H T (T + S) D)); memory
O((L_enc + L_dec) B (S + T) dim) activations.

It implements :class:`~attnlab.models.search.Generative` (:meth:`EncoderDecoder.start_generation`,
:meth:`EncoderDecoder.generation_step`), which is all the search needs of it.

Shape legend: ``B`` batch, ``S`` source length, ``T`` target length, ``H`` heads,
``D`` head dim, ``V`` target vocabulary, ``dim`` model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .blocks import init_token_embeddings
from .common import TokenEmbedding, check_tokens
from .config import Seq2SeqConfig
from .decoder import Decoder, DecoderCache, DecodingState
from .encoder import Encoder, EncoderOutput
from .io import PretrainedMixin, register_model
from .search import generate

__all__ = ["EncoderDecoder", "Seq2SeqOutput"]


@dataclass
class Seq2SeqOutput:
    """What :class:`EncoderDecoder` returns.

    Attributes:
        logits: ``(B, T, V)`` next-token scores at every target position.
        encoder_last_hidden_state: ``(B, S, dim)``.
        encoder_attentions: with ``return_weights``, per encoder layer ``(B, H, S, S)``.
        decoder_attentions: with ``return_weights``, per decoder layer ``(B, H, T, T)``.
        cross_attentions: with ``return_weights``, per decoder layer ``(B, H, T, S)``.
        cache: the cache passed in, or None.
    """

    logits: Tensor
    encoder_last_hidden_state: Tensor
    encoder_attentions: tuple[Tensor, ...] | None = None
    decoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None
    cache: DecoderCache | None = None


@register_model
class EncoderDecoder(TokenEmbedding, PretrainedMixin, nn.Module):
    """Source embedding + encoder, target embedding + decoder with cross-attention, output projection.

    Args:
        config: a :class:`~attnlab.models.config.Seq2SeqConfig`.
    """

    config_class = Seq2SeqConfig

    def __init__(self, config: Seq2SeqConfig):
        self._keep_config(config)
        self.src_embed = nn.Embedding(config.src_vocab_size, config.dim)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, config.dim)
        self.embed_scale = init_token_embeddings([self.src_embed, self.tgt_embed], config.dim, config.scale_embeddings)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config, layers=config.dec_layers, cross_attention=True)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.dim, config.tgt_vocab_size, bias=False)

    def new_cache(self, capacity: int = 16) -> DecoderCache:
        """An empty decoder cache (self- and cross-attention) for incremental decoding."""
        return self.decoder.new_cache(capacity)

    def encode(self, src: Tensor, src_mask=None, *, return_weights: bool = False) -> EncoderOutput:
        """Encode ``src (B, S)``; ``src_mask (B, S)`` keeps real tokens (1/True), hides padding."""
        check_tokens(src, self.config.src_vocab_size, "src")
        x = self.embed_tokens(src, self.src_embed)  # (B, S, dim)
        return self.encoder(x, src_mask, return_weights=return_weights)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask=None,
        *,
        cache: DecoderCache | None = None,
        tgt_mask=None,
        return_weights: bool = False,
    ):
        """Target logits ``(B, T, V)`` given the encoder output ``memory (B, S, dim)``.

        Returns the :class:`~attnlab.models.decoder.DecoderOutput` with ``logits`` added
        as an attribute. ``memory`` may be None once ``cache``'s cross caches are filled.
        """
        check_tokens(tgt, self.config.tgt_vocab_size, "tgt")
        out = self.decoder(
            self.embed_tokens(tgt, self.tgt_embed), tgt_mask, memory=memory, memory_mask=src_mask, cache=cache,
            return_weights=return_weights,
        )
        h = out.last_hidden_state
        out.logits = F.linear(h, self.tgt_embed.weight) if self.lm_head is None else self.lm_head(h)  # (B, T, V)
        return out

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask=None,
        tgt_mask=None,
        *,
        return_weights: bool = False,
    ) -> Seq2SeqOutput:
        """Teacher-forced logits.

        Args:
            src: ``(B, S)`` source ids.
            tgt: ``(B, T)`` target ids (starting with ``bos_id``).
            src_mask: ``(B, S)`` keep mask of the source (1/True = real token).
            tgt_mask: ``(B, T)`` keep mask of the target (combined with causal).
            return_weights: return encoder, decoder and cross-attention weights.
        """
        enc = self.encode(src, src_mask, return_weights=return_weights)
        dec = self.decode(tgt, enc.last_hidden_state, src_mask, tgt_mask=tgt_mask, return_weights=return_weights)
        return Seq2SeqOutput(
            logits=dec.logits,
            encoder_last_hidden_state=enc.last_hidden_state,
            encoder_attentions=enc.attentions,
            decoder_attentions=dec.attentions,
            cross_attentions=dec.cross_attentions,
        )

    def loss(self, src: Tensor, tgt: Tensor, src_mask=None, tgt_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced cross-entropy: predict ``tgt[:, 1:]`` from ``tgt[:, :-1]`` (padding ignored)."""
        check_tokens(tgt, self.config.tgt_vocab_size, "tgt")
        if tgt.shape[1] < 2:
            raise ValueError(f"tgt needs at least 2 positions (bos + one token), got shape {tuple(tgt.shape)}")
        dec_mask = None if tgt_mask is None else tgt_mask[:, :-1]
        logits = self(src, tgt[:, :-1], src_mask, dec_mask).logits  # (B, T-1, V)
        target = tgt[:, 1:].clone()  # (B, T-1)
        if tgt_mask is not None:
            target[~tgt_mask[:, 1:].bool()] = -100
        flat = logits.reshape(-1, logits.shape[-1])  # (B*(N-1), V)
        return F.cross_entropy(flat, target.reshape(-1), ignore_index=-100)  # target (B*(N-1),)

    # -- generation (the Generative protocol of attnlab.models.search) ------------------
    def start_generation(self, inputs: Tensor, *, max_new_tokens: int, use_cache: bool = True,
                         src_mask: Tensor | None = None) -> tuple[Tensor, DecodingState]:
        """Encode the source ``inputs (B, S)`` once; the prefix is ``bos_id`` ``(B, 1)``.

        The state holds the encoder output, the source keep mask and (with ``use_cache``)
        a decoder cache for ``1 + max_new_tokens`` positions.
        """
        check_tokens(inputs, self.config.src_vocab_size, "src")
        if src_mask is not None and (not isinstance(src_mask, Tensor) or src_mask.shape != inputs.shape):
            got = tuple(src_mask.shape) if isinstance(src_mask, Tensor) else type(src_mask).__name__
            raise ValueError(f"src_mask must be a (batch, src_len) tensor like src {tuple(inputs.shape)}, got {got}")
        keep = None if src_mask is None else src_mask.bool()
        memory = self.encode(inputs, keep).last_hidden_state  # (B, S, dim)
        prefix = torch.full((inputs.shape[0], 1), self.config.bos_id, dtype=torch.long, device=inputs.device)  # (B, 1)
        cache = self.new_cache(capacity=1 + max_new_tokens) if use_cache else None
        return prefix, DecodingState(cache, memory, keep)

    def generation_step(self, tokens: Tensor, state: DecodingState) -> Tensor:
        """Logits ``(B, V)`` of the target token after ``tokens (B, T)`` (the new ones when ``state`` caches)."""
        return self.decode(tokens, state.memory, state.memory_mask, cache=state.cache).logits[:, -1]  # (B, V)

    @torch.no_grad()
    def generate(self, src: Tensor, max_new_tokens: int, src_mask=None, **kwargs) -> Tensor:
        """Translate ``src (B, S)``; returns ``(B, 1 + new)`` starting with ``bos_id``.

        See :func:`attnlab.models.generate`.
        """
        return generate(self, src, max_new_tokens=max_new_tokens, src_mask=src_mask, **kwargs)
