"""What this installation can do: versions, device, and which backend serves which call."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import numpy as np
import torch

from . import __version__
from . import masks as M  # noqa: N812 - the mask namespace reads as M.causal()
from .exact import calibration, explain
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


TYPICAL_CALLS = (
    TypicalCall("N=1024, no mask", 1024, None),
    TypicalCall("N=1024, causal", 1024, M.causal()),
    TypicalCall("N=1024, causal, training (fwd+bwd)", 1024, M.causal(), grad=True),
    TypicalCall("N=4096, sliding_window(256)", 4096, M.sliding_window(256)),
    TypicalCall("N=1024, padding", 1024, M.padding([700])),
    TypicalCall("N=1024, return_weights", 1024, None, return_weights=True),
)




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
    lines.append(f"auto's cost constants: {info.get('cost_constants', 'shipped defaults')}")
    lines.append("")
    lines.append("backends per typical call (B=1, H=8, D=64, float32); * = auto's choice")
    for c in info["calls"]:
        lines.append(f"  {c['call']}")
        best = next((b["estimate"] for b in c["backends"] if b["chosen"]), None)
        for b in c["backends"]:
            mark = "*" if b["chosen"] else " "
            if not b["serves"]:
                status = "no: " + b["reason"]
            elif b["chosen"]:
                status = "serves (auto's choice: lowest estimated cost)"
            elif b["backend"] == "reference":
                status = "serves (the float64 oracle; never chosen by auto)"
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
