"""attnlab's Reformer against ``reformer_pytorch.LSHAttention``, side by side in one process.

    .venv/bin/python scripts/reformer_vs_peer.py                 # N=4096, about 2 minutes on a 2-core CPU
    .venv/bin/python scripts/reformer_vs_peer.py --n 8192 --causal

The peer is optional and never a dependency of attnlab; install it only to measure
(``pip install -c scripts/constraints.txt reformer_pytorch``).

Settings shared by both: B=1, H=8 (the peer takes the B*H rows as its batch), D=64,
float32, bucket size 64, 4 hashes, N // 64 buckets, shared QK (the keys are the
normalized queries), one chunk of look-back, self-attention masked unless alone. Times
are medians of calls alternated between the contenders, so a load change on the
machine hits all of them; forward runs under ``no_grad``, fwd+bwd backpropagates a fixed
random output gradient to q and v.

What differs, none of it a change in the work done per call:

* duplicates: attnlab deduplicates keys found by several rounds by default
  (``dedup=True``: exact softmax over the union). The peer's default
  (``allow_duplicate_attention=True``) does not; ``attnlab dedup=False`` is that setting,
  and ``--peer-dedup`` also times the peer's own deduplication.
* look-back: the peer's first chunk of a round looks back at the previous round's last
  chunk (wrapping around); attnlab's does not look back.
* randomness: the peer draws new rotations every call, attnlab from a fixed seed.
* the self score: -5e4 in the peer, -1e5 in attnlab (both vanish beside any other key).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from attnlab import mechanisms


def _peer_class():
    try:
        from reformer_pytorch import LSHAttention
    except ImportError:
        print("reformer_vs_peer: the peer is not installed; pip install -c scripts/constraints.txt reformer_pytorch",
              file=sys.stderr)
        raise SystemExit(2) from None
    return LSHAttention


def _ours(mech, q, v, grad: bool, g):
    q, v = q.detach().clone().requires_grad_(grad), v.detach().clone().requires_grad_(grad)

    def run():
        if not grad:
            with torch.no_grad():
                mech(q, q, v)
            return
        mech(q, q, v).backward(g)
        q.grad = v.grad = None

    return run


def _peer(mod, q, v, grad: bool, g):
    B, H, N, D = q.shape
    qk = q.reshape(B * H, N, D).detach().clone().requires_grad_(grad)  # (B*H, N, D) the peer's batch
    vv = v.reshape(B * H, N, -1).detach().clone().requires_grad_(grad)
    gg = g.reshape(B * H, N, -1)

    def run():
        if not grad:
            with torch.no_grad():
                mod(qk, vv)
            return
        mod(qk, vv)[0].backward(gg)
        qk.grad = vv.grad = None

    return run


def measure(n: int, causal: bool, reps: int, peer_dedup: bool) -> dict[str, dict[str, float]]:
    """Median seconds per call of every contender, ``{mode: {name: seconds}}``."""
    peer_cls = _peer_class()
    gen = torch.Generator().manual_seed(0)
    q, v, g = (torch.randn(1, 8, n, 64, generator=gen) for _ in range(3))
    ours = {"attnlab": mechanisms.create("reformer", bucket_size=64, n_hashes=4, causal=causal),
            "attnlab dedup=False": mechanisms.create("reformer", bucket_size=64, n_hashes=4, causal=causal,
                                                     dedup=False)}
    peers = {"reformer_pytorch": peer_cls(bucket_size=64, n_hashes=4, causal=causal).eval()}
    if peer_dedup:
        peers["reformer_pytorch dedup"] = peer_cls(bucket_size=64, n_hashes=4, causal=causal,
                                                   allow_duplicate_attention=False).eval()
    results = {}
    for mode, grad in (("fwd", False), ("fwd+bwd", True)):
        runs = {name: _ours(m, q, v, grad, g) for name, m in ours.items()}
        runs.update({name: _peer(m, q, v, grad, g) for name, m in peers.items()})
        times: dict[str, list[float]] = {name: [] for name in runs}
        for run in runs.values():  # warm-up: first-call checks, allocator
            run()
        for _ in range(reps):
            for name, run in runs.items():
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
        results[mode] = {name: statistics.median(ts) for name, ts in times.items()}
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="sequence length (a multiple of 128 for the peer)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=7, help="alternated calls per contender and mode")
    ap.add_argument("--peer-dedup", action="store_true", help="also time the peer with allow_duplicate_attention=False")
    args = ap.parse_args(argv)
    if args.n % 128:
        ap.error(f"--n must be a multiple of 128 (the peer needs N divisible by 2 x bucket size), got {args.n}")
    res = measure(args.n, args.causal, args.reps, args.peer_dedup)
    print(f"B=1 H=8 D=64 float32 N={args.n} bucket 64, 4 hashes, causal={args.causal}, "
          f"{torch.get_num_threads()} threads, medians of {args.reps} alternated calls")
    print(f"{'mode':8} {'contender':24} {'ms':>9} {'speed vs reformer_pytorch':>26}")
    for mode, times in res.items():
        base = times["reformer_pytorch"]
        for name, t in times.items():
            print(f"{mode:8} {name:24} {t * 1e3:9.1f} {base / t:25.2f}x")


if __name__ == "__main__":
    main()
