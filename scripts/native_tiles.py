"""The native kernel's query tile: its forward and fwd+bwd time at query blocks of 64, 128 and 256 rows.

    .venv/bin/python scripts/native_tiles.py                       # N = 4,096 and 16,384, D = 64 and 128
    .venv/bin/python scripts/native_tiles.py --lengths 4096 --dims 64 --dtypes bf16

Calls the kernel's ops directly (``attnlab.exact.native_build.library()``) on B=1, H=8 inputs with
no mask and with a causal mask (as row intervals, the way ``attention`` hands it over), the key
block at 64. The block sizes of one row are alternated call by call in one process
(``attnlab.bench.measure.alternate``: a change of load hits them all), and each row prints the
median times and their ratio to the 64-row block's, after checking that every block size gives the
64-row block's outputs and gradients (to float32 / bfloat16 rounding). The first lines say on what
machine and under what load. What it measured is in docs/native.md ("Tile sizes").
"""

from __future__ import annotations

import argparse
import os

import torch

from attnlab.bench.measure import alternate
from attnlab.exact.native_build import library
from attnlab.utils import cpu_model

BLOCKS = (64, 128, 256)


def _case(ops, n: int, d: int, causal: bool, dtype: torch.dtype, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, n, d, generator=g).to(dtype) for _ in range(4))
    lo = torch.zeros(1, n, dtype=torch.int32) if causal else None
    hi = (torch.arange(n, dtype=torch.int32) + 1)[None] if causal else None
    scale = d ** -0.5

    def fwd(bq: int):
        return ops.forward(q, k, v, lo, hi, None, None, None, None, None, scale, bq, 64)

    def both(bq: int):
        out, lse = fwd(bq)
        return (out, *ops.backward(do, q, k, v, out, lse, lo, hi, None, None, None, None, None, False, scale,
                                   bq, 64)[:3])

    ref = both(64)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for bq in BLOCKS[1:]:
        got = both(bq)
        err = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(got, ref))
        if err > tol:
            raise SystemExit(f"block_q={bq} differs from block_q=64 by {err:.1e} (N={n}, D={d}, causal={causal})")
    name = "causal" if causal else "no mask"
    dt = "bf16" if dtype == torch.bfloat16 else "fp32"
    for label, fn in (("fwd", fwd), ("fwd+bwd", both)):
        times = alternate({bq: (lambda bq=bq, fn=fn: fn(bq)) for bq in BLOCKS}, repeats=repeats)
        base = times[64]
        cells = ", ".join(f"{bq}: {times[bq] * 1e3:,.0f} ms ({base / times[bq]:.2f}x)" for bq in BLOCKS)
        print(f"{dt} {name}, {label}, N={n:,}, D={d}: {cells}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--dtypes", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    ops = library()
    if ops is None:
        raise SystemExit("the native kernel is not built here (attnlab info says why)")
    print(f"# {cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f}; kernel: {ops.info()}")
    for dt in a.dtypes:
        dtype = torch.bfloat16 if dt == "bf16" else torch.float32
        if dtype == torch.bfloat16 and "bf16 avx512_bf16" not in ops.info():
            print("# bf16 skipped: the kernel's build has no avx512_bf16 path")
            continue
        for n in a.lengths:
            for d in a.dims:
                for causal in (False, True):
                    _case(ops, n, d, causal, dtype, a.repeats)


if __name__ == "__main__":
    main()
