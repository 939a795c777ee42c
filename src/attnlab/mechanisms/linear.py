"""Linear attention: kernelized attention with the feature map ``phi(x) = elu(x) + 1``.

Katharopoulos, Vyas, Pappas and Fleuret, 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention".

Softmax ``exp(q . k)`` is replaced by the kernel ``phi(q) . phi(k)``, so that

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / phi(q_i)^T (sum_j phi(k_j))

where the sums run over the keys query ``i`` may see. Computing ``phi(K)^T V`` first
makes the cost linear in the sequence length.

Complexity, with ``m`` features (``m = D`` here): time O(B H (N + M) m Dv) non-causal;
causal adds O(B H N C (m + Dv)) for the within-chunk products (chunk size ``C``).
Memory O(B H (N + M) m) for the features plus O(B H m Dv) non-causal or
O(B H (N / C) m Dv + B H N C) causal: the causal prefix sums are kept once per chunk,
never as ``(N, m, Dv)``.

Masks: none, key padding (any mask that depends only on batch and key, e.g.
``padding(lengths)``, ``key_mask(keep)``), and ``causal()`` (also with ``N != M``,
bottom-right aligned as everywhere in attnlab). Other masks, causal combined with
padding, and additive biases raise ValueError.

This module also holds the kernelized-attention core shared with
:mod:`attnlab.mechanisms.performer` (:func:`kernel_attention`, :func:`kernel_weights`)
and the mask classification used by the other approximations (:func:`mask_mode`).

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads (``G = H / Hkv``
query heads share one), ``N`` queries, ``M`` keys, ``D`` head dim, ``Dv`` value dim,
``m`` feature count, ``C`` chunk size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from ..exact.call import make_call
from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism

__all__ = ["LinearAttention", "MaskMode", "kernel_attention", "kernel_weights", "mask_mode", "repeat_kv"]


@dataclass(frozen=True)
class MaskMode:
    """What a mask asks of a mechanism that cannot take arbitrary masks.

    Attributes:
        causal: the mask is ``causal()`` (bottom-right aligned).
        keep: ``(B, M)`` bool, True for keys that may be attended (key padding), or None.
    """

    causal: bool = False
    keep: Tensor | None = None


def mask_mode(
    mechanism: str, q: Tensor, k: Tensor, v: Tensor, mask, bias, return_weights: bool = False,
    *, allow_causal: bool = True, allow_weights: bool = False,
) -> MaskMode:
    """Validate a mechanism call and classify its mask by behaviour.

    Key padding is recognized as any mask depending only on batch and key
    (``mask.depends <= {"b", "k"}``) or a bool tensor ``(B|1, 1, 1, M)``, causal as ``mask.is_causal`` (for ``N != M``, a
    position mask that is causal on the square ``M x M`` grid, which by attnlab's
    bottom-right alignment is causal on ``N x M``).

    Raises:
        ValueError: for a bias, ``return_weights`` where ``allow_weights`` is False,
            malformed shapes (via :func:`attnlab.exact.call.make_call`), a causal
            mask where ``allow_causal`` is False, or any other mask, naming
            ``mechanism``.
    """
    if bias is not None:
        raise ValueError(f"{mechanism} does not take an additive bias (got bias); use mechanism 'exact'")
    if return_weights and not allow_weights:
        raise ValueError(
            f"{mechanism} has no (B, H, N, M) attention weights to return; use mechanism 'exact' "
            "for return_weights=True"
        )
    call = make_call(q, k, v, mask=mask)  # validates shapes, dtypes, GQA head counts, mask sizes
    m = call.mask
    if m is None:
        return MaskMode()
    B, N, M = call.B, call.N, call.M
    if isinstance(mask, Tensor) and mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        # a bool tensor (B|1, 1, 1, M) is a key mask (masks.dense() reports it as query-dependent)
        return MaskMode(keep=mask.to(q.device).expand(B, 1, 1, M).reshape(B, M))  # (B, M)
    if m.depends <= {"b", "k"}:
        keep = m.dense(N, M, device=q.device, batch=B)  # (B' , 1, 1, M)
        try:
            keep = keep.expand(B, 1, 1, M).reshape(B, M)  # (B, M)
        except RuntimeError as e:
            raise ValueError(f"{mechanism}: key mask of shape {tuple(keep.shape)} does not fit batch {B}") from e
        return MaskMode(keep=keep)
    is_causal = m.is_causal(N, M) or (N != M and m.depends <= {"q", "k"} and m.is_causal(M, M))
    if is_causal:
        if not allow_causal:
            raise ValueError(f"{mechanism} cannot apply a causal mask (got {m!r}); supported: key padding only")
        return MaskMode(causal=True)
    what = "causal() or key padding" if allow_causal else "key padding"
    raise ValueError(
        f"{mechanism} supports only {what} masks (a mask depending on batch and key only), got {m!r}"
    )


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """``(B, Hkv, M, D) -> (B, Hkv * groups, M, D)``: query head ``h`` reads kv head ``h // groups``."""
    if groups == 1:
        return x
    B, Hkv, M, D = x.shape
    return x[:, :, None].expand(B, Hkv, groups, M, D).reshape(B, Hkv * groups, M, D)  # (B, H, M, D)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` with 0 where ``den == 0`` (rows that see no key have ``num == 0``)."""
    return num / torch.where(den == 0, torch.ones_like(den), den)


def kernel_attention(qf: Tensor, kf: Tensor, v: Tensor, causal: bool = False, chunk_size: int = 128) -> Tensor:
    """Normalized kernel attention ``phi(Q) phi(K)^T V / phi(Q) phi(K)^T 1``, in O(N) memory.

    Args:
        qf: query features ``(B, H, N, m)``, non-negative.
        kf: key features ``(B, Hkv, M, m)``, non-negative; zero rows for masked keys.
        v: values ``(B, Hkv, M, Dv)``.
        causal: query ``i`` sees keys ``0 .. i + M - N`` (bottom-right alignment).
        chunk_size: chunk length of the causal prefix sums.

    Returns:
        ``(B, H, N, Dv)``; rows whose kernel sum is zero (no visible key) are zeros.

    Non-causal: ``phi(K)^T V`` (B, Hkv, m, Dv) first, then one product per query.
    Causal: queries and keys are cut into chunks of ``C``; within a chunk a masked
    ``(C, C)`` product, across chunks an exclusive prefix sum of the per-chunk
    ``phi(K_c)^T V_c`` states, ``(N / C, m, Dv)`` per head.
    """
    B, H, N, m = qf.shape
    Hkv, M, Dv = kf.shape[1], kf.shape[2], v.shape[-1]
    G = H // Hkv
    # a column of ones appended to V makes every product carry the denominator along
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # (B, Hkv, M, Dv+1)
    if not causal:
        # phi(K)^T [V, 1], computed transposed so that the gradient of kf comes out contiguous
        kv = (v1.transpose(-1, -2) @ kf).transpose(-1, -2)  # (B, Hkv, m, Dv+1)
        qg = qf.reshape(B, Hkv, G * N, m)  # (B, Hkv, G*N, m)
        out = qg @ kv  # (B, Hkv, G*N, Dv+1)
        return _safe_div(out[..., :Dv], out[..., Dv:]).reshape(B, H, N, Dv)  # (B, H, N, Dv)

    off = M - N
    s0 = None
    if off > 0:  # the first M - N keys are seen by every query: an initial state
        s0 = kf[:, :, :off].transpose(-1, -2) @ v1[:, :, :off]  # (B, Hkv, m, Dv+1)
        kf, v1 = kf[:, :, off:], v1[:, :, off:]
    dead = 0
    if off < 0:  # the first N - M queries see no key
        dead = -off
        qf = qf[:, :, dead:]
    L = qf.shape[2]
    C = max(1, min(chunk_size, L))
    nc = -(-L // C)
    pad = nc * C - L
    if pad:
        qf = F.pad(qf, (0, 0, 0, pad))  # (B, H, nc*C, m)
        kf = F.pad(kf, (0, 0, 0, pad))  # (B, Hkv, nc*C, m)
        v1 = F.pad(v1, (0, 0, 0, pad))  # (B, Hkv, nc*C, Dv+1)
    qc = qf.reshape(B, Hkv, G, nc, C, m)  # (B, Hkv, G, nc, C, m)
    kc = kf.reshape(B, Hkv, 1, nc, C, m)  # (B, Hkv, 1, nc, C, m)
    vc = v1.reshape(B, Hkv, 1, nc, C, Dv + 1)  # (B, Hkv, 1, nc, C, Dv+1)

    # across chunks: exclusive prefix sums of the per-chunk states phi(K_c)^T [V_c, 1]
    chunk_kv = kc.transpose(-1, -2) @ vc  # (B, Hkv, 1, nc, m, Dv+1)
    acc = torch.float32 if chunk_kv.dtype in (torch.float16, torch.bfloat16) else chunk_kv.dtype
    state = torch.cumsum(chunk_kv[:, :, :, :-1], dim=3, dtype=acc).to(chunk_kv.dtype)  # (B, Hkv, 1, nc-1, m, Dv+1)
    state = torch.cat([torch.zeros_like(chunk_kv[:, :, :, :1]), state], dim=3)  # (B, Hkv, 1, nc, m, Dv+1)
    if s0 is not None:
        state = state + s0[:, :, None, None]
    out = qc @ state  # (B, Hkv, G, nc, C, Dv+1)

    # within a chunk: masked (C, C) products
    tri = torch.ones(C, C, dtype=torch.bool, device=qf.device).tril()
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~tri, 0.0)  # (B, Hkv, G, nc, C, C)
    out = out + scores @ vc  # (B, Hkv, G, nc, C, Dv+1)
    out = _safe_div(out[..., :Dv], out[..., Dv:]).reshape(B, H, nc * C, Dv)[:, :, :L]  # (B, H, L, Dv)
    if dead:
        out = F.pad(out, (0, 0, dead, 0))  # (B, H, N, Dv)
    return out


def kernel_weights(qf: Tensor, kf: Tensor, causal: bool = False) -> Tensor:
    """The implied attention weights ``(B, H, N, M)`` (materialized: O(N M) memory).

    Row ``i`` is ``phi(q_i) . phi(k_j)`` normalized over the keys ``i`` may see; a row
    that sees no key is zero. ``kernel_attention(...) == kernel_weights(...) @ V``.
    """
    H, Hkv = qf.shape[1], kf.shape[1]
    N, M = qf.shape[2], kf.shape[2]
    a = qf @ repeat_kv(kf, H // Hkv).transpose(-1, -2)  # (B, H, N, M)
    if causal:
        a = a * torch.ones(N, M, dtype=torch.bool, device=qf.device).tril(M - N)
    return _safe_div(a, a.sum(dim=-1, keepdim=True))


def elu_feature_map(x: Tensor) -> Tensor:
    """``phi(x) = elu(x) + 1``, positive everywhere."""
    return F.elu(x) + 1.0


@register_mechanism
class LinearAttention(Mechanism):
    """Linear (kernelized) attention with ``phi(x) = elu(x) + 1``; no parameters.

    Args:
        chunk_size: chunk length ``C`` of the causal prefix sums (memory
            ``O(N/C * D * Dv + N * C)`` per head; larger chunks do more work per chunk).
    """

    name = "linear"
    masks_supported = "none, key padding, causal (not combined with padding)"

    def __init__(self, chunk_size: int = 128):
        super().__init__()
        positive_int(chunk_size, "chunk_size")
        self.chunk_size = chunk_size

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        """``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)``.

        ``return_weights=True`` also returns the implied weights ``(B, H, N, M)``
        (materialized; for inspection at small sizes).
        """
        mode = mask_mode(self.name, q, k, v, mask, bias, return_weights, allow_weights=True)
        qf = elu_feature_map(q)  # (B, H, N, D)
        kf = elu_feature_map(k)  # (B, Hkv, M, D)
        if mode.keep is not None:
            kf = kf * mode.keep[:, None, :, None].to(kf.dtype)  # masked keys carry no weight
        out = kernel_attention(qf, kf, v, causal=mode.causal, chunk_size=self.chunk_size)
        if return_weights:
            return out, kernel_weights(qf, kf, causal=mode.causal)
        return out

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for no mask, key padding or causal (no bias); else the reason."""
        return reason(mask_mode, self.name, q, k, v, mask, bias, return_weights, allow_weights=True)

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1, *, causal: bool = False):
        """Estimated FLOPs and peak activation bytes (float32); ``causal`` adds the chunk terms."""
        bh, n, m, d = batch * heads, n_queries, n_keys, head_dim
        flops = bh * (2.0 * m * d * d + 2.0 * n * d * (d + 1) + 4.0 * (n + m) * d)
        mem = 4.0 * bh * ((n + m) * d + d * d + n * d)
        if causal:
            c = min(self.chunk_size, max(n, 1))
            flops += bh * 2.0 * n * c * (2 * d + 1)
            mem += 4.0 * bh * (n / c * d * d + n * c)
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}"
