"""The ``reference`` backend: the tutorials' formula in NumPy float64, the oracle.

``softmax(Q K^T * scale + bias) V`` computed on the CPU in float64, no autograd.
Every other backend is tested against it. Rows with no allowed key give zeros.
Memory O(B H N M).
"""

from __future__ import annotations

import numpy as np
import torch

from .call import AttentionCall, dropout_keep, index_grid
from .registry import Backend, register_backend


@register_backend
class ReferenceBackend(Backend):
    """The ``reference`` backend: NumPy in float64, the oracle every other backend is tested against (no autograd)."""

    name = "reference"
    summary = "NumPy float64 oracle (no autograd)"
    in_auto = False

    def supports(self, call: AttentionCall) -> str | None:
        if call.needs_grad:
            return "the NumPy reference has no autograd (inputs require grad)"
        return None

    def estimate(self, call: AttentionCall) -> float:
        return float("inf")

    def forward(self, call: AttentionCall):
        q = call.q.detach().cpu().double().numpy()
        k = call.k.detach().cpu().double().numpy()
        v = call.v.detach().cpu().double().numpy()
        g = call.G
        k = np.repeat(k, g, axis=1)  # (B, H, M, D)
        v = np.repeat(v, g, axis=1)  # (B, H, M, Dv)
        scores = np.matmul(q, k.swapaxes(-1, -2)) * call.scale  # (B, H, N, M); NumPy's BLAS per (b, h)
        bias = call.dense_bias()
        if bias is not None:
            scores = scores + bias.detach().cpu().double().numpy()
        allowed = np.ones(scores.shape, dtype=bool)
        m = call.dense_mask()
        if m is not None:
            allowed = np.broadcast_to(m.cpu().numpy(), scores.shape)
        allowed = allowed & ~np.isneginf(scores)
        row_any = allowed.any(-1, keepdims=True)
        s = np.where(allowed, scores, -np.inf)
        s = s - np.where(row_any, s.max(-1, keepdims=True), 0.0)
        e = np.where(allowed, np.exp(s), 0.0)
        denom = e.sum(-1, keepdims=True)
        w = np.where(row_any, e / np.where(row_any, denom, 1.0), 0.0)  # (B, H, N, M)
        wd = w
        if call.dropout_p > 0:
            keep = dropout_keep(call.dropout_seed, *index_grid(call.B, call.H, 0, call.N, 0, call.M, "cpu"), call.dropout_p)
            wd = w * keep.numpy() / (1.0 - call.dropout_p)
        out = np.matmul(wd, v)  # (B, H, N, Dv)
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(call.device, call.dtype)  # noqa: E731
        return to(out), (to(w) if call.return_weights else None)
