"""Classic encoder-decoder attention: additive (Bahdanau) and multiplicative (Luong).

* Bahdanau, Cho, Bengio, "Neural Machine Translation by Jointly Learning to Align and
  Translate" (2015): ``score(s, h) = v^T tanh(W1 h + W2 s)``.
* Luong, Pham, Manning, "Effective Approaches to Attention-based Neural Machine
  Translation" (2015): ``dot`` ``s^T h``, ``general`` ``s^T W h``, ``concat``
  ``v^T tanh(W [s; h])``.

Here ``s`` is a query (decoder state) and ``h`` a key (encoder state). Weights are
``softmax`` of the scores over the keys (no ``1/sqrt(d)`` scaling: these are the
original formulas) and the context is the weighted sum of the values. Single-head.
Time O(B N M Dh) for additive/concat (``Dh`` hidden size), O(B N M D) for dot/general;
memory O(B N M Dh) for additive/concat (the ``tanh`` argument is materialized),
O(B N M) otherwise.

Shape legend: ``B`` batch, ``N`` queries (decoder steps; a 2-D query is one step),
``M`` keys, ``Dq`` query size, ``Dk`` key size, ``Dv`` value size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..masks import as_mask
from ..utils import positive_int

__all__ = ["AdditiveAttention", "LuongAttention"]



def _inputs(query: Tensor, keys: Tensor, values: Tensor | None, dq: int, dk: int):
    """Validate and bring the query to ``(B, N, Dq)``; returns (query, values, squeeze)."""
    if not isinstance(query, Tensor) or query.ndim not in (2, 3):
        shape = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(f"query must be (B, N, Dq) or (B, Dq), got {shape}")
    if query.shape[-1] != dq:
        raise ValueError(f"query must have Dq={dq} features (last dim), got shape {tuple(query.shape)}")
    if not isinstance(keys, Tensor) or keys.ndim != 3:
        shape = tuple(keys.shape) if isinstance(keys, Tensor) else type(keys).__name__
        raise ValueError(f"keys must be (B, M, Dk), got {shape}")
    if keys.shape[-1] != dk:
        raise ValueError(f"keys must have Dk={dk} features (last dim), got shape {tuple(keys.shape)}")
    if keys.shape[0] != query.shape[0]:
        raise ValueError(f"keys batch size {keys.shape[0]} differs from query batch size {query.shape[0]}")
    values = keys if values is None else values
    if not isinstance(values, Tensor) or values.ndim != 3 or values.shape[:2] != keys.shape[:2]:
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"values must be (B, M, Dv) with (B, M) of keys {tuple(keys.shape[:2])}, got {shape}")
    squeeze = query.ndim == 2
    if squeeze:
        query = query.unsqueeze(1)  # (B, 1, Dq)
    return query, values, squeeze


def _allowed(mask, B: int, N: int, M: int, device) -> Tensor | None:
    """Mask as a bool ``(B|1, N|1, M)`` tensor (True = may attend), or None.

    Accepts an :mod:`attnlab.masks` mask, a bool key mask ``(B, M)`` or a bool
    ``(B, N, M)`` per-query mask.
    """
    if mask is None:
        return None
    if isinstance(mask, Tensor):
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True = may attend) or an attnlab mask, got {mask.dtype}")
        if mask.ndim == 2:
            if mask.shape != (B, M):
                raise ValueError(f"a 2-D mask is a key mask (B, M)=({B}, {M}), got shape {tuple(mask.shape)}")
            return mask.to(device)[:, None, :]  # (B, 1, M)
        if mask.ndim == 3:
            try:
                shape = torch.broadcast_shapes(mask.shape, (B, N, M))
            except RuntimeError as e:
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (B, N, M)=({B}, {N}, {M})") from e
            if shape != (B, N, M):
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (B, N, M)=({B}, {N}, {M})")
            return mask.to(device)
        raise ValueError(f"mask tensor must be (B, M) or (B, N, M), got shape {tuple(mask.shape)}")
    m = as_mask(mask, "mask")
    if m.num_heads not in (None, 1):
        raise ValueError(f"mask is for {m.num_heads} heads but these layers are single-head")
    if m.batch_size not in (None, 1, B):
        raise ValueError(f"mask is for batch size {m.batch_size} but the inputs have {B}")
    return m.dense(N, M, device=device, batch=B)[:, 0]  # (B|1, N|1, M)


def _attend(scores: Tensor, values: Tensor, allowed: Tensor | None) -> tuple[Tensor, Tensor]:
    """Masked softmax over keys and weighted sum; empty rows give zero weights and context.

    ``scores (B, N, M)``, ``values (B, M, Dv)`` -> ``context (B, N, Dv)``, ``weights (B, N, M)``.
    """
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
        row_any = allowed.any(-1, keepdim=True)  # (B|1, N|1, 1)
        scores = scores.masked_fill(~row_any, 0.0)  # finite softmax (and gradient) on empty rows
        weights = torch.softmax(scores, dim=-1) * row_any  # (B, N, M)
    else:
        weights = torch.softmax(scores, dim=-1)  # (B, N, M)
    context = torch.bmm(weights, values)  # (B, N, Dv)
    return context, weights


def _finish(context: Tensor, weights: Tensor, squeeze: bool) -> tuple[Tensor, Tensor]:
    if squeeze:
        return context.squeeze(1), weights.squeeze(1)  # (B, Dv), (B, M)
    return context, weights


class _ScoredAttention(nn.Module):
    """What both classic attentions share: the forward over ``scores()`` (a subclass gives the score function)."""

    query_dim: int
    key_dim: int

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalized scores ``(B, N, M)`` of ``query (B, N, Dq)`` against ``keys (B, M, Dk)``."""
        raise NotImplementedError

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask=None
    ) -> tuple[Tensor, Tensor]:
        """Attend from ``query`` over ``keys``.

        Args:
            query: ``(B, N, Dq)`` or one step ``(B, Dq)``.
            keys: ``(B, M, Dk)``.
            values: ``(B, M, Dv)``, default ``keys``.
            mask: where attention is allowed: an :mod:`attnlab.masks` mask, a bool key
                mask ``(B, M)`` or a bool ``(B, N, M)`` (True = may attend).

        Returns:
            ``(context (B, N, Dv), weights (B, N, M))``, or ``(B, Dv), (B, M)`` for a
            2-D query. A query whose keys are all masked gets zero weights and context.
        """
        query, values, squeeze = _inputs(query, keys, values, self.query_dim, self.key_dim)
        B, N, M = query.shape[0], query.shape[1], keys.shape[1]
        context, weights = _attend(self.scores(query, keys), values, _allowed(mask, B, N, M, query.device))
        return _finish(context, weights, squeeze)


class AdditiveAttention(_ScoredAttention):
    """Bahdanau (additive) attention: ``score = v^T tanh(W1 h + W2 s)``.

    Args:
        query_dim: size ``Dq`` of the query (decoder state ``s``).
        key_dim: size ``Dk`` of the keys (encoder states ``h``).
        hidden_dim: size ``Dh`` of the alignment MLP.

    Parameters: ``key_proj`` = ``W1 (Dk -> Dh)``, with the MLP's bias; ``query_proj`` =
    ``W2 (Dq -> Dh)``, no bias; ``score_proj`` = ``v (Dh -> 1)``, no bias.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        self.query_dim = positive_int(query_dim, "query_dim")
        self.key_dim = positive_int(key_dim, "key_dim")
        self.hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=True)
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)
        self.score_proj = nn.Linear(hidden_dim, 1, bias=False)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """``v^T tanh(W1 h + W2 s)`` for every query and key: ``(B, N, M)``."""
        hk = self.key_proj(keys)  # (B, M, Dh)
        hq = self.query_proj(query)  # (B, N, Dh)
        energy = torch.tanh(hq.unsqueeze(2) + hk.unsqueeze(1))  # (B, N, M, Dh)
        return self.score_proj(energy).squeeze(-1)  # (B, N, M)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, hidden_dim={self.hidden_dim}"


_SCORES = ("dot", "general", "concat")


class LuongAttention(_ScoredAttention):
    """Luong (multiplicative) attention with the paper's three score functions.

    Args:
        query_dim: size ``Dq`` of the query (decoder state ``s``).
        key_dim: size ``Dk`` of the keys (encoder states ``h``).
        score: ``"dot"`` (``s^T h``, needs ``Dq == Dk``), ``"general"`` (``s^T W h``,
            ``W`` is ``key_proj``: ``Dk -> Dq``, no bias) or ``"concat"``
            (``v^T tanh(W [s; h])``, ``W`` is ``concat_proj``: ``Dq + Dk -> Dh``, ``v``
            is ``score_proj``: ``Dh -> 1``, no biases).
        hidden_dim: ``Dh`` for ``"concat"`` (default ``query_dim``); unused otherwise.

    The module returns the context vector and weights; Luong's attentional hidden
    state ``tanh(W_c [c; s])`` belongs to the decoder that uses it.
    """

    def __init__(self, query_dim: int, key_dim: int, score: str = "dot", hidden_dim: int | None = None):
        super().__init__()
        self.query_dim = positive_int(query_dim, "query_dim")
        self.key_dim = positive_int(key_dim, "key_dim")
        if score not in _SCORES:
            raise ValueError(f"score must be one of {list(_SCORES)}, got {score!r}")
        self.score = score
        self.hidden_dim = query_dim if hidden_dim is None else positive_int(hidden_dim, "hidden_dim")
        if score == "dot" and query_dim != key_dim:
            raise ValueError(
                f"score='dot' needs query_dim == key_dim, got query_dim={query_dim} and key_dim={key_dim} "
                "(use score='general' for different sizes)"
            )
        if score == "general":
            self.key_proj = nn.Linear(key_dim, query_dim, bias=False)
        elif score == "concat":
            self.concat_proj = nn.Linear(query_dim + key_dim, self.hidden_dim, bias=False)
            self.score_proj = nn.Linear(self.hidden_dim, 1, bias=False)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalized scores ``(B, N, M)`` of ``query (B, N, Dq)`` against ``keys (B, M, Dk)``."""
        if self.score == "dot":
            return torch.bmm(query, keys.transpose(1, 2))  # (B, N, M)
        if self.score == "general":
            return torch.bmm(query, self.key_proj(keys).transpose(1, 2))  # (B, N, M)
        # W [s; h] = W_s s + W_h h: split the weight instead of building (B, N, M, Dq+Dk)
        w_s, w_h = self.concat_proj.weight.split([self.query_dim, self.key_dim], dim=1)
        energy = torch.tanh((query @ w_s.T).unsqueeze(2) + (keys @ w_h.T).unsqueeze(1))  # (B, N, M, Dh)
        return self.score_proj(energy).squeeze(-1)  # (B, N, M)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, score={self.score!r}"
