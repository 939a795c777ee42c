"""Rotary position embedding (RoPE), with position interpolation.

Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding".
Each query and key is rotated, pair of channels by pair of channels, by an angle
proportional to its position, so that the score ``q_m . k_n`` depends on the
positions only through ``m - n``. Because it is a transform of ``q`` and ``k`` (not a
score bias), every exact backend, fused kernels included, serves it unchanged and no
N x M tensor is ever built.

Convention: "rotate-half" (GPT-NeoX, Hugging Face LLaMA). Channel ``j`` is paired with
channel ``j + D/2`` (not with its neighbour ``j+1`` as in the RoFormer paper and
GPT-J); the pair rotates by ``theta_j * p`` with ``theta_j = base^(-2j / D)``::

    out[..., :D/2] = x1 * cos - x2 * sin
    out[..., D/2:] = x2 * cos + x1 * sin        (x1 = x[..., :D/2], x2 = x[..., D/2:])

Weights trained with the interleaved convention need their q/k projection rows
permuted before use.

Position interpolation (Chen et al., 2023, "Extending Context Window of Large Language
Models via Positional Interpolation"): positions are divided by
``interpolation_factor`` before rotating, so a model trained on ``L`` positions sees
``f * L`` positions squeezed into the angles it knows.

Time O(B H N D) per call, memory O((N + M) D) for the angles.
Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key heads, ``N`` queries, ``M``
keys, ``D`` head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["RotaryEmbedding", "rotate_half"]


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary embedding for heads of size ``head_dim`` (rotate-half convention).

    Args:
        head_dim: ``D``, must be even.
        base: frequency base (10000 in RoFormer; LLaMA-3 uses 500000).
        interpolation_factor: ``f >= 1`` (any ``f > 0`` is accepted); position ``p`` is
            rotated as if it were ``p / f``.

    Angles are computed in float32 (float64 for float64 inputs) and the result is cast
    back to the input dtype.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interpolation_factor: float = 1.0):
        super().__init__()
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int (channels rotate in pairs), got {head_dim!r}")
        if not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"base must be a number > 1, got {base!r}")
        if not isinstance(interpolation_factor, (int, float)) or not interpolation_factor > 0:
            raise ValueError(f"interpolation_factor must be a positive number, got {interpolation_factor!r}")
        self.head_dim = head_dim
        self.base = float(base)
        self.interpolation_factor = float(interpolation_factor)
        self.register_buffer("inv_freq", self._frequencies(torch.device("cpu")), persistent=False)

    def _frequencies(self, device) -> Tensor:
        """``base ** (-2j / D)`` in float64, ``(D/2,)``."""
        return self.base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim)

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) must not quantize the frequencies: recompute them in float64
        out = super()._apply(fn, recurse)
        self.inv_freq = self._frequencies(self.inv_freq.device)
        return out

    def cos_sin(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` of the angles of ``positions``: ``(..., P) -> (..., P, D)`` each.

        Each angle is repeated for both channels of its pair (``j`` and ``j + D/2``).
        """
        pos = positions.to(torch.float64) / self.interpolation_factor
        ang = pos.unsqueeze(-1) * self.inv_freq.to(device=pos.device, dtype=torch.float64)  # (..., P, D/2)
        ang = torch.cat((ang, ang), dim=-1)  # (..., P, D)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x (B, H, P, D)`` at ``positions`` ``(P,)`` or ``(B, P)``; same shape and dtype."""
        if x.ndim != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must have shape (batch, heads, seq, head_dim={self.head_dim}), got {tuple(x.shape)}")
        positions = torch.as_tensor(positions, device=x.device)
        b, _, p, _ = x.shape
        if positions.shape not in ((p,), (b, p)):
            raise ValueError(
                f"positions must have shape (seq,)=({p},) or (batch, seq)=({b}, {p}), got {tuple(positions.shape)}"
            )
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(positions, work)  # (P, D) or (B, P, D)
        if cos.ndim == 3:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, P, D)
        xw = x.to(work)
        return (xw * cos + rotate_half(xw) * sin).to(x.dtype)

    def apply(  # type: ignore[override]
        self, q: Tensor, k: Tensor | None = None, q_positions: Tensor | None = None, k_positions: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys by their positions.

        (Called with a single function instead of tensors, as ``nn.Module.apply(fn)``
        recursing from a parent module does, it behaves as ``nn.Module.apply``.)

        Args:
            q: ``(B, H, N, D)``.
            k: ``(B, Hkv, M, D)``.
            q_positions: integer (or real) positions ``(N,)`` or ``(B, N)``; default
                ``M - N .. M - 1`` (queries are the last N positions, as in
                :mod:`attnlab.masks`).
            k_positions: ``(M,)`` or ``(B, M)``; default ``0 .. M - 1``.

        Returns:
            ``(q_rotated, k_rotated)`` with the shapes and dtypes of ``q`` and ``k``.
        """
        if k is None and callable(q) and not isinstance(q, Tensor):
            return super().apply(q)  # nn.Module.apply(fn), e.g. model.apply(init_weights)
        if not isinstance(q, Tensor) or not isinstance(k, Tensor):
            raise ValueError(f"q and k must be tensors, got {type(q).__name__} and {type(k).__name__}")
        n, m = q.shape[-2], k.shape[-2]
        if q_positions is None:
            q_positions = torch.arange(m - n, m, device=q.device)
        if k_positions is None:
            k_positions = torch.arange(m, device=k.device)
        return self.rotate(q, q_positions), self.rotate(k, k_positions)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, interpolation_factor={self.interpolation_factor:g}"
