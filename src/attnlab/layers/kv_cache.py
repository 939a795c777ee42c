"""Key/value cache for incremental (token-by-token) decoding.

One :class:`KVCache` per attention layer holds the projected keys and values of every
position seen so far, so that decoding step ``t`` projects only its new token(s) and
attends to ``t`` cached keys instead of recomputing all of them: a step costs
O(B H T D) time instead of O(B H T^2 D) for re-running the prefix, and the cache holds
O(B Hkv T D) memory.

Two kinds:

* **growing** (``KVCache()``, self-attention): every call appends the new keys/values
  along the sequence axis. Storage is preallocated and doubled when full (amortized
  O(1) copies per token); when autograd tracks the new keys (training through the
  cache) it concatenates instead, which is always safe for autograd.
* **static** (``KVCache(static=True)``, cross-attention): the encoder keys/values are
  projected once, on the first call, and reused unchanged by every later call.

Keys are stored *after* any q/k positional transform (rotary), at their absolute
positions, so cached and full forwards agree.

Shape legend: ``B`` batch, ``Hkv`` key/value heads, ``T`` cached positions, ``D`` key
head dim, ``Dv`` value head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..utils import positive_int

__all__ = ["KVCache"]


class KVCache:
    """Per-layer store of keys ``(B, Hkv, T, D)`` and values ``(B, Hkv, T, Dv)``.

    Args:
        static: False (default) for self-attention, where each call appends; True for
            cross-attention, where the first call fills the cache and later calls reuse it.
        capacity: initial number of positions to preallocate (growing cache only); the
            storage doubles whenever it is full.

    Attributes:
        static: whether this is a static (cross-attention) cache.
        length: number of cached positions ``T``.
    """

    def __init__(self, static: bool = False, capacity: int = 16):
        positive_int(capacity, "capacity")
        self.static = bool(static)
        self.capacity_hint = capacity
        self._k: Tensor | None = None  # (B, Hkv, capacity, D)
        self._v: Tensor | None = None  # (B, Hkv, capacity, Dv)
        self._len = 0

    # -- state -----------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Number of cached positions ``T``."""
        return self._len

    def __len__(self) -> int:
        return self._len

    @property
    def filled(self) -> bool:
        """True once the cache holds at least one position."""
        return self._len > 0

    @property
    def k(self) -> Tensor | None:
        """Cached keys ``(B, Hkv, T, D)``, or None when empty."""
        return None if self._k is None else self._k[:, :, : self._len]

    @property
    def v(self) -> Tensor | None:
        """Cached values ``(B, Hkv, T, Dv)``, or None when empty."""
        return None if self._v is None else self._v[:, :, : self._len]

    @property
    def capacity(self) -> int:
        """Positions the current storage can hold before it grows."""
        return 0 if self._k is None else self._k.shape[2]

    def reset(self) -> None:
        """Forget everything (the next call starts a new sequence)."""
        self._k = self._v = None
        self._len = 0

    # -- writing ---------------------------------------------------------------------
    def _check(self, k: Tensor, v: Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.ndim != 4:
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 4-D tensor (B, Hkv, T, D), got {shape}")
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must agree in (B, Hkv, T), got k {tuple(k.shape)} and v {tuple(v.shape)}")
        if self._k is not None:
            ck, cv = self._k, self._v
            if k.shape[:2] != ck.shape[:2] or k.shape[3] != ck.shape[3] or v.shape[3] != cv.shape[3]:
                raise ValueError(
                    f"new keys/values k {tuple(k.shape)}, v {tuple(v.shape)} do not match the cached "
                    f"(B, Hkv, T, D)={tuple(self.k.shape)} and Dv={cv.shape[3]}"
                )
            if k.dtype != ck.dtype or k.device != ck.device:
                raise ValueError(
                    f"new keys are {k.dtype} on {k.device} but the cache holds {ck.dtype} on {ck.device}"
                )

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B, Hkv, t, D)`` and ``v (B, Hkv, t, Dv)``; return all cached keys and values.

        Returns:
            ``(k_all (B, Hkv, T, D), v_all (B, Hkv, T, Dv))`` with ``T`` the new length.

        Raises:
            ValueError: on a static cache, or when the shapes/dtype do not match the cache.
        """
        if self.static:
            raise ValueError("cannot append to a static KVCache (static=True holds cross-attention keys); use set()")
        self._check(k, v)
        t = k.shape[2]
        tracked = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)
        if self._k is None:
            if tracked:
                self._k, self._v = k, v
            else:
                cap = max(self.capacity_hint, t)
                self._k = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])  # (B, Hkv, cap, D)
                self._v = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])  # (B, Hkv, cap, Dv)
                self._k[:, :, :t] = k
                self._v[:, :, :t] = v
        elif tracked:
            # autograd must see a fresh tensor: concatenate (storage is then exactly full)
            self._k = torch.cat([self.k, k], dim=2)  # (B, Hkv, T, D)
            self._v = torch.cat([self.v, v], dim=2)  # (B, Hkv, T, Dv)
        else:
            need = self._len + t
            if need > self.capacity:
                cap = max(need, 2 * self.capacity)
                nk = self._k.new_empty(*self._k.shape[:2], cap, self._k.shape[3])  # (B, Hkv, cap, D)
                nv = self._v.new_empty(*self._v.shape[:2], cap, self._v.shape[3])  # (B, Hkv, cap, Dv)
                nk[:, :, : self._len] = self.k
                nv[:, :, : self._len] = self.v
                self._k, self._v = nk, nv
            self._k[:, :, self._len : need] = k
            self._v[:, :, self._len : need] = v
        self._len += t
        return self.k, self.v

    def set(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Replace the contents with ``k (B, Hkv, T, D)``, ``v (B, Hkv, T, Dv)`` (static caches)."""
        self._k = self._v = None
        self._check(k, v)
        self._k, self._v = k, v
        self._len = k.shape[2]
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in place, e.g. to follow the surviving beams of beam search.

        Args:
            index: int ``(B',)`` rows of the current batch to keep, in the new order
                (repeats allowed, so a batch can also be expanded to ``B * beams``).
        """
        if self._k is None:
            return
        index = torch.as_tensor(index, device=self._k.device)
        if index.ndim != 1 or index.dtype in (torch.bool,) or index.dtype.is_floating_point:
            raise ValueError(f"index must be a 1-D integer tensor, got {index.dtype} {tuple(index.shape)}")
        self._k = self._k.index_select(0, index)
        self._v = self._v.index_select(0, index)

    def __repr__(self) -> str:
        kind = "static" if self.static else "growing"
        shape = None if self._k is None else tuple(self.k.shape)
        return f"KVCache({kind}, length={self._len}, k={shape})"
