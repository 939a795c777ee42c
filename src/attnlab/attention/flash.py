"""The ``flash`` backend: the ``flash-attn`` package (Dao et al.) on CUDA.

Served when ``flash_attn`` is installed, the tensors are float16/bfloat16 on a CUDA
device, head dims are at most 256 and the mask is none, causal or a sliding window
(flash-attn aligns its causal mask bottom-right, as attnlab does). No bias, no
weights. Dropout uses flash-attn's own random stream. Time O(B H N M D), memory
O(B H N D). Computes the function of the ``math`` backend.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from .call import AttentionCall
from .registry import Backend, register

INSTALL_HINT = "pip install flash-attn --no-build-isolation"


class FlashBackend(Backend):
    name = "flash"
    summary = "flash-attn package on CUDA (fp16/bf16)"

    def available(self) -> str | None:
        if importlib.util.find_spec("flash_attn") is None:
            return f"flash-attn is not installed ({INSTALL_HINT})"
        if not torch.cuda.is_available():
            return "flash-attn needs a CUDA device and none is available"
        return None

    def supports(self, call: AttentionCall) -> str | None:
        if call.device.type != "cuda":
            return f"flash-attn runs on cuda, tensors are on {call.device}"
        if call.dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn takes float16/bfloat16, got {call.dtype}"
        if max(call.D, call.Dv) > 256 or call.D != call.Dv:
            return f"flash-attn needs equal head dims <= 256, got D={call.D}, Dv={call.Dv}"
        if call.return_weights:
            return "does not return the weights (return_weights=True needs 'math')"
        if call.has_bias():
            return "flash-attn takes no additive bias"
        if call.mask is not None and call.mask.band() is None:
            return f"flash-attn serves no mask, causal or sliding_window, not {call.mask!r}"
        if call.mask is not None and call.mask.has_empty_rows(call.N, call.M):
            return "mask leaves query rows with no key (flash-attn would not return zeros)"
        return None

    def estimate(self, call: AttentionCall) -> float:
        frac = 1.0
        band = call.mask.band() if call.mask is not None else None
        if band is not None:
            left, right = band
            frac = 0.55 if left is None else min(1.0, (left + right + 256) / call.M)
        return call.flops() * frac / 2.0

    def forward(self, call: AttentionCall):
        fa = importlib.import_module("flash_attn")
        window = (-1, -1)
        causal = False
        band = call.mask.band() if call.mask is not None else None
        if band is not None and band[0] is None:  # causal(): flash-attn's causal is bottom-right aligned too
            causal = True
        elif band is not None:
            window = band
        q = call.q.transpose(1, 2)  # (B, N, H, D)
        k = call.k.transpose(1, 2)  # (B, M, Hkv, D)
        v = call.v.transpose(1, 2)  # (B, M, Hkv, Dv)
        out = fa.flash_attn_func(
            q, k, v, dropout_p=call.dropout_p, softmax_scale=call.scale, causal=causal, window_size=window
        )  # (B, N, H, Dv)
        return out.transpose(1, 2), None


register(FlashBackend())
