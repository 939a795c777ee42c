"""Adaptive span: one call per window of heads against one call over the widest window, timed.

    .venv/bin/python scripts/span_groups_speed.py              # the chars model's shape, 2 threads
    .venv/bin/python scripts/span_groups_speed.py --threads 1 --repeats 9

For a few span patterns of one layer (B = 12, H = 4, N = 1,024, D = 32: ``attnlab train chars
--task-opt context=1024``'s attention), times forward and backward of the mechanism with its heads
grouped by window (``group_share = 1``: always, when the windows differ) and as one call over the
widest window (``group_share = 0``), and full causal attention: the measurement behind
:meth:`~attnlab.mechanisms.AdaptiveSpan.groups_pay`'s threshold (``group_share``, 0.6). Prints
the median of ``--repeats`` calls each, after two warm-up calls, and the share of keys the groups
need (what the threshold is compared with).
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch

from attnlab import attention, masks
from attnlab.mechanisms import create

PATTERNS = ([0, 0, 0, 0], [70, 70, 70, 0], [70, 0, 0, 0], [105, 0, 0, 0], [300, 0, 0, 0], [600, 40, 0, 0])


def median_ms(fn, inputs, repeats: int) -> float:
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        torch.autograd.grad(fn().sum(), inputs)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    B, H, N, D = 12, 4, 1024, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3))
    causal = masks.causal()
    print(f"B={B} H={H} N={N} D={D}, {args.threads} threads, fwd+bwd, median of {args.repeats}")
    for spans in PATTERNS:
        span = create("adaptive-span", max_span=N, heads=H)
        with torch.no_grad():
            span.fraction.copy_(torch.tensor(spans, dtype=torch.float32) / N)
        windows = span.head_windows(N)
        keys = [N if w is None else min(N, w + span.window_multiple) for w in windows]
        timed = {}
        for share in (1.0, 0.0):
            span.group_share = share
            timed[share] = median_ms(partial(span, q, k, v, causal), (q, k, v), args.repeats)
        print(f"spans {spans} windows {windows} (keys {sum(keys) / (len(keys) * max(keys)):.2f} of the widest): "
              f"grouped {timed[1.0]:.1f} ms, one call {timed[0.0]:.1f} ms")
    print(f"full causal attention {median_ms(lambda: attention(q, k, v, mask=causal), (q, k, v), args.repeats):.1f} ms")


if __name__ == "__main__":
    main()
