"""The ``sdpa`` backend: ``torch.nn.functional.scaled_dot_product_attention``.

PyTorch's fused kernels (flash / memory-efficient / math, chosen by PyTorch). The
mask is translated by the mask itself: no mask or a causal mask with N == M becomes
``is_causal``; other masks become a boolean ``attn_mask``, compact where the mask
allows (a key padding mask is ``(B, 1, 1, M)``). Rows whose keys are all masked are
given one harmless key and zeroed afterwards, so they return zeros (and zero
gradients) as on every attnlab backend. It computes the function of the ``math``
backend; dropout draws from PyTorch's own random stream, not attnlab's counter-based
one. Time O(B H N M D); memory O(B H N D) on the fused paths, O(B H N M) when a dense
mask or bias has to be materialized or PyTorch falls back to its math path.
"""

from __future__ import annotations

import torch.nn.functional as F  # noqa: N812

from .call import AttentionCall
from .registry import Backend, register

_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5
#: most elements of a bias/mask SDPA may materialize before it declines
MAX_DENSE_ELEMENTS = 1 << 28


def _dense_elements(call: AttentionCall) -> int:
    """Elements of the mask/bias tensor this call would hand to SDPA."""
    n = 0
    if call.has_bias():
        n = call.B * call.H * call.N * call.M if call.bias_fn is not None else call.bias.numel()
    if call.mask is not None and not call.mask.is_causal(call.N, call.M):
        dims = call.mask.depends
        n = max(n, (call.B if "b" in dims else 1) * (call.H if "h" in dims else 1)
                * (call.N if "q" in dims else 1) * (call.M if "k" in dims else 1))
    return n


class SdpaBackend(Backend):
    name = "sdpa"
    summary = "torch scaled_dot_product_attention (fused kernels)"

    def supports(self, call: AttentionCall) -> str | None:
        if call.return_weights:
            return "does not return the weights (return_weights=True needs 'math')"
        n = _dense_elements(call)
        if n > MAX_DENSE_ELEMENTS:
            return f"mask/bias needs materialization of {n:,} elements (limit {MAX_DENSE_ELEMENTS:,})"
        return None

    def estimate(self, call: AttentionCall) -> float:
        work = call.flops()
        if call.mask is not None and call.mask.is_causal(call.N, call.M) and not call.has_bias():
            work *= 0.55  # SDPA skips the upper triangle itself
        elif call.has_bias() or (call.mask is not None and "q" in call.mask.depends):
            # reads an N x M mask/bias and computes every tile (measured ~0.75x its no-mask speed)
            work = work / 0.75 + 8.0 * _dense_elements(call)
        elif call.mask is not None:
            work = work / 0.95  # a compact key mask (B, 1, 1, M) costs SDPA almost nothing
        if call.dropout_p > 0 and call.device.type == "cpu":
            work = call.flops() / 0.25 + 40.0 * call.B * call.H * call.N * call.M  # CPU falls back to math
        return work

    def forward(self, call: AttentionCall):
        q, k, v = call.q, call.k, call.v
        kwargs = {}
        if call.G > 1:
            if _HAS_GQA:
                kwargs["enable_gqa"] = True
            else:
                k = k.repeat_interleave(call.G, dim=1)  # (B, H, M, D)
                v = v.repeat_interleave(call.G, dim=1)  # (B, H, M, Dv)
        mask, is_causal, row_any = None, False, None
        if call.mask is not None:
            if call.mask.is_causal(call.N, call.M) and not call.has_bias():
                is_causal = True
            else:
                mask = call.dense_mask()  # (B'|1, H'|1, N|1, M|1) bool
                row_any = mask.any(-1, keepdim=True)  # (B'|1, H'|1, N|1, 1)
                if bool(row_any.all()):
                    row_any = None
                else:
                    mask = mask | ~row_any  # give empty rows every key; zeroed below
        bias = call.dense_bias(call.dtype)
        if bias is not None:
            attn = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            if row_any is None:
                # a -inf bias can empty a row as well
                row_any = attn.amax(-1, keepdim=True) > float("-inf")
                if bool(row_any.all()):
                    row_any = None
                else:
                    attn = attn.masked_fill(~row_any, 0.0)
        else:
            attn = mask
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn, dropout_p=call.dropout_p, is_causal=is_causal, scale=call.scale, **kwargs
        )  # (B, H, N, Dv)
        if row_any is not None:
            out = out * row_any.to(out.dtype)
        return out, None


register(SdpaBackend())
