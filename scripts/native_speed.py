"""attnlab's native CPU kernel against its peers, in one process: speed, memory, scaling and error against its peers.

    .venv/bin/python scripts/native_speed.py               # all rows (about 15-25 minutes on a 2-core CPU)
    .venv/bin/python scripts/native_speed.py --quick       # N=4,096 rows, the error and MHA rows (minutes)
    .venv/bin/python scripts/native_speed.py --only memory # one group: speed, window, document, scaling,
                                                             # memory, error, mha, bf16
    .venv/bin/python scripts/native_speed.py --only bf16 --lengths 4096 --threads 2   # bfloat16 against float32
    .venv/bin/python scripts/native_speed.py --only speed --lengths 16384   # the speed rows at one length

B=1, H=8, D=64, float32, torch's default thread count (2 on the 2-core machine of docs/native.md)
unless a row says otherwise. Times are medians of calls alternated between the contenders
(a change of load hits both); ratios are the peer's time over ours. "chunked" is the backend
as users get it (the native kernel when built); "old chunked" is the same backend with the
kernel turned off (``attnlab.exact.native.set_native_enabled(False)``: the fused per-block
path on PyTorch's CPU flash kernel). Errors are max|out - ref| / max|ref| (and the same for
the gradients) against float64. The bf16 rows time the kernel in bfloat16 against itself in
float32 and against SDPA in bfloat16 (what ``auto`` ran bfloat16 calls on before the kernel took
them), and give the bf16 errors of the kernel, SDPA and the textbook formula in plain bfloat16
against float64 on the same bf16-rounded inputs. Memory is the fwd+bwd peak beyond the inputs
(``attnlab.bench.measure.peak_memory``). Every figure printed is measured by this run, and
the first lines say on what machine and under what load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import attnlab
from attnlab import masks
from attnlab.bench.measure import alternate, peak_memory
from attnlab.exact import native
from attnlab.utils import cpu_model


def _inputs(n: int, grad: bool, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 8, n, 64, generator=g).to(dtype).requires_grad_(grad) for _ in range(3)]


def _op(backend: str, n: int, mask, grad: bool, *, kernel: bool = True, threads: int | None = None,
        dtype=torch.float32):
    """One call of ``attention`` (with its backward when ``grad``), the kernel on or off, at a thread count."""
    q, k, v = _inputs(n, grad, dtype=dtype)

    def run():
        before = torch.get_num_threads()
        native.set_native_enabled(kernel)
        if threads:
            torch.set_num_threads(threads)
        try:
            with torch.set_grad_enabled(grad):
                out = attnlab.attention(q, k, v, mask=mask, backend=backend)
                if grad:
                    out.sum().backward()
                    q.grad = k.grad = v.grad = None
        finally:
            native.set_native_enabled(True)
            torch.set_num_threads(before)

    return run



def _ms(r: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1e3:,.0f} ms" for k, v in r.items())


def speed_rows(repeats: int, lengths: tuple[int, ...]) -> list[str]:
    """No mask and causal, fwd and fwd+bwd: chunked and auto against SDPA."""
    out = []
    for n in lengths:
        reps = repeats if n <= 4096 else max(1, repeats // 2)
        for label, mask in (("no mask", None), ("causal", masks.causal())):
            for grad in (False, True):
                r = alternate({"chunked": _op("chunked", n, mask, grad), "auto": _op("auto", n, mask, grad),
                               "sdpa": _op("sdpa", n, mask, grad)}, reps)
                mode = "fwd+bwd" if grad else "fwd"
                out.append(f"{label}, {mode}, N={n:,}: SDPA / chunked {r['sdpa'] / r['chunked']:.2f}x, "
                           f"SDPA / auto {r['sdpa'] / r['auto']:.2f}x ({_ms(r)})")
    return out


def window_rows(repeats: int) -> list[str]:
    """sliding_window(256) at N=16,384 fwd+bwd: chunked against the old chunked."""
    n, win = 16384, masks.sliding_window(256)
    r = alternate({"chunked": _op("chunked", n, win, True), "old chunked": _op("chunked", n, win, True, kernel=False)},
                  max(1, repeats // 2))
    return [f"sliding_window(256), fwd+bwd, N={n:,}: old chunked / chunked {r['old chunked'] / r['chunked']:.2f}x "
            f"({_ms(r)})"]


def document_rows(repeats: int) -> list[str]:
    """document(8) at N=16,384 forward: chunked against SDPA given the dense mask."""
    n = 16384
    doc = masks.document(torch.arange(n) // (n // 8))
    dense = doc.dense(n, n)  # what SDPA needs: the N x N bool mask
    q, k, v = _inputs(n, False)
    r = alternate({"chunked": lambda: attnlab.attention(q, k, v, mask=doc, backend="chunked"),
                   "sdpa (dense mask)": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                                 attn_mask=dense)},
                  max(1, repeats // 2))
    return [f"document mask (8 documents), fwd, N={n:,}: SDPA-with-the-dense-mask / chunked "
            f"{r['sdpa (dense mask)'] / r['chunked']:.2f}x ({_ms(r)})"]


def scaling_rows(repeats: int) -> list[str]:
    """N=16,384 causal: the kernel on 2 threads against 1, fwd and fwd+bwd."""
    n, out = 16384, []
    for grad in (False, True):
        r = alternate({"1 thread": _op("chunked", n, masks.causal(), grad, threads=1),
                       "2 threads": _op("chunked", n, masks.causal(), grad, threads=2)}, max(1, repeats // 2))
        mode = "fwd+bwd" if grad else "fwd"
        out.append(f"causal, {mode}, N={n:,}: 2 threads / 1 thread speed {r['1 thread'] / r['2 threads']:.2f}x "
                   f"({_ms(r)})")
    return out


def memory_rows() -> list[str]:
    """Causal fwd+bwd at N=65,536: the peak beyond the inputs."""
    n = 65536
    q, k, v = _inputs(n, True)

    def run():
        attnlab.attention(q, k, v, mask=masks.causal(), backend="chunked").sum().backward()

    t = time.perf_counter()
    _, peak, method = peak_memory(run, "cpu")
    return [f"chunked fwd+bwd, causal, N={n:,}: peak {peak / 2**30:.2f} GiB beyond the inputs ({method}), "
            f"{time.perf_counter() - t:,.0f} s"]


def _errors(q, k, v, mask) -> tuple[float, float]:
    """(forward, gradient) relative errors of chunked against float64 math."""
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=mask, backend="chunked")
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * w).sum(), (qg, kg, vg))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = attnlab.attention(q64, k64, v64, mask=mask, backend="math")
    want = torch.autograd.grad((ref * w.double()).sum(), (q64, k64, v64))
    e_out = float((out.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max())
    e_grad = max(float((g.double() - r).abs().max() / r.abs().max()) for g, r in zip(grads, want))
    return e_out, e_grad


def error_rows() -> list[str]:
    """Every mask kind at N=1,024 (M=1,000 for the decode-shaped row): errors of chunked and old chunked."""
    n = 1024
    q, k, v = _inputs(n, False, seed=3)
    kinds = {"none": None, "causal": masks.causal(), "sliding_window": masks.sliding_window(100, 20),
             "padding": masks.padding([700]), "document": masks.document(torch.arange(n) // 300),
             "document&causal": masks.document(torch.arange(n) // 300) & masks.causal(),
             "prefix_lm": masks.prefix_lm(200), "window|global": masks.sliding_window(50) | masks.global_tokens([0, 511]),
             "dense": masks.dense(torch.rand(n, n, generator=torch.Generator().manual_seed(0)) > 0.5)}
    out = []
    for kind, mask in kinds.items():
        new = _errors(q, k, v, mask)
        native.set_native_enabled(False)
        try:
            old = _errors(q, k, v, mask)
        finally:
            native.set_native_enabled(True)
        out.append(f"error vs float64, {kind}: chunked out {new[0]:.1e} grad {new[1]:.1e}; old chunked out "
                   f"{old[0]:.1e} grad {old[1]:.1e}; ratio out {new[0] / max(old[0], 1e-30):.2f} "
                   f"grad {new[1] / max(old[1], 1e-30):.2f}")
    return out


def mha_rows(repeats: int) -> list[str]:
    """MultiHeadAttention(512, 8) forward at N=4,096 against torch.nn.MultiheadAttention(need_weights=False) (2x)."""
    from attnlab.layers import MultiHeadAttention

    n = 4096
    x = torch.randn(1, n, 512, generator=torch.Generator().manual_seed(0))
    theirs = torch.nn.MultiheadAttention(512, 8, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(theirs).eval()
    with torch.no_grad():
        r = alternate({"attnlab": lambda: ours(x), "torch": lambda: theirs(x, x, x, need_weights=False)}, repeats)
    return [f"MultiHeadAttention(512, 8) fwd, N={n:,}: torch / attnlab {r['torch'] / r['attnlab']:.2f}x ({_ms(r)})"]


def bf16_rows(repeats: int, lengths: tuple[int, ...]) -> list[str]:
    """No mask and causal, fwd and fwd+bwd: the kernel in bfloat16 against itself in float32 and SDPA in bf16;
    then the bf16 errors against float64 at N=1,024."""
    bf = torch.bfloat16
    out = [f"bf16: {native.bf16_status() or 'the kernel serves bfloat16 here'}"]
    for n in lengths:
        reps = repeats if n <= 4096 else max(1, repeats // 2)
        for label, mask in (("no mask", None), ("causal", masks.causal())):
            for grad in (False, True):
                r = alternate({"native bf16": _op("native", n, mask, grad, dtype=bf),
                               "native fp32": _op("native", n, mask, grad),
                               "sdpa bf16": _op("sdpa", n, mask, grad, dtype=bf)}, reps)
                mode = "fwd+bwd" if grad else "fwd"
                out.append(f"bf16 {label}, {mode}, N={n:,}: native fp32 / native bf16 "
                           f"{r['native fp32'] / r['native bf16']:.2f}x, SDPA bf16 / native bf16 "
                           f"{r['sdpa bf16'] / r['native bf16']:.2f}x ({_ms(r)})")
    n = 1024
    q, k, v = (x.to(bf) for x in _inputs(n, False, seed=3))
    kinds = {"none": None, "causal": masks.causal(),
             "window|global": masks.sliding_window(50) | masks.global_tokens([0, 511]),
             "dense": masks.dense(torch.rand(n, n, generator=torch.Generator().manual_seed(0)) > 0.5)}
    for kind, mask in kinds.items():
        errs = {name: _bf16_errors(q, k, v, mask, name) for name in ("native", "sdpa", "plain")}
        out.append(f"bf16 error vs float64, {kind}: " + "; ".join(
            f"{name} out {e[0]:.1e} grad {e[1]:.1e}" for name, e in errs.items()))
    return out


def _bf16_errors(q, k, v, mask, name: str) -> tuple[float, float]:
    """(forward, gradient) relative errors in bfloat16 against float64 math on the same (rounded) inputs;
    ``plain`` is the textbook formula in bf16 torch ops."""
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    if name == "plain":
        s = (qg @ kg.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if mask is not None:
            s = s.masked_fill(~mask.dense(q.shape[2], k.shape[2]), float("-inf"))
        out = torch.nan_to_num(torch.softmax(s, -1), nan=0.0) @ vg
    else:
        out = attnlab.attention(qg, kg, vg, mask=mask, backend=name)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * w).sum(), (qg, kg, vg))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = attnlab.attention(q64, k64, v64, mask=mask, backend="math")
    want = torch.autograd.grad((ref * w).sum(), (q64, k64, v64))
    e_out = float((out.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max())
    e_grad = max(float((g.double() - r).abs().max() / r.abs().max()) for g, r in zip(grads, want))
    return e_out, e_grad


def machine_line() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
            f"{torch.get_num_threads()} torch threads, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
            f"native kernel: {native.status() or 'in use'}")


GROUPS = ("speed", "window", "document", "scaling", "memory", "error", "mha", "bf16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="N=4,096 speed rows, errors and MHA only")
    ap.add_argument("--only", choices=GROUPS, action="append", help="run only these groups (repeatable)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--lengths", type=int, nargs="+", default=None,
                    help="lengths of the speed rows (default 4096 16384; 4096 with --quick)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    groups = args.only or (("speed", "error", "mha") if args.quick else GROUPS)
    print(machine_line(), flush=True)
    lengths = tuple(args.lengths) if args.lengths else ((4096,) if args.quick else (4096, 16384))
    rows = {"speed": lambda: speed_rows(args.repeats, lengths),
            "window": lambda: window_rows(args.repeats), "document": lambda: document_rows(args.repeats),
            "scaling": lambda: scaling_rows(args.repeats), "memory": memory_rows, "error": error_rows,
            "mha": lambda: mha_rows(args.repeats), "bf16": lambda: bf16_rows(args.repeats, lengths)}
    for g in groups:
        for line in rows[g]():
            print(line, flush=True)
    print(machine_line().replace("machine:", "machine at the end:"), flush=True)


if __name__ == "__main__":
    main()
