"""T5 relative position bias: a learned scalar per (relative-distance bucket, head).

Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", section 2.1 (after Shaw et al., 2018). Every query/key pair
adds ``embedding[bucket(k_pos - q_pos), h]`` to its score; the table has
``num_buckets x H`` entries, shared by all layers in T5.

Buckets (of ``relative_position = k_pos - q_pos``):

* bidirectional (encoder): half the buckets for keys at or before the query, half (an
  offset of ``num_buckets // 2``) for keys after it; then ``d = |relative_position|``.
  Causal (decoder): every bucket is for keys at or before the query,
  ``d = max(q_pos - k_pos, 0)`` (future keys share bucket 0).
* with ``B`` buckets on a side and ``E = B // 2``: distances ``d < E`` get their own
  bucket ``d``; larger distances get ``E + floor(log(d / E) / log(max_distance / E) *
  (B - E))``, log-spaced up to ``max_distance``; everything beyond falls in the last
  bucket ``B - 1``. (Defaults, bidirectional: ``B = 16``, ``E = 8``: distances 0..7
  exact, 8..11 -> 8, 12..15 -> 9, 16..22 -> 10, ..., 64..90 -> 14, >= 91 -> 15; keys
  after the query add 16. Distance 0 counts as "at or before", so bucket 16 is never
  used, as in T5.) The log is taken in float32, as in the original implementation, so
  pretrained tables line up.

Queries sit at the last ``N`` of the ``M`` key positions (``q_pos = i + M - N``, the
bottom-right alignment of :mod:`attnlab.masks`).

The bias is a function of indices (:meth:`T5RelativeBias.bias_fn`): tiled backends
evaluate it per tile (``chunked`` accumulates the embedding's gradient with a nested
backward per tile) and never build N x M; ``math``/``sdpa`` evaluate it once.
Time O(B H N M) added to attention, memory O(num_buckets H) (O(H N M) where a backend
materializes). Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._common import BiasFn, check_counts, check_heads, index_grid

__all__ = ["T5RelativeBias", "relative_position_bucket"]


def _check_buckets(num_buckets, max_distance, bidirectional: bool) -> None:
    if not isinstance(num_buckets, int) or isinstance(num_buckets, bool):
        raise ValueError(f"num_buckets must be an int, got {num_buckets!r}")
    least = 4 if bidirectional else 2
    if num_buckets < least:
        raise ValueError(f"num_buckets must be >= {least} (bidirectional={bidirectional}), got {num_buckets}")
    per_side = num_buckets // 2 if bidirectional else num_buckets
    exact = per_side // 2
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance <= exact:
        raise ValueError(
            f"max_distance must be an int > {exact} (the exactly-bucketed distances for num_buckets={num_buckets}, "
            f"bidirectional={bidirectional}), got {max_distance!r}"
        )


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each ``relative_position = key_pos - query_pos`` (integer tensor, any shape).

    Returns an int64 tensor of the same shape with values in ``[0, num_buckets)``; see
    the module docstring for the scheme.
    """
    _check_buckets(num_buckets, max_distance, bidirectional)
    rel = relative_position.long()
    back = -rel  # how far the key lies before the query
    if bidirectional:
        side = num_buckets // 2
        offset = (back < 0).long() * side  # keys after the query use the upper half
        dist = back.abs()
    else:
        side = num_buckets
        offset = torch.zeros_like(back)
        dist = back.clamp(min=0)
    exact = side // 2
    ratio = torch.log(dist.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = exact + (ratio * (side - exact)).long()  # log-spaced buckets
    far = far.clamp(max=side - 1)
    return offset + torch.where(dist < exact, dist, far)


class T5RelativeBias(nn.Module):
    """Learned bucketed relative position bias for :func:`attnlab.attention` (``bias=``).

    Args:
        heads: number of query heads ``H``.
        num_buckets: number of buckets (32 in T5).
        max_distance: distance from which all pairs share the last bucket (128 in T5).
        bidirectional: True for encoders (keys on both sides), False for causal decoders.
        init_std: standard deviation of the normal initialization of the table.

    Attributes:
        embedding: ``nn.Embedding(num_buckets, heads)``; ``embedding.weight[b, h]`` is
            the bias of head ``h`` for bucket ``b`` (the layout of T5's
            ``relative_attention_bias``).
    """

    def __init__(
        self, heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
        init_std: float = 0.02,
    ):
        super().__init__()
        if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
            raise ValueError(f"heads must be a positive int, got {heads!r}")
        _check_buckets(num_buckets, max_distance, bool(bidirectional))
        self.heads, self.num_buckets, self.max_distance = heads, num_buckets, max_distance
        self.bidirectional = bool(bidirectional)
        self.embedding = nn.Embedding(num_buckets, heads)  # (num_buckets, H)
        nn.init.normal_(self.embedding.weight, std=init_std)

    def bucket(self, relative_position: Tensor) -> Tensor:
        """Bucket of each ``key_pos - query_pos`` under this module's settings."""
        return relative_position_bucket(relative_position, self.bidirectional, self.num_buckets, self.max_distance)

    def bias_fn(self, n_q: int, n_k: int) -> BiasFn:
        """A bias function ``(b, h, q_idx, kv_idx) -> bias`` for ``n_q`` queries and ``n_k`` keys.

        The result has the broadcast shape of the index tensors (the batch index is not
        read) and requires grad when the embedding does, so gradients reach
        ``embedding.weight`` through every backend that differentiates bias functions.
        """
        check_counts(n_q, n_k)
        off = n_k - n_q
        heads = self.heads

        def t5_bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            check_heads(h, heads, "T5RelativeBias")
            bucket = self.bucket(kv_idx - (q_idx + off))  # (1, 1, n, m) or scalar
            weight = self.embedding.weight  # (num_buckets, H)
            if bucket.ndim == 4 and bucket.shape[:2] == (1, 1) and h.ndim == 4 and h.shape[::2] == (1, 1):
                # index grids: one index_select per call (forward and backward are far
                # faster on CPU than broadcast advanced indexing)
                rows = weight.t()[h.reshape(-1)]  # (H', num_buckets)
                n, m = bucket.shape[2:]
                return rows.index_select(1, bucket.reshape(-1)).view(1, -1, n, m)  # (1, H', n, m)
            return weight[bucket, h]  # broadcast shape, e.g. scalars under FlexAttention

        t5_bias.relative = True  # a function of the head and of key - query position alone (kernels may tabulate it)
        return t5_bias

    def dense(self, n_q: int, n_k: int, device=None) -> Tensor:
        """The bias as a tensor ``(1, H, N, M)`` (differentiable in the embedding)."""
        dev = device if device is not None else self.embedding.weight.device
        return self.bias_fn(n_q, n_k)(*index_grid(self.heads, n_q, n_k, dev))

    def forward(self, n_q: int, n_k: int) -> Tensor:
        """Same as :meth:`dense`."""
        return self.dense(n_q, n_k)

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )
