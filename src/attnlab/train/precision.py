"""Mixed precision for training: which precision ``auto`` becomes on a device, and autocast.

``fp16`` (CUDA, with loss scaling, Micikevicius et al., 2018), ``bf16`` (autocast),
``fp32``, or ``auto``: on CUDA bf16 where the GPU computes it natively (compute
capability 8.0 or newer, :func:`native_bf16`) else fp16; on the CPU bf16 only if a
measured bf16 training step (forward and backward, :func:`measure_cpu_bf16`) beats fp32
on this machine, since CPUs without native bf16 run it several times slower.

:func:`resolve_precision` makes the choice for one device; the trainer adds what a run
needs on top (a resumed run keeps its precision, data-parallel ranks agree on one).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

import torch

__all__ = ["PRECISIONS", "measure_cpu_bf16", "native_bf16", "resolve_precision", "autocast"]

#: accepted ``TrainConfig.precision`` values
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def measure_cpu_bf16(step: Callable[[], torch.Tensor], repeats: int = 3) -> tuple[bool, str]:
    """Time ``step()`` (a forward returning a loss; backward is run here) in fp32 and in bf16 autocast.

    Returns ``(bf16 is at least 10% faster, a sentence with the measurement)``. Tiny
    models often lose in bf16 even on CPUs with native bf16 (casts cost more than the
    products save), so the real training step is measured rather than a large product.
    """

    def run(bf16: bool) -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = step()
            loss.backward()
            best = min(best, time.perf_counter() - t0)
        return best

    run(False), run(True)  # warm up both paths
    t32, t16 = run(False), run(True)
    cap = torch.backends.cpu.get_cpu_capability()
    faster = t16 < 0.9 * t32
    why = (f"measured a training step: fp32 {t32 * 1e3:.1f} ms, bf16 autocast {t16 * 1e3:.1f} ms "
           f"on this CPU (capability {cap})")
    return faster, why


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether the CUDA ``device`` computes bf16 natively, and the sentence saying so.

    ``torch.cuda.is_bf16_supported()`` also counts emulation: a pre-Ampere GPU runs bf16
    through float32 several times slower than fp16, so ``auto`` asks for native support
    (compute capability 8.0 or newer).
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    try:
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.5 counts no emulation and takes no argument
        supported = torch.cuda.is_bf16_supported()
    if supported and (major, minor) >= (8, 0):
        return True, f"cuda:{index} (compute capability {major}.{minor}) computes bf16 natively"
    return False, (f"cuda:{index} (compute capability {major}.{minor}) has no native bf16 (it would be emulated); "
                   "fp16 with loss scaling")


def resolve_precision(requested: str, device: torch.device,
                      probe: Callable[[], tuple[bool, str]] | None = None) -> tuple[str, str]:
    """``(precision, reason)``: what ``auto`` becomes on ``device``, and why.

    Args:
        requested: one of ``auto``, ``fp32``, ``bf16``, ``fp16``.
        device: the training device.
        probe: on the CPU, ``auto`` calls it (e.g. :func:`measure_cpu_bf16` on the real
            step) and takes bf16 only if it says bf16 is faster; without one, fp32.

    Raises:
        ValueError: for fp16 on the CPU (no loss-scaled fp16 training there).
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {requested!r}")
    if device.type == "cuda":
        if requested == "auto":
            native, why = native_bf16(device)
            return ("bf16", why) if native else ("fp16", why)
        return requested, "requested"
    if requested == "fp16":
        raise ValueError("precision fp16 needs CUDA (loss-scaled fp16 training); use bf16 or fp32 on the CPU")
    if requested != "auto":
        return requested, "requested"
    if probe is None:
        return "fp32", "no measurement of bf16 on this CPU"
    faster, why = probe()
    return ("bf16", why + " -> bf16") if faster else ("fp32", why + " -> fp32")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of ``precision`` (``fp32``, ``bf16``, ``fp16``) on ``device``; fp32 does nothing."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)
