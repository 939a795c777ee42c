"""2-D self-attention over feature maps (non-local blocks, SAGAN).

Wang et al., "Non-local Neural Networks" (2018); Zhang et al., "Self-Attention
Generative Adversarial Networks" (SAGAN, 2019), whose residual ``x + gamma * attn(x)``
with a learnable ``gamma`` initialized to 0 lets a network start from its convolutional
path and blend attention in. Every pixel attends to every pixel: with ``L = Hh * Ww``
positions, time O(B L^2 C); memory O(B heads L^2) on the ``math`` backend but
O(B L C) on the memory-lean ones (``sdpa``, ``chunked``), which
:func:`attnlab.attention` picks for long maps.

Shape legend: ``B`` batch, ``C`` channels, ``Hh`` x ``Ww`` the map, ``L = Hh * Ww``
positions (queries and keys), ``heads`` heads, ``D`` head dim (``Dqk`` for q/k,
``Dv = C / heads`` for values).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..exact import attention
from ..utils import positive_int

__all__ = ["SpatialSelfAttention"]

_RESIDUALS = ("none", "add", "gamma")


class SpatialSelfAttention(nn.Module):
    """Multi-head self-attention between all positions of a ``(B, C, Hh, Ww)`` map.

    ``1x1`` convolutions make queries, keys and values, heads attend with the
    ``1/sqrt(Dqk)`` scale of their own head dim, and a ``1x1`` convolution projects the
    merged heads back to ``C`` channels.

    Args:
        channels: ``C``, channels in and out.
        heads: number of heads; must divide ``channels`` and ``qk_channels``.
        qk_channels: channels of queries/keys (default ``channels``; SAGAN uses
            ``channels // 8``).
        residual: ``"none"`` (return the attention branch), ``"add"`` (``x + branch``)
            or ``"gamma"`` (SAGAN: ``x + gamma * branch`` with a learnable scalar
            ``gamma`` initialized to 0, so the block starts as the identity).
        dropout: attention-weight dropout (training mode only).
        bias: whether the 1x1 convolutions have biases.
        backend: exact attention backend for :func:`attnlab.attention` (``"auto"``).
    """

    def __init__(
        self,
        channels: int,
        heads: int = 1,
        *,
        qk_channels: int | None = None,
        residual: str = "none",
        dropout: float = 0.0,
        bias: bool = True,
        backend: str = "auto",
    ):
        super().__init__()
        positive_int(channels, "channels")
        positive_int(heads, "heads")
        qk_channels = channels if qk_channels is None else positive_int(qk_channels, "qk_channels")
        if channels % heads or qk_channels % heads:
            raise ValueError(
                f"heads must divide channels and qk_channels, got heads={heads}, channels={channels}, "
                f"qk_channels={qk_channels}"
            )
        if residual not in _RESIDUALS:
            raise ValueError(f"residual must be one of {list(_RESIDUALS)}, got {residual!r}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.channels, self.heads, self.qk_channels = channels, heads, qk_channels
        self.residual, self.dropout, self.backend = residual, float(dropout), backend
        self.q = nn.Conv2d(channels, qk_channels, kernel_size=1, bias=bias)
        self.k = nn.Conv2d(channels, qk_channels, kernel_size=1, bias=bias)
        self.v = nn.Conv2d(channels, channels, kernel_size=1, bias=bias)
        self.proj = nn.Conv2d(channels, channels, kernel_size=1, bias=bias)
        if residual == "gamma":
            self.gamma = nn.Parameter(self.proj.weight.new_zeros(()))

    def _heads(self, x: Tensor) -> Tensor:
        b, c, hh, ww = x.shape
        return x.reshape(b, self.heads, c // self.heads, hh * ww).transpose(2, 3)  # (B, heads, L, D)

    def forward(self, x: Tensor, *, mask=None, return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Attend between all positions of ``x``.

        Args:
            x: feature map ``(B, C, Hh, Ww)``.
            mask: optional :mod:`attnlab.masks` mask over the ``L`` flattened
                (row-major) positions, queries and keys alike.
            return_weights: also return the weights ``(B, heads, L, L)`` (uses the
                ``math`` backend, O(L^2) memory).

        Returns:
            ``(B, C, Hh, Ww)``, or ``(out, weights)`` with ``return_weights``.
        """
        if not isinstance(x, Tensor) or x.ndim != 4:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a 4-D feature map (B, C, H, W), got {shape}")
        if x.shape[1] != self.channels:
            raise ValueError(f"x must have {self.channels} channels (dim 1), got shape {tuple(x.shape)}")
        b, c, hh, ww = x.shape
        q = self._heads(self.q(x))  # (B, heads, L, Dqk)
        k = self._heads(self.k(x))  # (B, heads, L, Dqk)
        v = self._heads(self.v(x))  # (B, heads, L, Dv)
        backend = "math" if return_weights and self.backend == "auto" else self.backend
        res = attention(
            q, k, v, mask=mask, dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights, backend=backend,
        )
        out, weights = res if return_weights else (res, None)
        out = out.transpose(2, 3).reshape(b, c, hh, ww)  # (B, C, Hh, Ww)
        out = self.proj(out)  # (B, C, Hh, Ww)
        if self.residual == "add":
            out = x + out
        elif self.residual == "gamma":
            out = x + self.gamma * out
        if return_weights:
            return out, weights
        return out

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, heads={self.heads}, qk_channels={self.qk_channels}, "
            f"residual={self.residual!r}, backend={self.backend!r}"
        )
