"""Absolute position encodings added to token embeddings: sinusoidal and learned.

* Sinusoidal (Vaswani et al., 2017, "Attention Is All You Need", section 3.5)::

      pe[p, 2i]   = sin(p / base^(2i / dim))
      pe[p, 2i+1] = cos(p / base^(2i / dim))

  A fixed function of the position, so it serves any length. For an odd ``dim`` the
  last channel is a sine with no cosine partner.
* Learned (Gehring et al., 2017; Devlin et al., 2019 "BERT"): one trained vector per
  position up to ``max_len``; longer sequences are an error.

Both take ``x (B, N, dim)`` and an integer ``offset`` (the position of ``x[:, 0]``, for
KV-cached decoding where step ``t`` feeds only its new token) and return
``x + pe[offset : offset + N]``.

Time O(B N dim) per call; memory O(L dim) for the table, ``L`` the longest position
seen (sinusoidal, grown on demand) or ``max_len`` (learned).
Shape legend: ``B`` batch, ``N`` sequence length, ``dim`` model width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["LearnedPositional", "SinusoidalPositional", "sinusoidal_table"]


def _check_dim(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_offset(offset) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be a non-negative int (the position of x[:, 0]), got {offset!r}")
    return offset


def _check_x(x: Tensor, dim: int) -> None:
    if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != dim:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (batch, seq, dim={dim}), got {shape}")


def sinusoidal_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Sinusoidal codes of ``positions``: ``(P,) -> (P, dim)``, computed in float64.

    Column ``2i`` holds ``sin(p * w_i)`` and column ``2i+1`` holds ``cos(p * w_i)`` with
    ``w_i = base^(-2i / dim)``; for odd ``dim`` the last column is a sine.
    """
    _check_dim("dim", dim)
    pos = positions.to(torch.float64).reshape(-1, 1)  # (P, 1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device) * (-math.log(base) / dim))
    angles = pos * div  # (P, ceil(dim/2))
    out = torch.empty(pos.shape[0], dim, dtype=torch.float64, device=pos.device)  # (P, dim)
    out[:, 0::2] = torch.sin(angles)
    out[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return out


class SinusoidalPositional(nn.Module):
    """Fixed sinusoidal positions, for any length.

    Args:
        dim: model width (any positive int; an odd width ends with a lone sine).
        base: wavelength base (10000 in the paper).

    The table is computed and cached in float64 (a buffer not saved in the state
    dict), grown by doubling when a longer position is asked for, and cast to the
    dtype of ``x`` when added.
    """

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim = _check_dim("dim", dim)
        if not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"base must be a number > 1, got {base!r}")
        self.base = float(base)
        self.register_buffer("_table", torch.empty(0, dim, dtype=torch.float64), persistent=False)  # (L, dim)

    def table(self, length: int, offset: int = 0) -> Tensor:
        """Codes of positions ``offset .. offset + length - 1``: ``(length, dim)`` (cache dtype, float64)."""
        _check_dim("length", length, minimum=0)
        _check_offset(offset)
        need = offset + length
        if self._table.shape[0] < need:
            size = max(64, 1 << (need - 1).bit_length())
            pos = torch.arange(size, device=self._table.device)
            self._table = sinusoidal_table(pos, self.dim, self.base).to(self._table.dtype)  # (L, dim)
        return self._table[offset:need]

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (B, N, dim) -> x + pe[offset : offset + N]`` (same shape and dtype)."""
        _check_x(x, self.dim)
        pe = self.table(x.shape[1], offset)  # (N, dim)
        return x + pe.to(device=x.device, dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}"


class LearnedPositional(nn.Module):
    """One learned vector per position, ``max_len`` positions.

    Args:
        dim: model width.
        max_len: number of positions; ``offset + N > max_len`` raises ValueError.
        init_std: standard deviation of the normal initialization (BERT uses 0.02).
    """

    def __init__(self, dim: int, max_len: int, init_std: float = 0.02):
        super().__init__()
        self.dim = _check_dim("dim", dim)
        self.max_len = _check_dim("max_len", max_len)
        self.weight = nn.Parameter(torch.randn(max_len, dim) * init_std)  # (max_len, dim)

    def table(self, length: int, offset: int = 0) -> Tensor:
        """Codes of positions ``offset .. offset + length - 1``: ``(length, dim)``."""
        _check_dim("length", length, minimum=0)
        _check_offset(offset)
        if offset + length > self.max_len:
            raise ValueError(
                f"sequence of length {length} at offset {offset} needs {offset + length} positions, "
                f"but LearnedPositional has max_len={self.max_len}"
            )
        return self.weight[offset : offset + length]

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x (B, N, dim) -> x + weight[offset : offset + N]``."""
        _check_x(x, self.dim)
        return x + self.table(x.shape[1], offset).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}"
