"""FlexAttention on CPU (forward, compiled once per shape) against sdpa and chunked: median of 5 calls each.

Run: python scripts/flex_cpu_speed.py  (prints one line per N and mask, times and the flex/sdpa ratio)
"""
import statistics
import time

import torch

import attnlab
from attnlab import masks

torch.manual_seed(0)
for n in (1024, 4096):
    q, k, v = (torch.randn(1, 8, n, 64) for _ in range(3))
    for mk in [None, masks.causal(), masks.sliding_window(256)]:
        res = {}
        for b in ("flex", "sdpa", "chunked"):
            try:
                with torch.no_grad():
                    attnlab.attention(q, k, v, mask=mk, backend=b)
                    ts = []
                    for _ in range(5):
                        t = time.perf_counter()
                        attnlab.attention(q, k, v, mask=mk, backend=b)
                        ts.append(time.perf_counter() - t)
                res[b] = statistics.median(ts)
            except Exception as e:
                res[b] = str(e)[:60]
        print(n, mk, {b: (f"{t*1e3:.1f}ms" if isinstance(t, float) else t) for b, t in res.items()},
              "flex/sdpa", res["flex"] / res["sdpa"] if isinstance(res["flex"], float) and isinstance(res["sdpa"], float) else None)
