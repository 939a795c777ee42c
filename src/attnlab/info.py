"""What this installation can do: versions, device, the BLAS and native kernel in use, and which
backend serves which call."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from . import __version__
from . import masks as M  # noqa: N812 - the mask namespace reads as M.causal()
from .exact import calibration, explain, native_build
from .mechanisms import mechanisms
from .utils import cpu_model


@dataclass(frozen=True)
class TypicalCall:
    """A representative call shown in ``attnlab info``."""

    label: str
    n: int
    mask: M.Mask | None
    return_weights: bool = False
    grad: bool = False


def _ring(n: int, k: int) -> M.Mask:
    """A graph mask in which node ``i`` receives edges from the ``k`` nodes after it (cyclically)."""
    src = (torch.arange(n).repeat_interleave(k) + torch.arange(1, k + 1).repeat(n)) % n
    return M.graph(torch.stack([src, torch.arange(n).repeat_interleave(k)]), num_nodes=n)


TYPICAL_CALLS = (
    TypicalCall("N=1024, no mask", 1024, None),
    TypicalCall("N=1024, causal", 1024, M.causal()),
    TypicalCall("N=1024, causal, training (fwd+bwd)", 1024, M.causal(), grad=True),
    TypicalCall("N=4096, sliding_window(256)", 4096, M.sliding_window(256)),
    TypicalCall("N=1024, padding", 1024, M.padding([700])),
    TypicalCall("N=1024, return_weights", 1024, None, return_weights=True),
    TypicalCall("N=4096, graph (8 edges per node)", 4096, _ring(4096, 8), grad=True),
)




def _mkl_verbose_line() -> str:
    """MKL's verbose line for one small ``torch.mm`` (MKL prints it on the C stdout, captured here)."""
    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 1)
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                a = torch.ones(64, 64)
                a @ a
            libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return next((ln for ln in f.read().decode(errors="replace").splitlines() if "MKL_VERBOSE" in ln), "")


def blas_path() -> str:
    """The BLAS behind ``torch.mm`` and, for MKL, the code path it reports taking on this CPU."""
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    blas = found.group(1) if found else "unknown"
    if blas != "mkl" or not torch.backends.mkl.is_available():
        return f"torch.mm: {blas}"
    try:
        line = _mkl_verbose_line()
    except (OSError, RuntimeError, AttributeError):
        line = ""
    path = re.search(r"architecture (.+?)(?:,|$)", line)
    if path is None:
        return "torch.mm: MKL (its code path could not be read)"
    isa = path.group(1).strip()
    generic = "Intel(R) Architecture processors" in isa
    vendor = "AMD" if "AuthenticAMD" in _cpu_vendor() else None
    note = " (MKL's generic code path" + (" on an AMD CPU" if vendor else "") + ")" if generic else ""
    return f"torch.mm: MKL, {isa}{note}; oneDNN (torch._C._nn.mkldnn_linear, the native kernel's brgemm): " \
           f"{'available' if torch.backends.mkldnn.is_available() else 'not built in'}"


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln for ln in f if ln.startswith("vendor_id")), "")
    except OSError:
        return ""


def _native() -> dict:
    """The native kernel's state: in use (and where it lives) or why not, in one line."""
    why = native_build.status()
    lib = native_build.library() if why is None else None
    return {"reason": why, "cache": str(native_build.cache_dir()), "build_seconds": native_build.build_seconds(),
            "info": lib.info() if lib is not None else None, "isa": native_build.isa_request(),
            "bf16_reason": native_build.bf16_status() if why is None else why}


def collect(device: str | None = None) -> dict:
    """Versions, device and, per typical call, every backend's verdict (a JSON-able dict)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = {
        "versions": {
            "attnlab": __version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "device": {
            "device": str(dev),
            "cpu": cpu_model(),
            "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "blas": blas_path(),
        "native": _native(),
        "calls": [],
        "cost_constants": calibration.status(),
        "mechanisms": {name: cls.masks_supported for name, cls in mechanisms().items()},
    }
    for tc in TYPICAL_CALLS:
        # meta-free small stand-ins would change verdicts; use real (uninitialized) tensors
        q = torch.empty(1, 8, tc.n, 64, device=dev, requires_grad=tc.grad)
        k = torch.empty(1, 8, tc.n, 64, device=dev)
        v = torch.empty(1, 8, tc.n, 64, device=dev)
        verdicts = explain(q, k, v, mask=tc.mask, return_weights=tc.return_weights)
        out["calls"].append(
            {
                "call": tc.label,
                "backends": [
                    {"backend": v.backend, "serves": v.serves, "chosen": v.chosen, "reason": v.reason,
                     "estimate": v.estimate, "note": v.note}
                    for v in verdicts
                ],
            }
        )
    return out


def format_info(info: dict) -> str:
    """Human-readable text of :func:`collect`'s result."""
    lines = ["attnlab " + info["versions"]["attnlab"]]
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    d = info["device"]
    lines.append(f"device: {d['device']} | cpu: {d['cpu']} | torch threads: {d['threads']} | cuda: {d['cuda'] or 'none'}")
    lines.append(f"BLAS: {info['blas']}")
    nat = info["native"]
    if nat["reason"] is None:
        built = f", built in {nat['build_seconds']:.0f} s" if nat.get("build_seconds") else ""
        isa = f", ATTNLAB_NATIVE_ISA={nat['isa']}" if nat.get("isa", "native") != "native" else ""
        lines.append(f"native kernel: in use ({nat['info']}{isa}; cache {nat['cache']}{built})")
        if "bf16_reason" in nat:
            lines.append(f"native kernel, bfloat16: {'not used: ' + nat['bf16_reason'] if nat['bf16_reason'] else 'in use'}")
    else:
        lines.append(f"native kernel: not used: {nat['reason']}")
    lines.append(f"auto's cost constants: {info.get('cost_constants', 'shipped defaults')}")
    lines.append("")
    lines.append("backends per typical call (B=1, H=8, D=64, float32); * = auto's choice")
    for c in info["calls"]:
        lines.append(f"  {c['call']}")
        best = next((b["estimate"] for b in c["backends"] if b["chosen"]), None)
        for b in c["backends"]:
            mark = "*" if b["chosen"] else " "
            if not b["serves"] and b["reason"] == nat["reason"]:
                status = "no: the native kernel is not in use (see above)"  # its reason, said once
            elif not b["serves"]:
                status = "no: " + b["reason"]
            elif b["chosen"]:
                status = "serves (auto's choice: lowest estimated cost)"
            elif b["backend"] == "reference":
                status = "serves (the float64 oracle; never chosen by auto)"
            elif b["backend"] == "native":
                status = "serves (auto reaches it through chunked, which runs it)"
            elif best and b["estimate"] not in (None, float("inf")):
                status = f"serves, estimated {b['estimate'] / best:.1f}x the cost of auto's choice"
            else:
                status = "serves, not considered by auto on this device (compile cost)"
            if b.get("note"):
                status += f" [{b['note']}]"
            lines.append(f"    {mark} {b['backend']:<10} {status}")
    lines.append("")
    lines.append("mechanisms:")
    for name, masks in info["mechanisms"].items():
        lines.append(f"  {name:<12} masks: {masks}")
    return "\n".join(lines)
