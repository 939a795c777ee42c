"""A fixed native-kernel workload to profile: forward and backward calls, no mask, on one thread.

    perf record -o /tmp/native.perf .venv/bin/python scripts/native_profile.py --dtype bf16 --calls 12
    perf report -i /tmp/native.perf --sort dso              # oneDNN's JIT GEMMs vs the kernel's own code
    perf report -i /tmp/native.perf --sort dso,symbol       # ... and which of its functions

B=1, H=8, N=4,096 (``--length``), D=64, the kernel's ops called directly (no autograd, no
``attention`` dispatch), one torch thread so that the samples are not split between an OpenMP
team's threads. oneDNN's generated GEMM code shows in ``perf report`` as ``[JIT]`` (it has no
symbols); PyTorch's brgemm wrapper and its kernel cache as ``at::native::cpublas::...`` in
``libtorch_cpu.so``. What it measured is in docs/native.md ("Where the time goes").
"""

from __future__ import annotations

import argparse

import torch

from attnlab.exact.native_build import library


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--calls", type=int, default=8, help="forward + backward pairs")
    p.add_argument("--length", type=int, default=4096)
    a = p.parse_args()
    ops = library()
    if ops is None:
        raise SystemExit("the native kernel is not built here (attnlab info says why)")
    torch.set_num_threads(1)
    n, d = a.length, 64
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, n, d, generator=g).to(dtype) for _ in range(4))
    none = (None,) * 7
    for _ in range(a.calls):
        out, lse = ops.forward(q, k, v, *none, d ** -0.5, 64, 64)
        ops.backward(do, q, k, v, out, lse, *none, False, d ** -0.5, 64, 64)


if __name__ == "__main__":
    main()
