"""Performer: FAVOR+ attention with positive orthogonal random features.

Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos, Hawkins, Davis, Mohiuddin,
Kaiser, Belanger, Colwell and Weller, 2021, "Rethinking Attention with Performers"
(ICLR 2021).

The softmax kernel ``exp(q . k / sqrt(D))`` is estimated without bias by
``phi(q') . phi(k')`` with ``x' = x / D^(1/4)`` and the positive random features::

    phi(x) = exp(w_i . x - |x|^2 / 2) / sqrt(m),   i = 1..m,

where the rows ``w_i`` are drawn block-orthogonal (each block of ``D`` rows is the Q
of a Gaussian matrix's QR, each row rescaled to a norm drawn from the chi
distribution with ``D`` degrees of freedom, as the norm of a Gaussian vector would be).
Exponents are stabilized by subtracting a maximum (per query row for queries, one per
(batch, head) for keys); both cancel in the normalization, as do ``1/sqrt(m)`` and the
queries' ``exp(-|q'|^2/2)``, which are therefore never computed. In causal mode the key
stabilizer is the maximum over all keys, so a future key whose exponent exceeds every
past key's by more than float range (about 87 in float32) would underflow the past
keys' features; the kernel math is unaffected, only float rounding (relative ~1e-7 in
float32) reaches past outputs. ``kernel="relu"`` uses the
generalized kernel ``phi(x) = relu(w_i . x) / sqrt(m) + eps`` instead.

The attention itself is :func:`attnlab.mechanisms.linear.kernel_attention`:
``phi(K)^T V`` first (non-causal) or chunked prefix sums (causal).

Complexity with ``m`` features: time O(B H (N + M) m (D + Dv)) non-causal, plus
O(B H N C (m + Dv)) causal (chunk ``C``); memory O(B H (N + M) m) plus
O(B H (N/C) m Dv + B H N C) causal.

Masks: none, key padding (padded keys get zero features) and ``causal()``; other
masks, causal combined with padding, and biases raise ValueError.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries,
``M`` keys, ``D`` head dim, ``Dv`` value dim, ``m`` features.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism
from .linear import kernel_attention, kernel_weights, mask_mode

__all__ = ["Performer", "orthogonal_gaussian"]


def orthogonal_gaussian(
    features: int, dim: int, *, orthogonal: bool = True, generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32, device=None,
) -> Tensor:
    """Random projection ``(features, dim)`` whose rows are marginally ``N(0, I_dim)``.

    With ``orthogonal=True`` rows are orthogonal within each block of ``dim`` rows
    (Q factors of Gaussian matrices), and each row's norm is redrawn from the chi
    distribution (the norm of a fresh Gaussian ``dim``-vector).
    """
    if not orthogonal:
        return torch.randn(features, dim, generator=generator, dtype=dtype, device=device)
    blocks = -(-features // dim)
    g = torch.randn(blocks, dim, dim, generator=generator, dtype=torch.float64, device=device)
    qmat, r = torch.linalg.qr(g)  # (blocks, dim, dim), orthonormal columns
    qmat = qmat * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # sign fix: Haar-distributed
    w = qmat.transpose(-1, -2).reshape(blocks * dim, dim)[:features]  # (features, dim), rows orthonormal per block
    norms = torch.randn(features, dim, generator=generator, dtype=torch.float64, device=device).norm(dim=1)
    return (w * norms[:, None]).to(dtype)


@register_mechanism
class Performer(Mechanism):
    """FAVOR+ attention.

    Args:
        features: number ``m`` of random features.
        head_dim: draw the projection now for this head dim; default: on the first call.
        kernel: ``"softmax"`` (positive random features, unbiased for softmax) or
            ``"relu"`` (generalized ReLU kernel).
        orthogonal: block-orthogonal rows (FAVOR+) instead of i.i.d. Gaussian ones.
        redraw_interval: in training mode, draw new features every this many forward
            calls; ``None`` or 0 never redraws. Evaluation mode never redraws.
        chunk_size: chunk length of the causal prefix sums.
        seed: seed of a private generator for the draws (default: the global RNG, so
            ``torch.manual_seed`` makes the draws reproducible).
        eps: the ReLU kernel's additive constant.

    The projection is the buffer ``projection (m, D)``; :meth:`fix_features` stops
    redraws for good, :meth:`redraw_features` draws now.
    """

    name = "performer"
    masks_supported = "none, key padding, causal (not combined with padding)"

    def __init__(
        self,
        features: int = 256,
        head_dim: int | None = None,
        kernel: str = "softmax",
        orthogonal: bool = True,
        redraw_interval: int | None = 1000,
        chunk_size: int = 128,
        seed: int | None = None,
        eps: float = 1e-3,
    ):
        super().__init__()
        positive_int(features, "features")
        positive_int(chunk_size, "chunk_size")
        positive_int(head_dim, "head_dim", allow_none=True)
        if kernel not in ("softmax", "relu"):
            raise ValueError(f"kernel must be 'softmax' or 'relu', got {kernel!r}")
        if redraw_interval is not None and (not isinstance(redraw_interval, int) or redraw_interval < 0):
            raise ValueError(f"redraw_interval must be a non-negative int or None, got {redraw_interval!r}")
        self.features = features
        self.kernel = kernel
        self.orthogonal = orthogonal
        self.redraw_interval = redraw_interval or 0
        self.chunk_size = chunk_size
        self.eps = eps
        self.fixed = False
        self._calls = 0
        self._generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.register_buffer("projection", None)
        if head_dim is not None:
            self.redraw_features(head_dim)

    # -- features -----------------------------------------------------------------------
    def redraw_features(self, head_dim: int | None = None) -> None:
        """Draw a new projection ``(m, head_dim)`` (default: the current head dim)."""
        if head_dim is None:
            if self.projection is None:
                raise ValueError("redraw_features needs head_dim before the first call")
            head_dim = self.projection.shape[1]
        device = self.projection.device if self.projection is not None else None
        w = orthogonal_gaussian(self.features, head_dim, orthogonal=self.orthogonal, generator=self._generator)
        self.projection = w.to(device) if device is not None else w

    def fix_features(self) -> Performer:
        """Never redraw again (also not in training mode). Returns self."""
        self.fixed = True
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the projection is created lazily: accept a saved one before the first call
        key = prefix + "projection"
        if self.projection is None and key in state_dict:
            self.projection = torch.empty_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def feature_map(self, x: Tensor, is_query: bool, keep: Tensor | None = None) -> Tensor:
        """Features ``(B, H', L, m)`` of queries or keys ``x (B, H', L, D)``.

        Equal to ``phi`` up to factors that cancel in the normalized attention: one
        constant per (batch, head) for keys, one per row for queries (so query rows are
        ``exp(w . q' - max_i w_i . q')``). ``keep (B, L)`` zeroes masked keys' features
        and leaves them out of the key stabilizer. Half-precision inputs are mapped in
        float32 (the exponent needs the precision) and the features cast back.
        """
        if x.dtype in (torch.float16, torch.bfloat16):
            return self._features(x.float(), is_query, keep).to(x.dtype)
        return self._features(x, is_query, keep)

    def _features(self, x: Tensor, is_query: bool, keep: Tensor | None) -> Tensor:
        D = x.shape[-1]
        w = self.projection.to(dtype=x.dtype, device=x.device)  # (m, D)
        x = x * D**-0.25
        proj = x @ w.T  # (B, H', L, m)
        # constant factors (1/sqrt(m), the stabilizers) cancel in the normalization and are
        # left out; per-query factors too (exp(-|q|^2/2)); per-key ones may not be
        if self.kernel == "relu":
            f = torch.relu(proj) + self.eps * math.sqrt(self.features)
            return f if keep is None else f * keep[:, None, :, None].to(f.dtype)
        with torch.no_grad():
            rowmax = proj.amax(dim=-1, keepdim=True)  # (B, H', L, 1)
        if is_query:
            return proj.sub_(rowmax).exp_()  # (B, H', L, m), in place: one buffer
        sq = 0.5 * (x * x).sum(dim=-1, keepdim=True)  # (B, H', L, 1)
        with torch.no_grad():
            peak = rowmax - sq  # (B, H', L, 1) largest exponent of each key
            if keep is not None:
                peak = peak.masked_fill(~keep[:, None, :, None], float("-inf"))
            stab = peak.amax(dim=(-2, -1), keepdim=True)  # (B, H', 1, 1)
            stab = torch.where(torch.isfinite(stab), stab, torch.zeros_like(stab))  # all keys masked
        shift = -sq - stab  # (B, H', L, 1); added (not subtracted): no negation of the big gradient
        if keep is not None:
            shift = shift.masked_fill(~keep[:, None, :, None], float("-inf"))  # exp(-inf) = 0
        return proj.add_(shift).exp_()  # (B, H', L, m)

    # -- the mechanism ------------------------------------------------------------------
    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        """``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)``.

        ``return_weights=True`` also returns the implied (approximate) weights
        ``(B, H, N, M)`` (materialized; for inspection at small sizes).
        """
        mode = mask_mode(self.name, q, k, v, mask, bias, return_weights, allow_weights=True)
        D = q.shape[-1]
        if self.projection is None or self.projection.shape[1] != D:
            if self.projection is not None and self.fixed:
                raise ValueError(f"features are fixed for head_dim {self.projection.shape[1]}, got head_dim {D}")
            self.redraw_features(D)
        elif self.training and not self.fixed and self.redraw_interval:
            if self._calls and self._calls % self.redraw_interval == 0:
                self.redraw_features()
        if self.training:
            self._calls += 1
        qf = self.feature_map(q, is_query=True)  # (B, H, N, m)
        kf = self.feature_map(k, is_query=False, keep=mode.keep)  # (B, Hkv, M, m)
        out = kernel_attention(qf, kf, v, causal=mode.causal, chunk_size=self.chunk_size)
        if return_weights:
            return out, kernel_weights(qf, kf, causal=mode.causal)
        return out

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for no mask, key padding or causal (no bias, features fitting the head dim); else the reason."""
        why = reason(mask_mode, self.name, q, k, v, mask, bias, return_weights, allow_weights=True)
        if why is None and self.fixed and self.projection is not None and self.projection.shape[1] != q.shape[-1]:
            why = f"features are fixed for head_dim {self.projection.shape[1]}, got head_dim {q.shape[-1]}"
        return why

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"features": 16, "seed": 0}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1, *, causal: bool = False):
        """Estimated FLOPs and peak activation bytes (float32); ``causal`` adds the chunk terms."""
        bh, n, mk, d, f = batch * heads, n_queries, n_keys, head_dim, self.features
        flops = bh * (2.0 * (n + mk) * d * f + 4.0 * (n + mk) * f + 2.0 * mk * f * d + 2.0 * n * f * (d + 1))
        mem = 4.0 * bh * (2 * (n + mk) * f + f * d + n * d)
        if causal:
            c = min(self.chunk_size, max(n, 1))
            flops += bh * 2.0 * n * c * (f + d + 1)
            mem += 4.0 * bh * (n / c * f * d + n * c)
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return (
            f"features={self.features}, kernel={self.kernel!r}, orthogonal={self.orthogonal}, "
            f"redraw_interval={self.redraw_interval}, chunk_size={self.chunk_size}, fixed={self.fixed}"
        )
