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

Which kernel runs on CUDA. PyTorch picks among flash, memory-efficient, cuDNN and
math by its own checks; :func:`cuda_kernel` asks those checks (the ones its dispatch
runs, honouring ``torch.nn.attention.sdpa_kernel``) and every CUDA call records the
answer in ``SdpaBackend.last_kernel``. To pin a kernel, call attnlab inside
``with torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):``; PyTorch then
raises instead of falling back. Grouped-query heads with a mask, a bias or float32
can leave ``enable_gqa`` without a fused kernel (flash takes no mask and no float32,
and the memory-efficient kernel's checks refuse ``enable_gqa``), so when PyTorch's
checks say ``enable_gqa`` would land on the math kernel the forward repeats k/v
instead (O(B H M D) more memory rather than the math kernel's O(B H N M)).
Empty-row handling reads ``row_any.all()`` on the CPU only: on CUDA it always takes
the general path (identical numbers) rather than wait for the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from .call import AttentionCall
from .registry import Backend, register_backend

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


def _all_true(t: Tensor) -> bool:
    """``t.all()`` where reading it costs nothing (CPU); False on a device, whose general path gives the same numbers."""
    return t.device.type == "cpu" and bool(t.all())


def _kernel_checks() -> dict[int, tuple[str, object, object]]:
    """SDPBackend value -> (name, is it enabled, can it serve params), for the kernels PyTorch dispatches to."""
    from torch.nn.attention import SDPBackend

    cuda = torch.backends.cuda
    checks = {
        int(SDPBackend.FLASH_ATTENTION): ("flash", cuda.flash_sdp_enabled, cuda.can_use_flash_attention),
        int(SDPBackend.EFFICIENT_ATTENTION): ("efficient", cuda.mem_efficient_sdp_enabled, cuda.can_use_efficient_attention),
        int(SDPBackend.MATH): ("math", cuda.math_sdp_enabled, lambda params, debug=False: True),
    }
    if hasattr(SDPBackend, "CUDNN_ATTENTION") and hasattr(cuda, "can_use_cudnn_attention"):
        checks[int(SDPBackend.CUDNN_ATTENTION)] = ("cudnn", cuda.cudnn_sdp_enabled, cuda.can_use_cudnn_attention)
    return checks


def cuda_kernel(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                is_causal: bool = False, enable_gqa: bool = False) -> str:
    """The kernel PyTorch's SDPA takes for these CUDA arguments: ``flash``, ``efficient``, ``cudnn`` or ``math``.

    Runs PyTorch's own eligibility checks in its priority order, with the kernels the
    current ``sdpa_kernel`` context enables; ``none`` when no enabled kernel serves,
    ``unknown`` when this torch cannot answer.
    """
    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
        order = torch._C._get_sdp_priority_order() if hasattr(torch._C, "_get_sdp_priority_order") else [1, 2, 0]
    except (TypeError, RuntimeError, AttributeError):  # torch < 2.5 has no enable_gqa in SDPAParams
        return "unknown"
    checks = _kernel_checks()
    for value in order:
        if int(value) in checks:
            name, enabled, can_use = checks[int(value)]
            if enabled() and can_use(params, False):
                return name
    return "none"


def cuda_note(call: AttentionCall) -> str | None:
    """What ``explain`` says about SDPA's kernel on CUDA: when no fused kernel fits as is."""
    if call.device.type != "cuda":
        return None
    notes = []
    dense = call.has_bias() or (call.mask is not None and not call.mask.is_causal(call.N, call.M))
    if call.dtype == torch.float32:
        notes.append("float32 has no flash kernel: SDPA takes its memory-efficient kernel, or its math kernel "
                     "(O(N·M) memory) where that cannot serve")
    if call.G > 1 and (dense or call.dtype == torch.float32):
        notes.append("grouped-query heads with a mask, bias or float32 would fall back to SDPA's math kernel; "
                     "attnlab repeats k/v (O(B·H·M·D) memory) so a fused kernel serves")
    if call.D % 8 or call.Dv % 8:
        notes.append(f"head dims D={call.D}, Dv={call.Dv} not a multiple of 8 may fall back to the math kernel "
                     "(O(N·M) memory)")
    return "; ".join(notes) or None


@register_backend
class SdpaBackend(Backend):
    """The ``sdpa`` backend: ``torch.nn.functional.scaled_dot_product_attention`` (see the module docstring)."""

    name = "sdpa"
    summary = "torch scaled_dot_product_attention (fused kernels)"
    #: the kernel of the latest CUDA call (see :func:`cuda_kernel`); None before one
    last_kernel: str | None = None

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

    def note(self, call: AttentionCall) -> str | None:
        return cuda_note(call)

    def forward(self, call: AttentionCall):
        attn, is_causal, row_any = self._attn_mask(call)
        q, k, v = call.q, call.k, call.v
        gqa = call.G > 1 and _HAS_GQA
        kernel = None
        if call.device.type == "cuda":
            kernel = cuda_kernel(q, k, v, attn, call.dropout_p, is_causal, gqa)
            if gqa and kernel in ("math", "none"):  # no fused kernel takes enable_gqa with this mask/dtype
                gqa = False
        if call.G > 1 and not gqa:
            k = k.repeat_interleave(call.G, dim=1)  # (B, H, M, D)
            v = v.repeat_interleave(call.G, dim=1)  # (B, H, M, Dv)
            if kernel is not None:
                kernel = cuda_kernel(q, k, v, attn, call.dropout_p, is_causal, False)
        if kernel is not None:
            self.last_kernel = kernel
        kwargs = {"enable_gqa": True} if gqa else {}
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn, dropout_p=call.dropout_p, is_causal=is_causal, scale=call.scale, **kwargs
        )  # (B, H, N, Dv)
        if row_any is not None:
            out = out * row_any.to(out.dtype)
        return out, None

    def _attn_mask(self, call: AttentionCall) -> tuple[Tensor | None, bool, Tensor | None]:
        """``(attn_mask, is_causal, row_any)``: SDPA's mask/bias and the rows to zero afterwards (None: none)."""
        mask, is_causal, row_any = None, False, None
        if call.mask is not None:
            if call.mask.is_causal(call.N, call.M) and not call.has_bias():
                is_causal = True
            else:
                mask = call.dense_mask()  # (B'|1, H'|1, N|1, M|1) bool
                row_any = mask.any(-1, keepdim=True)  # (B'|1, H'|1, N|1, 1)
                if _all_true(row_any):
                    row_any = None
                else:
                    mask = mask | ~row_any  # give empty rows every key; zeroed below
        bias = call.dense_bias(call.dtype)
        if bias is not None:
            attn = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            if row_any is None:
                # a -inf bias can empty a row as well
                row_any = attn.amax(-1, keepdim=True) > float("-inf")
                if _all_true(row_any):
                    row_any = None
                else:
                    attn = attn.masked_fill(~row_any, 0.0)
        else:
            attn = mask
        return attn, is_causal, row_any
