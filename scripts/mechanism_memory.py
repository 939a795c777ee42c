"""Peak memory of each mechanism's forward+backward as N doubles, one fresh process per case.

    .venv/bin/python scripts/mechanism_memory.py                      # defaults below (~2 minutes)
    .venv/bin/python scripts/mechanism_memory.py linear,performer 4096,8192

B=1, H=8, D=64, float32; peak = VmHWM - VmRSS around one forward+backward
(attnlab.bench.measure.measure_op). Prints MiB per N and the growth per doubling.
"""

from __future__ import annotations

import subprocess
import sys

NAMES = "linformer,performer,linear,longformer,nystrom"
LENGTHS = "4096,8192,16384"
SETTINGS = {"linformer": '{"max_len": N, "k": 256}', "performer": '{"features": 256}', "longformer": '{"window": 256}',
            "nystrom": '{"num_landmarks": 64}'}

CHILD = """
import torch
from attnlab.mechanisms import create
from attnlab.bench.measure import measure_op
N = {n}
torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, N, 64, requires_grad=True) for _ in range(3))
m = create({name!r}, **{settings})
r = measure_op(lambda: m(q, k, v).sum().backward(), "cpu", repeats=1, budget_s=1)
print(r["peak_bytes"])
"""


def main() -> int:
    names = (sys.argv[1] if len(sys.argv) > 1 else NAMES).split(",")
    lengths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else LENGTHS).split(",")]
    print(f"{'mechanism':<12}" + "".join(f"{'N=' + str(n):>12}" for n in lengths) + "   growth per doubling")
    for name in names:
        settings = SETTINGS.get(name, "")
        peaks = []
        for n in lengths:
            code = CHILD.format(n=n, name=name, settings=settings.replace("N", str(n)) if settings else "{}")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            peaks.append(int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None)
        cells = "".join(f"{p / 2**20:>9.0f} MiB" if p is not None else f"{'error':>12}" for p in peaks)
        growth = [f"{b / a:.2f}x" for a, b in zip(peaks, peaks[1:]) if a and b]
        print(f"{name:<12}{cells}   {' '.join(growth)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
