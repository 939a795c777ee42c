"""``attnlab bench calibrate``: time each exact backend here and fit the constants ``auto`` reads.

See :mod:`attnlab.exact.calibration` for the model: per backend and mode, a straight
line ``seconds = scale * estimate + overhead`` fitted by least squares over a small grid of
calls (mask kinds x lengths, forward and forward+backward).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .. import masks
from ..exact import attention, get_backend, make_call
from ..exact.calibration import VERSION, fit, identity

__all__ = ["GRID_LENGTHS", "GRID_MASKS", "calibrate"]

def _time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


#: the calls calibration times: mask kinds and lengths (B=1, H=8, D=64)
GRID_MASKS = ("none", "causal", "sliding_window", "document")
GRID_LENGTHS = (512, 1024, 2048)


def _grid_mask(kind: str, n: int):
    return {"none": None, "causal": masks.causal(), "sliding_window": masks.sliding_window(256),
            "document": masks.document(torch.arange(n) // max(1, n // 8))}[kind]


def calibrate(lengths=GRID_LENGTHS, mask_kinds=GRID_MASKS, backends_=("sdpa", "chunked", "math"), repeats: int = 3,
              heads: int = 8, head_dim: int = 64, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time each backend on the grid and fit its constants; returns the file's content (see :func:`write`)."""
    points: dict[str, dict[str, list[tuple[float, float]]]] = {}
    cases = []
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        q, k, v = (torch.randn(1, heads, n, head_dim, generator=g) for _ in range(3))
        for kind in mask_kinds:
            mask = _grid_mask(kind, n)
            for name in backends_:
                b = get_backend(name)
                for mode in ("fwd", "fwd_bwd"):
                    qg = q.clone().requires_grad_(mode == "fwd_bwd")
                    call = make_call(qg, k, v, mask=mask)
                    if b.verdict(call) is not None:
                        continue
                    if progress:
                        progress(f"calibrate {name} {kind} N={n} {mode}")

                    def run(qg=qg, k=k, v=v, mask=mask, name=name, mode=mode):
                        out = attention(qg, k, v, mask=mask, backend=name)
                        if mode == "fwd_bwd":
                            out.sum().backward()
                            qg.grad = None

                    with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                        seconds = _time(run, repeats)
                    est = b.estimate(call)
                    points.setdefault(name, {}).setdefault(mode, []).append((est, seconds))
                    cases.append({"backend": name, "mask": kind, "N": n, "mode": mode, "estimate": est,
                                  "seconds": seconds})
    consts = {name: {mode: fit(pts) for mode, pts in modes.items()} for name, modes in points.items()}
    return {"version": VERSION, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "identity": identity(),
            "constants": consts, "cases": cases}


