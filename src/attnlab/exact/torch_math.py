"""The ``math`` backend: the formula in plain torch, the readable picture.

``weights = softmax(q k^T * scale + bias, masked)``, ``out = dropout(weights) v``.
It serves every call and is the only torch backend that returns the weights; every
faster backend computes this same function. Scores are kept in float32 (float64 for
float64 inputs). Time O(B H N M D), memory O(B H N M): it materializes the full
score matrix, so it is the slow, memory-hungry baseline at long lengths.
"""

from __future__ import annotations

import torch

from .call import AttentionCall, dropout_scale_tile
from .registry import Backend, register_backend


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype scores and softmax statistics are kept in."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@register_backend
class MathBackend(Backend):
    """The ``math`` backend: the formula in plain torch, the readable picture every other backend is checked against."""

    name = "math"
    summary = "plain torch, materializes N x M, returns weights"

    def supports(self, call: AttentionCall) -> str | None:
        return None

    def estimate(self, call: AttentionCall) -> float:
        # about a quarter of SDPA's throughput on CPU, plus the N x M traffic
        return call.flops() / 0.25 + 40.0 * call.B * call.H * call.N * call.M

    def forward(self, call: AttentionCall):
        B, H, N, M, G = call.B, call.H, call.N, call.M, call.G
        ad = acc_dtype(call.dtype)
        q = call.q.reshape(B, call.Hkv, G, N, call.D)  # (B, Hkv, G, N, D)
        k = call.k.unsqueeze(2)  # (B, Hkv, 1, M, D)
        v = call.v.unsqueeze(2)  # (B, Hkv, 1, M, Dv)
        scores = torch.matmul(q, k.transpose(-1, -2)).to(ad) * call.scale  # (B, Hkv, G, N, M)
        scores = scores.reshape(B, H, N, M)  # (B, H, N, M)
        bias = call.dense_bias(ad)
        if bias is not None:
            scores = scores + bias
        allowed = call.dense_mask()
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        # (B, H, N, 1): rows that see a key; a row whose maximum is NaN (it saw a NaN score) stays NaN
        row_any = scores.amax(-1, keepdim=True) != float("-inf")
        scores = scores.masked_fill(~row_any, 0.0)
        weights = torch.softmax(scores, dim=-1) * row_any  # (B, H, N, M); empty rows -> 0
        mixed = weights
        if call.dropout_p > 0:
            mixed = weights * dropout_scale_tile(call, 0, N, 0, M, ad)
        out = torch.matmul(mixed.to(call.dtype).reshape(B, call.Hkv, G, N, M), v)  # (B, Hkv, G, N, Dv)
        out = out.reshape(B, H, N, call.Dv)  # (B, H, N, Dv)
        return out, (weights.to(call.dtype) if call.return_weights else None)
