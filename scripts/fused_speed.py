"""The fused ``chunked`` path against SDPA and against the plain tiles, in one process.

    .venv/bin/python scripts/fused_speed.py            # a minute or two on a 2-core CPU (--repeats 3)
    .venv/bin/python scripts/fused_speed.py --big      # + fwd+bwd peak memory at N=65,536 (minutes more)
    .venv/bin/python scripts/fused_speed.py --big-only --threads 1   # only that case

B=1, H=8, D=64, float32. Times are medians of calls alternated between the contenders
(so a load change hits both); "plain" is the plain-torch tile loop (the fused op turned
off with ``attnlab.exact.tiles.set_fused_enabled(False)``), i.e. ``chunked`` as it
was before the fused path. Errors are max|out - ref| / max|ref| against float64 exact
attention. Every figure printed is measured by this run.
"""

from __future__ import annotations

import argparse
import time

import torch

import attnlab
from attnlab import masks
from attnlab.bench.measure import alternate, peak_memory
from attnlab.exact import tiles


def _inputs(n: int, grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 8, n, 64, generator=g).requires_grad_(grad) for _ in range(3)]


def _op(backend: str, n: int, mask, grad: bool, fused: bool = True):
    q, k, v = _inputs(n, grad)

    def run():
        tiles.set_fused_enabled(fused)
        try:
            out = attnlab.attention(q, k, v, mask=mask, backend=backend)
            if grad:
                out.sum().backward()
                q.grad = k.grad = v.grad = None
        finally:
            tiles.set_fused_enabled(True)

    return run



def speed_rows(repeats: int) -> list[str]:
    out = []
    for n in (4096, 16384):
        for label, mask in (("no mask", None), ("causal", masks.causal())):
            for grad in (False, True):
                if n == 16384 and grad and mask is None:
                    continue  # ~10 s a call; the causal row covers fwd+bwd at this N
                r = alternate({"chunked": _op("chunked", n, mask, grad), "sdpa": _op("sdpa", n, mask, grad)},
                              repeats if n == 4096 else max(1, repeats // 2))
                mode = "fwd+bwd" if grad else "fwd"
                out.append(f"chunked / sdpa speed, {label}, {mode}, N={n}: {r['sdpa'] / r['chunked']:.2f} "
                           f"(chunked {r['chunked'] * 1e3:,.0f} ms, sdpa {r['sdpa'] * 1e3:,.0f} ms)")
    return out


def window_and_document(repeats: int) -> list[str]:
    n = 16384
    win = masks.sliding_window(256)
    r = alternate({"fused": _op("chunked", n, win, True), "plain": _op("chunked", n, win, True, fused=False)},
                  max(1, repeats // 2))
    out = [f"sliding_window(256), fwd+bwd, N={n}: fused / plain chunked speed {r['plain'] / r['fused']:.2f} "
           f"(fused {r['fused'] * 1e3:,.0f} ms, plain {r['plain'] * 1e3:,.0f} ms)"]
    doc = masks.document(torch.arange(n) // (n // 8))
    dense = doc.dense(n, n)  # what SDPA needs: the N x N bool mask
    q, k, v = _inputs(n, False)
    r = alternate({"chunked": lambda: attnlab.attention(q, k, v, mask=doc, backend="chunked"),
                   "sdpa_dense": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)},
                  max(1, repeats // 2))
    out.append(f"document mask (8 documents), fwd, N={n}: chunked / SDPA-with-the-dense-mask speed "
               f"{r['sdpa_dense'] / r['chunked']:.2f} (chunked {r['chunked'] * 1e3:,.0f} ms, "
               f"sdpa {r['sdpa_dense'] * 1e3:,.0f} ms)")
    return out


def errors() -> list[str]:
    n = 1024
    q, k, v = _inputs(n, False, seed=3)
    kinds = {"none": None, "causal": masks.causal(), "sliding_window": masks.sliding_window(100, 20),
             "padding": masks.padding([700]), "document": masks.document(torch.arange(n) // 300),
             "prefix_lm": masks.prefix_lm(200), "global": masks.sliding_window(50) | masks.global_tokens([0, 511])}
    out = []
    for kind, mask in kinds.items():
        ref = attnlab.attention(q.double(), k.double(), v.double(), mask=mask, backend="math")
        scale = float(ref.abs().max())
        errs = {}
        for fused in (True, False):
            tiles.set_fused_enabled(fused)
            try:
                got = attnlab.attention(q, k, v, mask=mask, backend="chunked")
            finally:
                tiles.set_fused_enabled(True)
            errs[fused] = float((got.double() - ref).abs().max()) / scale
        out.append(f"error vs float64, {kind}: fused {errs[True]:.1e}, plain {errs[False]:.1e}")
    return out


def big_memory() -> list[str]:
    n = 65536
    q, k, v = _inputs(n, True)

    def run():
        attnlab.attention(q, k, v, mask=masks.causal(), backend="chunked").sum().backward()

    t = time.perf_counter()
    _, peak, method = peak_memory(run, "cpu")
    return [f"chunked fwd+bwd, causal, N={n}: peak {peak / 2**30:.2f} GiB beyond the inputs ({method}), "
            f"{time.perf_counter() - t:,.0f} s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big", action="store_true", help="also the N=65,536 memory case")
    ap.add_argument("--big-only", action="store_true", help="only the N=65,536 memory case")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.big_only:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        for line in big_memory():
            print(line, flush=True)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fused op: "
          f"{tiles.fused_status() or 'in use'}")
    for line in speed_rows(args.repeats) + window_and_document(args.repeats) + errors() + (
            big_memory() if args.big else []):
        print(line, flush=True)


if __name__ == "__main__":
    main()
