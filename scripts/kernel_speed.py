"""Measure exact attention on this machine: the figures of the benchmarks page (ratios against SDPA, memory, error).

    .venv/bin/python scripts/kernel_speed.py            # all cases (about 10 minutes on 2 cores)
    .venv/bin/python scripts/kernel_speed.py --quick    # the cheap cases only

Every case runs in a fresh Python process (peak memory = VmHWM - VmRSS around the call,
via attnlab.bench.measure.measure_op); the parent prints a table of ratios. B=1, H=8,
D=64, float32 unless a case says otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = {
    # name: (description, quick?)
    "ceiling": ("fp32 matmul GFLOP/s (2048^3)", True),
    "sdpa_none_4096": ("sdpa fwd, no mask, N=4096", True),
    "auto_none_4096": ("auto fwd, no mask, N=4096", True),
    "sdpa_causal_4096": ("sdpa fwd, causal, N=4096", True),
    "auto_causal_4096": ("auto fwd, causal, N=4096", True),
    "interleaved_none_4096": ("auto and sdpa fwd alternated in one process, no mask, N=4096", True),
    "interleaved_causal_4096": ("auto and sdpa fwd alternated in one process, causal, N=4096", True),
    "chunked_none_4096": ("chunked fwd, no mask, N=4096", True),
    "chunked_causal_4096": ("chunked fwd, causal, N=4096", True),
    "chunked_none_8192": ("chunked fwd, no mask, N=8192", False),
    "chunked_causal_8192": ("chunked fwd, causal, N=8192", False),
    "math_train_8192": ("math fwd+bwd, causal, N=8192", False),
    "chunked_train_8192": ("chunked fwd+bwd, causal, N=8192", False),
    "chunked_train_65536": ("chunked fwd+bwd, causal, N=65536", False),
    "sdpa_densewin_16384": ("sdpa fwd, sliding_window(256) as a dense bool mask, N=16384", False),
    "auto_win_16384": ("auto fwd, sliding_window(256), N=16384", False),
    "mha_ours_4096": ("attnlab MultiHeadAttention(512, 8) fwd, N=4096", True),
    "mha_torch_4096": ("torch.nn.MultiheadAttention(512, 8) fwd, N=4096", True),
}


def run_case(name: str) -> dict:
    import torch

    import attnlab
    from attnlab import masks
    from attnlab.bench.measure import measure_op

    torch.manual_seed(0)
    if name == "ceiling":
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        r = measure_op(lambda: a @ b, "cpu", repeats=5, budget_s=3)
        r["gflops"] = 2 * 2048**3 / r["time_s"] / 1e9
        return r
    if name.startswith("mha_"):
        n = int(name.rsplit("_", 1)[1])
        x = torch.randn(1, n, 512)
        theirs = torch.nn.MultiheadAttention(512, 8, batch_first=True)
        if "ours" in name:
            from attnlab.layers import MultiHeadAttention

            layer = MultiHeadAttention.from_torch(theirs)
            op = lambda: layer(x)  # noqa: E731
        else:
            op = lambda: theirs(x, x, x)  # noqa: E731 - need_weights=True is its default
        with torch.no_grad():
            return measure_op(op, "cpu", repeats=3, budget_s=20)
    if name.startswith("interleaved_"):
        # separate processes differ by +-10% on this machine; alternate the two calls
        # in one process and compare medians so the ratio measures dispatch, not noise
        import statistics
        import time

        _, kind, n = name.split("_")
        n = int(n)
        q, k, v = (torch.randn(1, 8, n, 64) for _ in range(3))
        mask = masks.causal() if kind == "causal" else None
        times: dict[str, list[float]] = {"auto": [], "sdpa": []}
        with torch.no_grad():
            for i in range(12):
                for backend in ("auto", "sdpa") if i % 2 else ("sdpa", "auto"):
                    t0 = time.perf_counter()
                    attnlab.attention(q, k, v, mask=mask, backend=backend)
                    if i >= 2:  # warm-up
                        times[backend].append(time.perf_counter() - t0)
        auto, sdpa = statistics.median(times["auto"]), statistics.median(times["sdpa"])
        return {"time_s": auto, "sdpa_time_s": sdpa, "speed_ratio": sdpa / auto}
    backend, kind, n = name.split("_")
    n = int(n)
    train = kind == "train"
    mask = {"none": None, "causal": masks.causal(), "train": masks.causal(), "win": masks.sliding_window(256)}.get(kind)
    if kind == "densewin":
        mask = masks.sliding_window(256).dense(n, n)  # (1, 1, N, N) bool
    q, k, v = (torch.randn(1, 8, n, 64, requires_grad=train) for _ in range(3))

    def op():
        out = attnlab.attention(q, k, v, mask=mask, backend=backend)
        if train:
            out.sum().backward()

    if train:
        return measure_op(op, "cpu", repeats=1, budget_s=1)
    with torch.no_grad():
        r = measure_op(op, "cpu", repeats=3, budget_s=20)
    pairs = {"none": n * n, "causal": n * (n + 1) // 2}.get(kind)
    if pairs:
        r["gflops"] = 4 * 64 * 8 * pairs / r["time_s"] / 1e9
    if backend == "auto":
        r["chosen"] = attnlab.choose_backend(q, k, v, mask=mask)
    return r


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="only the cheap cases")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return 0
    res = {}
    for name, (desc, quick) in CASES.items():
        if args.quick and not quick:
            continue
        proc = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True)
        if proc.returncode != 0:
            res[name] = {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
        else:
            res[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = res[name]
        mib = f"{r['peak_bytes'] / 2**20:9.1f} MiB" if r.get("peak_bytes") is not None else "        -    "
        extra = f"  {r['gflops']:6.1f} GFLOP/s" if "gflops" in r else ""
        extra += f"  (auto chose {r['chosen']})" if "chosen" in r else ""
        t = f"{r['time_s'] * 1000:10.1f} ms" if "time_s" in r else f"  {r.get('error')}"
        print(f"{desc:<62} {t} {mib}{extra}", flush=True)
    ceil = res.get("ceiling", {}).get("gflops")

    def ratio(a, b, key="time_s"):
        ra, rb = res.get(a, {}), res.get(b, {})
        if key in ra and key in rb and ra[key] and rb[key]:
            return ra[key] / rb[key]
        return None

    print("\nratios")
    lines = [
        ("auto / sdpa speed, no mask, N=4096, alternated", res.get("interleaved_none_4096", {}).get("speed_ratio")),
        ("auto / sdpa speed, causal, N=4096, alternated", res.get("interleaved_causal_4096", {}).get("speed_ratio")),
    ]
    for n in (4096, 8192):
        for kind in ("none", "causal"):
            g = res.get(f"chunked_{kind}_{n}", {}).get("gflops")
            lines.append((f"chunked fwd {kind} N={n}: fraction of matmul ceiling", g / ceil if g and ceil else None))
    lines += [
        ("math / chunked fwd+bwd peak memory, N=8192", ratio("math_train_8192", "chunked_train_8192", "peak_bytes")),
        ("chunked fwd+bwd peak at N=65536 in GiB",
         res.get("chunked_train_65536", {}).get("peak_bytes", 0) / 2**30 if "peak_bytes" in res.get("chunked_train_65536", {}) else None),
        ("sdpa-dense-mask / auto speed, sliding_window(256), N=16384", ratio("sdpa_densewin_16384", "auto_win_16384")),
        ("torch MHA / attnlab MHA speed, N=4096", ratio("mha_torch_4096", "mha_ours_4096")),
        ("torch MHA / attnlab MHA peak memory, N=4096", ratio("mha_torch_4096", "mha_ours_4096", "peak_bytes")),
    ]
    for label, val in lines:
        print(f"  {label:<70} {'-' if val is None else f'{val:.2f}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
