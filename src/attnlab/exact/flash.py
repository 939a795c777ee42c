"""The ``flash`` backend: the ``flash-attn`` package (Dao et al.) on CUDA.

Served when ``flash_attn`` (2.3 or newer: sliding windows and bottom-right causal
alignment) imports, the tensors are float16/bfloat16 on a CUDA device of compute
capability 8.0 or higher (Ampere and later; flash-attn 2 has no kernels for older
GPUs), head dims are equal and at most 256 and the mask is none, causal or a sliding
window (flash-attn aligns its causal mask bottom-right, as attnlab does). No bias, no
weights. Dropout uses flash-attn's own random stream. Time O(B H N M D), memory
O(B H N D). Computes the function of the ``math`` backend.

The package is imported once per process and the outcome cached: a wheel built for
another torch or CUDA fails at import (undefined symbols), and that failure becomes
the backend's reason instead of an exception in the caller's forward.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from types import ModuleType

import torch

from .call import AttentionCall
from .registry import Backend, register_backend

INSTALL_HINT = "pip install flash-attn --no-build-isolation"
#: window_size (sliding windows) arrived in 2.3; bottom-right causal alignment in 2.1
MIN_VERSION = (2, 3)
#: flash-attn 2 kernels exist for Ampere (sm80) and newer only
MIN_CAPABILITY = (8, 0)


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.6.3.post1"`` -> ``(2, 6, 3)``: the leading dotted integers of a version string."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def _installed() -> bool:
    try:
        return importlib.util.find_spec("flash_attn") is not None
    except (ImportError, ValueError):  # a module already in sys.modules without a spec
        return True


@functools.lru_cache(maxsize=1)
def load_flash_attn() -> tuple[ModuleType | None, str | None]:
    """``(flash_attn module, None)``, or ``(None, why it cannot be used)``; imported once per process."""
    try:
        fa = importlib.import_module("flash_attn")
    except ModuleNotFoundError as e:
        if e.name == "flash_attn":
            return None, f"flash-attn is not installed ({INSTALL_HINT})"
        return None, f"flash-attn does not import: {e} (reinstall it: {INSTALL_HINT})"
    except Exception as e:  # a wheel for another torch/CUDA fails in many ways
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return None, (f"flash-attn is installed but does not import ({type(e).__name__}: {first}); its wheel "
                      f"does not match torch {torch.__version__}: {INSTALL_HINT}")
    version = getattr(fa, "__version__", "unknown")
    if parse_version(version)[:2] < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return None, f"flash-attn {version} is too old (need >= {need} for sliding windows): pip install -U flash-attn"
    if not hasattr(fa, "flash_attn_func"):
        return None, f"flash-attn {version} has no flash_attn_func (is it flash-attn 2?)"
    return fa, None


def capability_reason(device: torch.device) -> str | None:
    """None when ``device``'s compute capability has flash-attn kernels, else why not."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability_reason(index)


@functools.cache
def _capability_reason(index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) < MIN_CAPABILITY:
        need = ".".join(map(str, MIN_CAPABILITY))
        return (f"flash-attn 2 needs compute capability >= {need} (Ampere or newer); "
                f"cuda:{index} has {major}.{minor}")
    return None


@register_backend
class FlashBackend(Backend):
    """The ``flash`` backend: the flash-attn package's kernels on CUDA (fp16/bf16), when it is installed."""

    name = "flash"
    summary = "flash-attn package on CUDA (fp16/bf16)"

    def available(self) -> str | None:
        if not _installed():
            return f"flash-attn is not installed ({INSTALL_HINT})"
        if not torch.cuda.is_available():
            return "flash-attn needs a CUDA device and none is available"
        return load_flash_attn()[1]

    def supports(self, call: AttentionCall) -> str | None:
        if call.device.type != "cuda":
            return f"flash-attn runs on cuda, tensors are on {call.device}"
        why = capability_reason(call.device)
        if why is not None:
            return why
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
        fa, why = load_flash_attn()
        if fa is None:
            raise RuntimeError(why)
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
