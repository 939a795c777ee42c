"""Helpers shared by the score-bias encodings (ALiBi, T5 relative bias).

Shape legend: ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: ``(b, h, q_idx, kv_idx) -> bias``, the bias-function form of :func:`attnlab.attention`
BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def check_counts(n_q, n_k) -> None:
    """Raise unless ``n_q`` and ``n_k`` are positive ints."""
    for name, v in (("n_q", n_q), ("n_k", n_k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def index_grid(heads: int, n_q: int, n_k: int, device=None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Index tensors ``(1,1,1,1)``, ``(1,H,1,1)``, ``(1,1,N,1)``, ``(1,1,1,M)`` for a full grid."""
    return (
        torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device),
        torch.arange(heads, device=device).view(1, -1, 1, 1),
        torch.arange(n_q, device=device).view(1, 1, -1, 1),
        torch.arange(n_k, device=device).view(1, 1, 1, -1),
    )


def check_heads(h: Tensor, heads: int, who: str) -> None:
    """Raise when a head index tensor spans more heads than the bias was built for."""
    if h.ndim == 4 and h.shape[1] not in (1, heads):
        raise ValueError(f"{who} was built for {heads} heads but attention has {h.shape[1]} query heads")
