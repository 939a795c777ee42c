"""The native kernel against this machine's GEMM ceiling, SDPA, and its own AVX2 build, in one run.

    .venv/bin/python scripts/native_ceiling.py            # N = 4,096 and 16,384, D = 64 and 128 (tens of minutes)
    .venv/bin/python scripts/native_ceiling.py --quick    # N = 4,096, D = 64 only, fewer repeats (a few minutes)

B=1, H=8, float32, torch's default thread count. In one process, alternated with medians
(``attnlab.bench.measure.alternate``: a change of load hits every contender alike):

* the ceiling: float32 ``torch.mm`` of 2048 x 2048 x 2048 (2 * 2048^3 FLOPs per call);
* the native kernel's forward and forward+backward at each (N, D, mask in none/causal), as a
  fraction of that ceiling, FLOPs counted as FlashAttention counts them: 4 N^2 D per head
  forward, 2.5x that forward+backward (the backward's five products against the forward's two),
  halved under a causal mask;
* SDPA's time over the kernel's, forward and forward+backward (``backend="sdpa"``).

Then the AVX2 build's forward against the default (AVX-512 where the CPU has it) build's: each in its
own child process (one op namespace per process), ``ATTNLAB_NATIVE_ISA=avx2`` or ``native``,
the children alternated over rounds and the medians of their medians compared. Every figure printed
is measured by this run; the first lines say on what machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

import attnlab
from attnlab import masks
from attnlab.bench.measure import alternate
from attnlab.exact import native
from attnlab.utils import cpu_model


def _qkv(n: int, d: int, grad: bool):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 8, n, d, generator=g).requires_grad_(grad) for _ in range(3)]


def _call(backend: str, n: int, d: int, causal: bool, grad: bool):
    q, k, v = _qkv(n, d, grad)
    mask = masks.causal() if causal else None
    do = torch.randn(1, 8, n, d)

    def fn():
        out = attnlab.attention(q, k, v, mask=mask, backend=backend)
        if grad:
            torch.autograd.grad(out, (q, k, v), do)
    return fn


def _mm():
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return lambda: torch.mm(a, b)


def _flops(n: int, d: int, causal: bool, grad: bool) -> float:
    f = 4.0 * 8 * n * n * d * (2.5 if grad else 1.0)
    return f / 2 if causal else f


def speed_rows(lengths, dims, repeats: int) -> list[dict]:
    rows = []
    for n in lengths:
        for d in dims:
            for causal in (False, True):
                for grad in (False, True):
                    r = 2 if n > 8192 else repeats
                    t = alternate({"mm": _mm(), "native": _call("native", n, d, causal, grad),
                                   "sdpa": _call("sdpa", n, d, causal, grad)}, r)
                    ceiling = 2.0 * 2048 ** 3 / t["mm"]
                    rate = _flops(n, d, causal, grad) / t["native"]
                    rows.append({"N": n, "D": d, "mask": "causal" if causal else "none",
                                 "pass": "fwd+bwd" if grad else "fwd", "native_s": t["native"], "sdpa_s": t["sdpa"],
                                 "mm_gflops": ceiling / 1e9, "native_gflops": rate / 1e9,
                                 "fraction_of_mm": rate / ceiling, "sdpa_over_native": t["sdpa"] / t["native"]})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def _child(n: int, d: int, repeats: int) -> None:
    """One ISA's forward median (the child of :func:`isa_rows`)."""
    assert native.status() is None, native.status()
    t = alternate({"native": _call("native", n, d, True, False)}, repeats)
    print(json.dumps({"info": native_build_info(), "seconds": t["native"]}))


def native_build_info() -> str:
    from attnlab.exact import native_build

    return native_build.library().info()


def isa_rows(n: int, d: int, rounds: int, repeats: int) -> dict:
    got: dict[str, list[float]] = {"avx2": [], "native": []}
    info = {}
    for _ in range(rounds):
        for isa in got:
            env = {**os.environ, "ATTNLAB_NATIVE_ISA": isa}
            done = subprocess.run([sys.executable, __file__, "--child", str(n), str(d), str(repeats)], env=env,
                                  capture_output=True, text=True, timeout=3600, check=True)
            res = json.loads(done.stdout.strip().splitlines()[-1])
            got[isa].append(res["seconds"])
            info[isa] = res["info"]
    med = {k: statistics.median(v) for k, v in got.items()}
    row = {"N": n, "D": d, "mask": "causal", "avx2_s": med["avx2"], "native_s": med["native"],
           "avx2_speed_over_native": med["native"] / med["avx2"], "builds": info}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="N = 4,096 and D = 64 only, fewer repeats")
    p.add_argument("--child", nargs=3, type=int, metavar=("N", "D", "REPEATS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(*args.child)
        return
    print(f"# {cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    if native.status() is not None:
        raise SystemExit(f"the native kernel is not in use: {native.status()}")
    lengths, dims, repeats = ([4096], [64], 3) if args.quick else ([4096, 16384], [64, 128], 5)
    speed_rows(lengths, dims, repeats)
    isa_rows(4096, 64, 2 if args.quick else 5, repeats)


if __name__ == "__main__":
    main()
