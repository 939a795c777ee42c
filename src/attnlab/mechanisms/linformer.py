"""Linformer: attention over keys and values projected along the sequence to ``k`` rows.

Wang, Li, Khabsa, Fang and Ma, 2020, "Linformer: Self-Attention with Linear
Complexity".

Learned projections ``E, F`` of shape ``(k, max_len)`` compress the sequence axis:

    out = softmax(Q (E K)^T / sqrt(D)) (F V)

A sequence of ``M <= max_len`` keys uses the first ``M`` columns of ``E`` and ``F``;
longer ones raise ValueError. Sharing options of the paper: ``share_kv=True`` uses one
projection for keys and values (``E = F``); ``heads=None`` shares one projection
across all heads ("headwise" sharing), ``heads=H`` gives each head its own; passing
one ``Linformer`` instance to several layers shares it across layers ("layerwise").

Key padding: padded keys and values are zeroed before the projection, so they take no
part in any projected row (a padded batch row equals the row run alone, since the
columns of ``E`` and ``F`` beyond its length then multiply zeros). A row whose keys
are all masked yields zeros. Causal and other masks cannot be applied to projected
keys (each projected row mixes every position) and raise ValueError, as do biases and
``return_weights`` (the weights are over the ``k`` projected rows, not the keys).

Complexity: time O(B H (M k (D + Dv) + N k (D + Dv))), memory O(B H (k (D + Dv) + N k))
plus the ``k x max_len`` parameters; linear in the sequence length for fixed ``k``.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries,
``M`` keys, ``D`` head dim, ``Dv`` value dim, ``k`` projected length, ``P`` projection
count (1 or the number of heads).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..exact import attention
from ..exact.registry import get_backend
from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism
from .linear import mask_mode, repeat_kv

__all__ = ["Linformer"]


@register_mechanism
class Linformer(Mechanism):
    """Linformer attention with learned sequence projections.

    Args:
        max_len: longest key sequence accepted (columns of the projections).
        k: projected length (rows of the projections).
        heads: ``None`` for one projection shared by all heads, or the number of heads
            (query heads ``H``, or key/value heads ``Hkv`` for grouped-query inputs) for
            one projection per head.
        share_kv: use the key projection ``E`` for values too.
        backend: exact-attention backend over the projected keys (default ``"auto"``).

    Parameters ``E`` (and ``F`` unless ``share_kv``) have shape ``(P, k, max_len)``,
    initialized ``N(0, 2 / (k + max_len))`` (Xavier normal).
    """

    name = "linformer"
    masks_supported = "none, key padding"

    def __init__(
        self, max_len: int, k: int = 256, heads: int | None = None, share_kv: bool = False, backend: str = "auto"
    ):
        super().__init__()
        positive_int(max_len, "max_len")
        positive_int(k, "k")
        if heads is not None and (not isinstance(heads, int) or isinstance(heads, bool) or heads < 1):
            raise ValueError(f"heads must be None or a positive int, got {heads!r}")
        if backend != "auto":
            get_backend(backend)  # raises ValueError naming the known backends
        self.max_len, self.k, self.heads, self.share_kv, self.backend = max_len, k, heads, share_kv, backend
        p = heads or 1
        std = math.sqrt(2.0 / (k + max_len))
        self.E = nn.Parameter(torch.randn(p, k, max_len) * std)
        self.F = None if share_kv else nn.Parameter(torch.randn(p, k, max_len) * std)

    def _project(self, x: Tensor, proj: Tensor, H: int) -> Tensor:
        """``x (B, Hkv, M, D) -> (B, Hkv or H, k, D)`` with ``proj (P, k, max_len)``."""
        B, Hkv, M, D = x.shape
        w = proj[:, :, :M].to(x.dtype)  # (P, k, M)
        if w.shape[0] == 1:
            return w[0] @ x  # (B, Hkv, k, D)
        if w.shape[0] == Hkv:
            return w @ x  # (B, Hkv, k, D)
        if w.shape[0] == H:
            return w @ repeat_kv(x, H // Hkv)  # (B, H, k, D)
        raise ValueError(f"Linformer was built with heads={self.heads}, but the call has {H} query heads and {Hkv} kv heads")

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        """``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)`` with ``M <= max_len``."""
        mode = mask_mode(self.name, q, k, v, mask, bias, return_weights, allow_causal=False)
        M, H = k.shape[2], q.shape[1]
        if M > self.max_len:
            raise ValueError(f"Linformer got {M} keys but max_len={self.max_len}; build it with max_len >= {M}")
        if mode.keep is not None:
            keep = mode.keep[:, None, :, None].to(k.dtype)  # (B, 1, M, 1)
            k, v = k * keep, v * keep
        kp = self._project(k, self.E, H)  # (B, Hkv or H, k, D)
        vp = self._project(v, self.E if self.F is None else self.F, H)  # (B, Hkv or H, k, Dv)
        return attention(q, kp, vp, backend=self.backend)

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for no mask or key padding with ``M <= max_len`` and matching heads; else the reason."""
        why = reason(mask_mode, self.name, q, k, v, mask, bias, return_weights, allow_causal=False)
        if why is None and k.shape[2] > self.max_len:
            why = f"Linformer got {k.shape[2]} keys but max_len={self.max_len}; build it with max_len >= {k.shape[2]}"
        if why is None and self.E.shape[0] not in (1, k.shape[1], q.shape[1]):
            why = (f"Linformer was built with heads={self.heads}, but the call has {q.shape[1]} query heads and "
                   f"{k.shape[1]} kv heads")
        return why

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"max_len": n, "k": max(1, n // 4)}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        bh, n, m, d, kk = batch * heads, n_queries, n_keys, head_dim, min(self.k, self.max_len)
        flops = bh * (2.0 * 2 * m * kk * d + 2.0 * 2 * n * kk * d)
        mem = 4.0 * bh * (2 * kk * d + n * kk + n * d)
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, k={self.k}, heads={self.heads}, share_kv={self.share_kv}"
