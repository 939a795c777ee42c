"""Divided space-time attention against joint attention, at the op level, in one process.

    .venv/bin/python scripts/structured_speed.py                  # T=16 frames of 32x32 (16,384 positions)
    .venv/bin/python scripts/structured_speed.py --frames 8 --side 16 --heads 2   # a quick look

Joint attention: every position sees every position, through SDPA (``backend="sdpa"``, no
mask). Divided attention (TimeSformer's): the same q, k, v through two calls, time
(``masks.same_position``) then space (``masks.same_frame``), on the backend ``auto`` picks
(``regroup``: a batch of small dense attentions), and the same two masks through ``chunked``
(tiles skipped) and through ``math`` (each mask materialized as N x N). Every contender runs
forward and backward. Times are medians of calls alternated between the contenders (a load
change hits all of them); the peak memory of one fwd+bwd call is read from the high-water mark
of a fresh process per contender (``attnlab.bench.measure.peak_memory``, glibc returning freed
blocks), after one warm-up call, beyond what was held before it. Every figure printed is
measured by this run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import attnlab
from attnlab import masks
from attnlab.bench.measure import alternate, honest_malloc, peak_memory


def _inputs(n: int, heads: int, dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, dim, generator=g).requires_grad_() for _ in range(3)]


def joint(q, k, v):
    def run():
        q.grad = k.grad = v.grad = None
        attnlab.attention(q, k, v, backend="sdpa").sum().backward()
    return run


def divided(q, k, v, shape, backend):
    time_mask, space_mask = masks.same_position(shape), masks.same_frame(shape)

    def run():
        q.grad = k.grad = v.grad = None
        t = attnlab.attention(q, k, v, mask=time_mask, backend=backend)
        s = attnlab.attention(q, k, v, mask=space_mask, backend=backend)
        (t + s).sum().backward()
    return run


def contenders(args, q, k, v, shape) -> dict:
    out = {"joint (sdpa)": joint(q, k, v), "divided (auto)": divided(q, k, v, shape, "auto"),
           "divided (chunked)": divided(q, k, v, shape, "chunked")}
    if not args.no_math:
        out["divided (math)"] = divided(q, k, v, shape, "math")
    return out


def memory_of(args, name: str) -> None:
    """Print the peak bytes of one fwd+bwd call of contender ``name`` (run in a fresh process, after a warm-up)."""
    honest_malloc()  # from the start: blocks freed before the measured call go back to the system
    shape = (args.frames, args.side, args.side)
    q, k, v = _inputs(shape[0] * shape[1] * shape[2], args.heads, args.dim)
    run = contenders(args, q, k, v, shape)[name]
    run()  # warm-up: one-time allocations (thread pools, kernel checks) are not the call's
    q.grad = k.grad = v.grad = None
    _, peak, method = peak_memory(run, "cpu")
    print(json.dumps({"peak": peak, "method": method}))



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--side", type=int, default=32, help="H = W of each frame")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--dim", type=int, default=64, help="head dim")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-math", action="store_true", help="skip the math backend (it materializes N x N)")
    ap.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # one contender's memory (a subprocess)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        memory_of(args, args.memory_of)
        return
    shape = (args.frames, args.side, args.side)
    n = args.frames * args.side * args.side
    q, k, v = _inputs(n, args.heads, args.dim)
    choice = attnlab.exact.choose_backend(q.detach(), k.detach(), v.detach(), mask=masks.same_frame(shape))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; T={args.frames} frames of "
          f"{args.side}x{args.side} = {n:,} positions, B=1, H={args.heads}, D={args.dim}, float32, fwd+bwd; "
          f"auto serves the divided masks with {choice!r}")
    ops = {k_: fn for k_, fn in contenders(args, q, k, v, shape).items() if k_ != "divided (math)"}
    times = alternate(ops, args.repeats)
    base = times["joint (sdpa)"]
    for name, t in times.items():
        print(f"{name}: {t * 1e3:,.0f} ms, {base / t:.1f}x joint's speed", flush=True)
    peaks = {}
    for name in contenders(args, q, k, v, shape):
        t = time.perf_counter()
        res = subprocess.run([sys.executable, __file__, "--memory-of", name, *sys.argv[1:]], check=True,
                             capture_output=True, text=True)
        rec = json.loads(res.stdout.strip().splitlines()[-1])
        peaks[name] = rec["peak"]
        print(f"{name}: peak {rec['peak'] / 2**20:,.1f} MiB beyond the inputs, after a warm-up call, in a fresh "
              f"process ({rec['method']}; {time.perf_counter() - t:.0f} s)", flush=True)
    if "divided (math)" in peaks:
        print(f"memory: divided (auto) uses {peaks['divided (math)'] / max(1, peaks['divided (auto)']):.0f}x less "
              f"than the same masks through math")
    print(f"speed: divided (auto) fwd+bwd is {base / times['divided (auto)']:.1f}x faster than joint (sdpa)")


if __name__ == "__main__":
    main()
