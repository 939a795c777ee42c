"""Decoder-only causal language model (GPT-style).

Radford et al., 2018/2019 (GPT, GPT-2): token embedding, a causal Transformer decoder
stack without cross-attention, and a projection back to the vocabulary (tied to the
embedding by default). Trains with next-token cross-entropy (:meth:`CausalLM.loss`) and
generates with the KV cache (:meth:`CausalLM.generate`).

Time per forward O(layers * (B N dim^2 + B H N M D)) + O(B N dim V) for the output
projection; memory O(layers * B N dim) activations, O(layers * B Hkv M D) cache.

It implements :class:`~attnlab.models.search.Generative` (:meth:`CausalLM.start_generation`,
:meth:`CausalLM.generation_step`), which is all the search needs of it.

Shape legend: ``B`` batch, ``N`` new tokens, ``M`` keys (cached + new), ``H`` heads,
``D`` head dim, ``V`` vocabulary, ``dim`` model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .blocks import init_token_embeddings
from .common import TokenEmbedding, check_tokens
from .config import CausalLMConfig
from .decoder import Decoder, DecoderCache, DecodingState
from .io import PretrainedMixin, register_model
from .search import generate

__all__ = ["CausalLM", "CausalLMOutput"]


@dataclass
class CausalLMOutput:
    """What :class:`CausalLM` returns.

    Attributes:
        logits: ``(B, N, V)`` next-token scores at every new position.
        cache: the :class:`DecoderCache` passed in (now holding these positions too), or None.
        hidden_states: with ``output_hidden_states``, ``layers + 1`` tensors ``(B, N, dim)``.
        attentions: with ``return_weights``, per layer ``(B, H, N, M)``.
    """

    logits: Tensor
    cache: DecoderCache | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@register_model
class CausalLM(TokenEmbedding, PretrainedMixin, nn.Module):
    """Token embedding, causal decoder stack, vocabulary projection.

    Args:
        config: a :class:`~attnlab.models.config.CausalLMConfig`.
    """

    config_class = CausalLMConfig

    def __init__(self, config: CausalLMConfig):
        self._keep_config(config)
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.embed_scale = init_token_embeddings([self.embed], config.dim, config.scale_embeddings)
        self.dropout = nn.Dropout(config.dropout)
        self.decoder = Decoder(config)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)

    def new_cache(self, capacity: int = 16) -> DecoderCache:
        """An empty KV cache for incremental decoding."""
        return self.decoder.new_cache(capacity)

    def logits_from_hidden(self, h: Tensor) -> Tensor:
        """``(B, N, dim) -> (B, N, V)``."""
        if self.lm_head is None:
            return F.linear(h, self.embed.weight)
        return self.lm_head(h)

    def forward(
        self,
        tokens: Tensor,
        attention_mask=None,
        *,
        cache: DecoderCache | None = None,
        return_weights: bool = False,
        output_hidden_states: bool = False,
    ) -> CausalLMOutput:
        """Next-token logits of ``tokens (B, N)``.

        Args:
            tokens: token ids of the new positions.
            attention_mask: ``(B, M)`` keep mask (1/True = real token) over cached + new
                positions, for right-padded batches; combined with the causal mask.
            cache: a :class:`DecoderCache` from :meth:`new_cache`; the call appends to it.
            return_weights: return per-layer weights ``(B, H, N, M)``.
            output_hidden_states: return the embeddings and every layer's output.
        """
        check_tokens(tokens, self.config.vocab_size)
        x = self.embed_tokens(tokens)  # (B, N, dim)
        out = self.decoder(
            x, attention_mask, cache=cache, return_weights=return_weights,
            output_hidden_states=output_hidden_states,
        )
        return CausalLMOutput(
            logits=self.logits_from_hidden(out.last_hidden_state),
            cache=cache,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )

    def loss(self, tokens: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Mean next-token cross-entropy of ``tokens (B, N)``, N >= 2 (padding ignored)."""
        check_tokens(tokens, self.config.vocab_size)
        if tokens.shape[1] < 2:
            raise ValueError(f"tokens need at least 2 positions for a next-token loss, got shape {tuple(tokens.shape)}")
        logits = self(tokens, attention_mask).logits[:, :-1]  # (B, N-1, V)
        target = tokens[:, 1:].clone()  # (B, N-1)
        if attention_mask is not None:
            target[~attention_mask[:, 1:].bool()] = -100
        flat = logits.reshape(-1, logits.shape[-1])  # (B*(N-1), V)
        return F.cross_entropy(flat, target.reshape(-1), ignore_index=-100)  # target (B*(N-1),)

    # -- generation (the Generative protocol of attnlab.models.search) ------------------
    def start_generation(self, inputs: Tensor, *, max_new_tokens: int, use_cache: bool = True,
                         src_mask: Tensor | None = None) -> tuple[Tensor, DecodingState]:
        """The prompt ``inputs (B, P)`` is the prefix; the state holds a cache for ``P + max_new_tokens``."""
        check_tokens(inputs, self.config.vocab_size, "prompt")
        if src_mask is not None:
            raise ValueError("src_mask is for EncoderDecoder models; a CausalLM prompt batch shares one length")
        cache = self.new_cache(capacity=inputs.shape[1] + max_new_tokens) if use_cache else None
        return inputs, DecodingState(cache)

    def generation_step(self, tokens: Tensor, state: DecodingState) -> Tensor:
        """Logits ``(B, V)`` of the token after ``tokens (B, N)`` (the new ones when ``state`` caches)."""
        return self(tokens, cache=state.cache).logits[:, -1]  # (B, V)

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """Continue ``prompt (B, P)``; returns ``(B, P + new)``. See :func:`attnlab.models.generate`."""
        return generate(self, prompt, max_new_tokens=max_new_tokens, **kwargs)
