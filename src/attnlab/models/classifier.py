"""Sequence classifier: Transformer encoder, pooling, linear head.

Devlin et al., 2019 ("BERT") classify from the first ([CLS]) token's final state;
mean pooling over the real (unpadded) tokens is the common alternative (Reimers and
Gurevych, 2019, "Sentence-BERT"). Padding is masked out of every attention key set
and out of the mean, so a padded batch gives each sequence the result it gets alone.

Time O(layers * (B N dim^2 + B H N^2 D)) with exact attention; memory O(layers * B N dim).
Shape legend: ``B`` batch, ``N`` sequence length, ``C`` classes, ``H`` heads, ``dim`` width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .. import masks
from .blocks import init_token_embeddings
from .common import TokenEmbedding, check_tokens, mean_pool
from .config import ClassifierConfig
from .encoder import Encoder, as_key_mask
from .io import PretrainedMixin, register_model

# mean_pool lives in models/common.py (BERT pools too); it stays importable from here
__all__ = ["SequenceClassifier", "ClassifierOutput", "mean_pool"]


@dataclass
class ClassifierOutput:
    """What :class:`SequenceClassifier` returns.

    Attributes:
        logits: ``(B, C)``.
        pooled: ``(B, dim)`` the pooled sequence state.
        last_hidden_state: ``(B, N, dim)``.
        attentions: with ``return_weights``, per layer ``(B, H, N, N)``.
    """

    logits: Tensor
    pooled: Tensor
    last_hidden_state: Tensor
    attentions: tuple[Tensor, ...] | None = None


@register_model
class SequenceClassifier(TokenEmbedding, PretrainedMixin, nn.Module):
    """Token embedding, encoder, CLS or mean pooling, linear head.

    Args:
        config: a :class:`~attnlab.models.config.ClassifierConfig`.
    """

    config_class = ClassifierConfig

    def __init__(self, config: ClassifierConfig):
        self._keep_config(config)
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.embed_scale = init_token_embeddings([self.embed], config.dim, config.scale_embeddings)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.head = nn.Linear(config.dim, config.num_classes)

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None, *, mask=None,
                return_weights: bool = False) -> ClassifierOutput:
        """Class scores of ``tokens (B, N)``; ``attention_mask (B, N)`` is 1/True on real tokens.

        ``mask`` is an :mod:`attnlab.masks` mask every layer's attention also keeps (the
        bracket tree of ListOps, :func:`attnlab.masks.brackets`), combined with the padding of
        ``attention_mask``. ``return_weights`` also returns per-layer weights ``(B, H, N, N)``.
        """
        check_tokens(tokens, self.config.vocab_size)
        if attention_mask is not None and (not hasattr(attention_mask, "shape") or attention_mask.shape != tokens.shape):
            got = tuple(attention_mask.shape) if hasattr(attention_mask, "shape") else type(attention_mask).__name__
            raise ValueError(f"attention_mask must be a tensor of shape {tuple(tokens.shape)} (like tokens), got {got}")
        x = self.embed_tokens(tokens)  # (B, N, dim)
        keep = as_key_mask(attention_mask, length=tokens.shape[1])
        if mask is not None:
            mask = masks.as_mask(mask, "mask")
            keep = mask if keep is None else keep & mask
        out = self.encoder(x, keep, return_weights=return_weights)
        h = out.last_hidden_state
        pooled = h[:, 0] if self.config.pooling == "cls" else mean_pool(h, attention_mask)  # (B, dim)
        return ClassifierOutput(self.head(self.dropout(pooled)), pooled, h, out.attentions)

    def loss(self, tokens: Tensor, labels: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Cross-entropy of the class scores against ``labels (B,)``."""
        return F.cross_entropy(self(tokens, attention_mask).logits, labels)
