"""Nyströmformer: softmax attention through a Nyström approximation with landmarks.

Xiong, Zeng, Chakraborty, Tan, Fung, Li and Singh, 2021, "Nyströmformer: A
Nyström-Based Algorithm for Approximating Self-Attention" (AAAI 2021).

With ``l`` landmarks ``Q~, K~`` (segment means of the queries and keys) and
``s = 1 / sqrt(D)``:

    out = softmax(Q K~^T s) pinv(softmax(Q~ K~^T s)) softmax(Q~ K^T s) V

The pseudo-inverse is the paper's iterative Moore-Penrose approximation
(``Z <- Z (13 I - A Z (15 I - A Z (7 I - A Z))) / 4``, 6 iterations by default) from
the paper's start ``Z0 = A^T / (||A||_1 ||A||_inf)``, taken per matrix (the paper's
code takes one norm over the whole batch; per matrix keeps batch rows independent),
or ``torch.linalg.pinv`` with ``pinv="exact"``. ``conv_kernel`` adds the paper's
depthwise convolution of ``V`` along the sequence as a residual (self-attention only).

Segments: the ``L`` positions that take part are split into ``l`` contiguous segments,
position of rank ``r`` going to segment ``floor(r * l / L)``; when ``L`` is not a
multiple of ``l`` segments differ in length by at most one, and when ``L < l`` some
segments are empty: empty landmarks are left out (their softmax columns are masked and
their rows zero, which the pseudo-inverse carries through), so ``l >= L`` gives exact
attention (up to the pseudo-inverse).

Key padding (any mask that depends only on batch and key): masked keys are left out of
the key landmarks (segments are formed over the kept keys only) and out of the last
softmax. In self-attention (``N == M``) the key mask also marks the padded *query*
positions, which are then left out of the query landmarks. So a padded batch row
equals the row run alone (exactly when the conv residual is off or padding is at the
end). A row whose keys are all masked yields zeros. Causal and other masks, and
biases, raise ValueError (landmarks mix every position).

Complexity with ``l`` landmarks: time O(B H ((N + M) l (D + Dv) + l^3 iters)), memory
O(B H ((N + M) l + l^2)); linear in the sequence length.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries,
``M`` keys, ``D`` head dim, ``Dv`` value dim, ``l`` landmarks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism
from .linear import mask_mode, repeat_kv

__all__ = ["Nystromformer", "iterative_pinv", "segment_means"]


def segment_means(x: Tensor, landmarks: int, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Means of ``x (B, H, L, D)`` over ``landmarks`` contiguous segments of its valid positions.

    Args:
        x: ``(B, H, L, D)``.
        landmarks: number of segments ``l``.
        valid: ``(B, L)`` bool, positions taking part (default: all).

    Returns:
        ``(means (B, H, l, D), nonempty (B|1, l) bool)``; empty segments have zero means.
    """
    B, H, L, D = x.shape
    if valid is None and L % landmarks == 0:
        means = x.reshape(B, H, landmarks, L // landmarks, D).mean(dim=3)  # (B, H, l, D)
        return means, torch.ones(1, landmarks, dtype=torch.bool, device=x.device)
    if valid is None:
        valid = torch.ones(1, L, dtype=torch.bool, device=x.device)
    count = valid.sum(dim=-1, keepdim=True)  # (B', 1)
    rank = valid.cumsum(dim=-1) - 1  # (B', L)
    seg = torch.div(rank * landmarks, count.clamp(min=1), rounding_mode="floor")
    seg = torch.where(valid, seg, torch.full_like(seg, landmarks))  # invalid -> no segment
    onehot = seg[:, None, :] == torch.arange(landmarks, device=x.device)[None, :, None]  # (B', l, L)
    sizes = onehot.sum(dim=-1)  # (B', l)
    assign = onehot.to(x.dtype) / sizes.clamp(min=1)[..., None].to(x.dtype)  # (B', l, L)
    return assign[:, None] @ x, sizes > 0  # (B, H, l, D)


def iterative_pinv(a: Tensor, iterations: int = 6) -> Tensor:
    """Moore-Penrose pseudo-inverse of each ``(l, l)`` matrix in ``a (..., l, l)`` by iteration.

    The Nyströmformer paper's scheme (a cubically convergent Newton-Schulz variant)
    from ``Z0 = A^T / (max column sum * max row sum)``, per matrix.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    absa = a.abs()
    norm = absa.sum(dim=-2).amax(dim=-1) * absa.sum(dim=-1).amax(dim=-1)  # (...)
    z = a.transpose(-1, -2) / norm.clamp(min=torch.finfo(a.dtype).tiny)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _masked_softmax(s: Tensor, allowed: Tensor | None) -> Tensor:
    """Softmax over the last dim restricted to ``allowed`` (None: all); rows with none allowed are zero."""
    if allowed is None:
        return torch.softmax(s, dim=-1)
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    return torch.softmax(s, dim=-1) * allowed


@register_mechanism
class Nystromformer(Mechanism):
    """Nyström approximation of softmax attention.

    Args:
        num_landmarks: number of landmarks ``l``.
        pinv: ``"iterative"`` (the paper's) or ``"exact"`` (``torch.linalg.pinv``).
        pinv_iterations: iterations of the iterative pseudo-inverse.
        conv_kernel: ``None`` or an odd kernel length of the depthwise convolution of
            ``V`` added as a residual (the paper uses 33); needs ``heads``.
        heads: number of query heads (for the convolution's per-head filters).
    """

    name = "nystrom"
    masks_supported = "none, key padding"

    def __init__(
        self,
        num_landmarks: int = 64,
        pinv: str = "iterative",
        pinv_iterations: int = 6,
        conv_kernel: int | None = None,
        heads: int | None = None,
    ):
        super().__init__()
        positive_int(num_landmarks, "num_landmarks")
        if pinv not in ("iterative", "exact"):
            raise ValueError(f"pinv must be 'iterative' or 'exact', got {pinv!r}")
        positive_int(pinv_iterations, "pinv_iterations")
        self.num_landmarks, self.pinv, self.pinv_iterations = num_landmarks, pinv, pinv_iterations
        self.conv_kernel, self.heads = conv_kernel, heads
        self.conv = None
        if conv_kernel is not None:
            if not isinstance(conv_kernel, int) or conv_kernel < 1 or conv_kernel % 2 == 0:
                raise ValueError(f"conv_kernel must be None or an odd positive int, got {conv_kernel!r}")
            if not isinstance(heads, int) or heads < 1:
                raise ValueError(f"conv_kernel needs heads (the number of query heads), got heads={heads!r}")
            self.conv = nn.Parameter(torch.randn(heads, 1, conv_kernel, 1) / math.sqrt(conv_kernel))

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        """``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)``.

        ``return_weights=True`` also returns the implied (approximate) weights
        ``(B, H, N, M)`` (materialized; without the conv residual).
        """
        mode = mask_mode(self.name, q, k, v, mask, bias, return_weights, allow_causal=False, allow_weights=True)
        B, H, N, D = q.shape
        M = k.shape[2]
        l = self.num_landmarks
        k = repeat_kv(k, H // k.shape[1])  # (B, H, M, D)
        v = repeat_kv(v, H // v.shape[1])  # (B, H, M, Dv)
        keep = mode.keep  # (B, M) or None
        q_valid = keep if (keep is not None and N == M) else None
        if keep is not None:
            v = v * keep[:, None, :, None].to(v.dtype)
        q_lm, q_ok = segment_means(q, l, q_valid)  # (B, H, l, D), (B|1, l)
        k_lm, k_ok = segment_means(k, l, keep)  # (B, H, l, D), (B|1, l)
        q_ok, k_ok = q_ok[:, None, :, None], k_ok[:, None, None, :]  # (B|1, 1, l, 1), (B|1, 1, 1, l)
        if keep is None and l <= min(N, M):  # every segment holds a position: nothing to mask
            q_ok = k_ok = None
        scale = D**-0.5
        q_lm = q_lm * scale  # scale the small landmark tensors, not the (N, l) scores
        k_lm_s = k_lm * scale  # (B, H, l, D)

        kernel1 = _masked_softmax(q @ k_lm_s.transpose(-1, -2), k_ok)  # (B, H, N, l)
        kernel2 = _masked_softmax(q_lm @ k_lm.transpose(-1, -2), k_ok)  # (B, H, l, l)
        allowed3 = q_ok
        if q_ok is not None:
            kernel2 = kernel2 * q_ok  # empty query landmarks: zero rows
            if keep is not None:
                allowed3 = q_ok & keep[:, None, None, :]  # (B|1, 1, l, M)
        kernel3 = _masked_softmax(q_lm @ k.transpose(-1, -2), allowed3)  # (B, H, l, M)
        k2 = kernel2.float() if kernel2.dtype in (torch.float16, torch.bfloat16) else kernel2  # pinv in >= fp32
        if self.pinv == "exact":
            z = torch.linalg.pinv(k2).to(kernel2.dtype)  # (B, H, l, l)
        else:
            z = iterative_pinv(k2, self.pinv_iterations).to(kernel2.dtype)  # (B, H, l, l)
        out = kernel1 @ (z @ (kernel3 @ v))  # (B, H, N, Dv)

        if self.conv is not None:
            if N != M:
                raise ValueError(f"conv_kernel needs self-attention (N == M), got N={N}, M={M}")
            if self.conv.shape[0] != H:
                raise ValueError(f"Nystromformer was built with heads={self.heads}, but q has {H} heads")
            pad = self.conv_kernel // 2
            out = out + F.conv2d(v, self.conv.to(v.dtype), padding=(pad, 0), groups=H)  # (B, H, N, Dv)
        if return_weights:
            return out, kernel1 @ z @ kernel3
        return out

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for no mask or key padding (no bias; the conv residual needs N == M); else the reason."""
        why = reason(mask_mode, self.name, q, k, v, mask, bias, return_weights, allow_causal=False,
                     allow_weights=True)
        if why is None and self.conv is not None:
            if q.shape[2] != k.shape[2]:
                why = f"conv_kernel needs self-attention (N == M), got N={q.shape[2]}, M={k.shape[2]}"
            elif self.conv.shape[0] != q.shape[1]:
                why = f"Nystromformer was built with heads={self.heads}, but q has {q.shape[1]} heads"
        return why

    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        """A landmark per position with the exact pseudo-inverse: ``S S^+ S = S``, exact attention."""
        return {"num_landmarks": n, "pinv": "exact"}

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"num_landmarks": max(1, n // 4)}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        bh, n, m, d, l = batch * heads, n_queries, n_keys, head_dim, self.num_landmarks
        it = 1 if self.pinv == "exact" else self.pinv_iterations
        flops = bh * (
            (n + m) * d  # landmarks
            + 2.0 * n * l * d + 2.0 * l * l * d + 2.0 * l * m * d  # the three score products
            + 5.0 * (n * l + l * l + l * m)  # softmaxes
            + it * 8.0 * l**3  # pseudo-inverse
            + 2.0 * l * m * d + 2.0 * l * l * d + 2.0 * n * l * d  # products with V
        )
        mem = 4.0 * bh * (2 * (n * l + l * m) + 6 * l * l + 2 * l * d + n * d)
        if self.conv is not None:
            flops += bh * 2.0 * n * d * self.conv_kernel
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return (
            f"num_landmarks={self.num_landmarks}, pinv={self.pinv!r}, pinv_iterations={self.pinv_iterations}, "
            f"conv_kernel={self.conv_kernel}"
        )
