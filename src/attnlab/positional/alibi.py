"""ALiBi: attention with linear biases.

Press, Smith and Lewis, 2022, "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation". No position is added to the embeddings; instead
head ``h`` adds ``-slope_h * distance`` to the score of every query/key pair, so
far-away keys are penalized linearly, with a different rate per head.

Slopes. For ``n`` heads, ``n`` a power of two, the slopes are the geometric sequence
``2^(-8/n * i)`` for ``i = 1 .. n`` (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, with
``p`` the largest power of two below ``n``, the paper takes the ``p`` slopes for ``p``
heads followed by the first ``n - p`` of every other slope (1st, 3rd, ...) of the
``2p``-head sequence; those interleave between the ones already taken.

Distances. Queries sit at the last ``N`` of the ``M`` key positions (query ``i`` is at
``i + M - N``, the bottom-right alignment of :mod:`attnlab.masks`, right for a KV
cache). Causal (the paper's decoder): ``bias = -slope * (q_pos - k)``, meant to be used
with ``masks.causal()``; future keys (``k > q_pos``) get a positive value that the mask
must remove. Symmetric (encoders): ``bias = -slope * |q_pos - k|``.

The bias is a function of indices (:meth:`ALiBi.bias_fn`) so tiled backends
(``chunked``, ``flex``) evaluate it tile by tile and never build N x M; the dense
backends (``math``, ``sdpa``) evaluate it once on the full grid.
Time O(B H N M) added to attention, memory O(H) (O(H N M) where a backend materializes).
Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._common import BiasFn, check_counts, check_heads, index_grid

__all__ = ["ALiBi", "alibi_slopes"]

def _geometric(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(heads: int) -> list[float]:
    """The paper's per-head slopes (see the module docstring), head 0 first."""
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise ValueError(f"heads must be a positive int, got {heads!r}")
    p = 2 ** int(math.floor(math.log2(heads)))
    if p == heads:
        return _geometric(heads)
    return _geometric(p) + _geometric(2 * p)[0::2][: heads - p]


class ALiBi(nn.Module):
    """Per-head linear distance biases for :func:`attnlab.attention` (``bias=``).

    Args:
        heads: number of query heads ``H``.
        symmetric: False (default) for the paper's causal form ``-slope * (q_pos - k)``
            (use with a causal mask), True for ``-slope * |q_pos - k|`` (encoders).

    The slopes are a float32 buffer ``slopes (H,)``; the bias has its dtype (use
    ``.double()`` for a float64 bias).
    """

    def __init__(self, heads: int, symmetric: bool = False):
        super().__init__()
        self.heads = heads
        self.symmetric = bool(symmetric)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(heads), dtype=torch.float32), persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) must not round the slopes: keep them float32
        out = super()._apply(fn, recurse)
        self.slopes = torch.tensor(alibi_slopes(self.heads), dtype=torch.float32, device=self.slopes.device)
        return out

    def bias_fn(self, n_q: int, n_k: int) -> BiasFn:
        """A bias function ``(b, h, q_idx, kv_idx) -> bias`` for a call with ``n_q`` queries and ``n_k`` keys.

        The index tensors broadcast (``(B,1,1,1)``, ``(1,H,1,1)``, ``(1,1,n,1)``,
        ``(1,1,1,m)`` or 0-d scalars, as FlexAttention passes them); the result has
        their broadcast shape (the batch index is not read). Pass it as
        ``attnlab.attention(q, k, v, bias=alibi.bias_fn(N, M), mask=masks.causal())``.
        """
        check_counts(n_q, n_k)
        off = n_k - n_q
        symmetric, heads = self.symmetric, self.heads

        def alibi_bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            check_heads(h, heads, "ALiBi")
            slope = self.slopes.to(q_idx.device)[h]  # (1, H, 1, 1) or scalar
            dist = q_idx + off - kv_idx  # query position - key position, (1, 1, n, m)
            if symmetric:
                dist = dist.abs()
            return -(slope * dist)

        alibi_bias.relative = True  # a function of the head and of key - query position alone (kernels may tabulate it)
        return alibi_bias

    def dense(self, n_q: int, n_k: int, device=None) -> Tensor:
        """The bias as a tensor ``(1, H, N, M)`` (the reference the tiled path is tested against)."""
        fn = self.bias_fn(n_q, n_k)
        return fn(*index_grid(self.heads, n_q, n_k, device if device is not None else self.slopes.device))

    def forward(self, n_q: int, n_k: int) -> Tensor:
        """Same as :meth:`dense`."""
        return self.dense(n_q, n_k)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, symmetric={self.symmetric}"
