"""What the model classes share: the token-id check at their entry, the embedding step, masked mean pooling.

:class:`~attnlab.models.CausalLM`, :class:`~attnlab.models.EncoderDecoder`,
:class:`~attnlab.models.SequenceClassifier` and :class:`~attnlab.models.Bert` check their
token inputs with :func:`check_tokens`; the classifier and BERT's sentence embeddings pool
with :func:`mean_pool`; the token models embed through :class:`TokenEmbedding` (their
``embed_tokens``, which the ONNX graphs of :mod:`attnlab.deploy` call too). Living here, below
every model class, they let the model modules stay independent of one another. Time and
memory O(B N dim).

Shape legend: ``B`` batch, ``N`` positions, ``dim`` model width.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["TokenEmbedding", "check_images", "check_tokens", "mean_pool"]


def check_tokens(tokens, vocab: int, name: str = "tokens") -> None:
    """Raise ValueError unless ``tokens`` is an integer ``(B, N)`` tensor of ids below ``vocab``.

    Inside ``torch.compile`` tracing the ids' values are not read (that would break the graph): the
    shape and dtype are checked, and the embedding's own index check refuses an id out of range.
    """
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        desc = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (batch, seq), got {desc}")
    if tokens.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one position, got shape {tuple(tokens.shape)}")
    if tokens.numel() and not torch.compiler.is_compiling() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"{name} must hold ids in [0, {vocab}), got min {int(tokens.min())} max {int(tokens.max())}")


def check_images(images, channels: int, size: int) -> None:
    """Raise ValueError unless ``images`` is a ``(B, channels, size, size)`` tensor."""
    if not isinstance(images, Tensor) or images.ndim != 4 or tuple(images.shape[1:]) != (channels, size, size):
        raise ValueError(f"images must have shape (batch, {channels}, {size}, {size}), got "
                         f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")


def mean_pool(h: Tensor, keep: Tensor | None) -> Tensor:
    """Average ``h (B, N, dim)`` over the positions ``keep (B, N)`` marks (all when None) -> ``(B, dim)``."""
    if keep is None:
        return h.mean(dim=1)
    w = keep.to(h.dtype).unsqueeze(-1)  # (B, N, 1)
    return (h * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9)


class TokenEmbedding:
    """The embedding step of a token model: ``embed_tokens``.

    A model class that mixes it in has ``embed`` (its ``nn.Embedding``; an encoder-decoder
    passes its source or target table), ``embed_scale`` (``sqrt(dim)`` when it scales its
    embeddings, else 1) and ``dropout``.
    """

    def embed_tokens(self, tokens: Tensor, table=None) -> Tensor:
        """``(B, N)`` ids -> ``(B, N, dim)``: the table's vectors times ``embed_scale``, then dropout."""
        return self.dropout((self.embed if table is None else table)(tokens) * self.embed_scale)
