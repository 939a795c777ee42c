"""The ``distributed`` suite: sequence-parallel attention (ring, Ulysses) on P processes of this machine.

Each case spawns ``P`` processes (gloo, one torch thread each; NCCL with ``--device cuda``,
one GPU per rank), gives every rank its zigzag shard of a causal ``(B, H, N, D)``
attention and runs forward + backward: a warm-up, one call whose peak memory is read
(per rank), then timed calls (at least one, at most ``repeats``, fewer once they total
``budget_s``), the ranks lined up by a barrier before each. A ``single`` case is the
reference: one process with ``T`` threads running :func:`attnlab.attention` on the whole
sequence.

A record holds ``time_s`` (median over calls of the slowest rank), ``tokens_per_s``
(``B N / time_s``), per rank: ``rank_peak_bytes``, ``rank_compute_s`` (time not blocked on
communication, median) and the ``comm_share`` (time blocked in transfers, i.e. *not* hidden
behind compute, over the call's time, averaged over ranks; from
:data:`attnlab.distributed.comm.STATS`), and ``compute_spread`` (slowest rank's compute
over the fastest's, minus one: the zigzag balance).

Shape legend: ``B`` batch, ``H`` heads, ``N`` sequence length, ``D`` head dim, ``P`` ranks.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...utils import positive_int
from ..measure import Unsupported, peak_memory
from ..suite import Case, Context, Job, RunOptions, Suite, register_suite

SUITE = "distributed"
STRATEGIES = ("ring", "ulysses", "single")
#: per profile: lengths, ranks of the sharded cases, threads of the single-process references
PROFILES = {
    "quick": {"lengths": [2048], "ranks": [2], "threads": [2]},
    "standard": {"lengths": [8192, 32768], "ranks": [1, 2, 4], "threads": [1, 2, 4]},
    "full": {"lengths": [32768, 131072], "ranks": [1, 2, 4], "threads": [1, 2, 4]},
}
#: the attention measured: batch, heads, head dim
SHAPE = {"B": 1, "H": 8, "D": 64}


@dataclass(frozen=True)
class DistributedOptions:
    """The distributed suite's own options (None: the profile's ranks and threads, :data:`SHAPE`'s sizes)."""

    ranks: tuple[int, ...] | None = None
    threads: tuple[int, ...] | None = None
    layout: str = "zigzag"
    B: int | None = None  # the shape legend
    H: int | None = None
    D: int | None = None


def _settings(opts: RunOptions) -> dict:
    prof = PROFILES[opts.profile]
    own = opts.of(DistributedSuite)
    out = {"ranks": list(own.ranks or prof["ranks"]), "threads": list(own.threads or prof["threads"]),
           "layout": own.layout, **{k: getattr(own, k) or v for k, v in SHAPE.items()}}
    for key in ("ranks", "threads"):
        if not out[key]:
            raise ValueError(f"distributed {key} must be a list of positive ints, got {out[key]!r}")
        for x in out[key]:
            positive_int(x, f"each of distributed {key}")
    for key in SHAPE:
        positive_int(out[key], f"distributed {key}")
    return out


def _lengths(opts: RunOptions) -> list[int]:
    return list(opts.lengths or PROFILES.get(opts.profile, PROFILES["quick"])["lengths"])


@dataclass(frozen=True)
class DistributedCase(Case):
    """One case of this suite: causal attention (fwd+bwd) of ``(B, H, N, D)`` by one strategy.

    Attributes:
        name: ``ring`` or ``ulysses`` on ``ranks`` processes of ``threads`` threads each, or ``single``:
            one process of ``threads`` threads on the whole sequence (the reference).
        N, B, H, D: the shape legend.
        layout: how the sequence is sharded (:class:`attnlab.distributed.SequenceLayout`).
    """

    suite: ClassVar[str] = SUITE
    kind: ClassVar[str] = "sequence_parallel"
    mask: ClassVar[str] = "causal"
    mode: ClassVar[str] = "fwd+bwd"

    name: str
    N: int
    B: int
    H: int
    D: int
    ranks: int = 1
    threads: int = 1
    layout: str = "zigzag"

    def label(self) -> str:
        return f"distributed {self.name} N={self.N} {self.ranks}x{self.threads}"


def cases(opts: RunOptions) -> list[Job]:
    """One case per (strategy, P or threads, N): ring and Ulysses on P ranks, and the single-process references."""
    st = _settings(opts)
    names = set(opts.names) if opts.names else set(STRATEGIES)
    jobs = []
    for n in _lengths(opts):
        for strategy in STRATEGIES:
            if strategy not in names:
                continue
            for count in st["threads"] if strategy == "single" else st["ranks"]:
                skip = None
                if strategy == "ulysses" and st["H"] % count:
                    skip = {"status": "unsupported", "reason": f"H={st['H']} heads not divisible by P={count}"}
                elif count > n:
                    skip = {"status": "unsupported", "reason": f"N={n} is shorter than P={count}"}
                ranks, threads = (1, count) if strategy == "single" else (count, 1)
                case = DistributedCase(name=strategy, N=n, B=st["B"], H=st["H"], D=st["D"], ranks=ranks,
                                       threads=threads, layout=st["layout"], dtype=opts.dtype, device=opts.device)
                jobs.append(Job(case, skip=skip))
    return jobs


def _inputs(case: DistributedCase, n: int, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    shape = (case.B, case.H, n, case.D)
    q, k, v, dout = (torch.randn(shape, generator=g).to(device=device, dtype=dtype) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], dout


def _timed(call, sync, stats, device: str, repeats: int, budget_s: float) -> dict:
    """Warm-up, one call for the peak, then timed calls; per call the seconds and the blocked seconds."""
    call()
    sync()
    _, peak, method = peak_memory(call, device)
    times, comms = [], []
    while len(times) < max(1, repeats):
        sync()
        if stats is not None:
            stats.reset()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        comms.append(stats.seconds if stats is not None else 0.0)
        if sum(times) > budget_s:
            break
    return {"times": times, "comms": comms, "peak": peak, "method": method}


def _rank_main(rank: int, world: int, init_file: str, backend: str, job: dict, out_dir: str) -> None:
    """One rank of a sharded case: its shard, the calls, its numbers written to ``out_dir/rank.json``.

    ``job``: the case (:meth:`DistributedCase.to_dict`) and the run's ``repeats``, ``budget_s`` and ``timeout_s``.
    """
    import torch.distributed as dist

    from ...distributed import SequenceLayout, ring_attention, ulysses_attention
    from ...distributed.comm import STATS
    from ...masks import causal

    case = DistributedCase.from_dict(job["case"])
    torch.set_num_threads(case.threads)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=max(60.0, job["timeout_s"] or 600.0)))
    try:
        lay = SequenceLayout(case.layout, world, case.N)
        (q, k, v), dout = _inputs(case, lay.shard_length(rank), rank, device)
        attend = ring_attention if case.name == "ring" else ulysses_attention

        def call():
            q.grad = k.grad = v.grad = None
            attend(q, k, v, mask=causal(), layout=lay).backward(dout)

        res = _timed(call, lambda: dist.barrier(), STATS, device, job["repeats"], job["budget_s"])
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


def _sharded(case: DistributedCase, ctx: Context) -> list[dict]:
    """Run the ranks as child interpreters (``python -m attnlab.bench.suites.distributed``) and read their numbers.

    Plain subprocesses, not multiprocessing: an isolated case already runs in a daemonic
    worker process, which multiprocessing does not let start children.
    """
    world = case.ranks
    backend = "nccl" if case.device == "cuda" else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise Unsupported(f"{world} ranks need {world} CUDA devices, this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-dist-") as tmp:
        with open(os.path.join(tmp, "spec.json"), "w") as f:
            json.dump({"case": case.to_dict(), "repeats": ctx.repeats, "budget_s": ctx.budget_s,
                       "timeout_s": ctx.timeout_s}, f)
        env = {**os.environ, "OMP_NUM_THREADS": str(case.threads)}
        procs = [subprocess.Popen([sys.executable, "-m", "attnlab.bench.suites.distributed", str(r), str(world),
                                   os.path.join(tmp, "init"), backend, tmp], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for r in range(world)]
        errors = []
        try:
            for r, p in enumerate(procs):
                _, err = p.communicate(timeout=ctx.timeout_s or 3600)
                if p.returncode:
                    errors.append(f"rank {r} exited {p.returncode}: {err.strip().splitlines()[-1] if err else ''}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if errors:
            raise RuntimeError("; ".join(errors))
        out = []
        for r in range(world):
            with open(os.path.join(tmp, f"{r}.json")) as f:
                out.append(json.load(f))
    return out


def _single(case: DistributedCase, ctx: Context) -> list[dict]:
    from ...exact import attention
    from ...masks import causal

    torch.set_num_threads(case.threads)
    device = "cuda" if case.device == "cuda" else "cpu"
    (q, k, v), dout = _inputs(case, case.N, 0, device)

    def call():
        q.grad = k.grad = v.grad = None
        attention(q, k, v, mask=causal()).backward(dout)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return [_timed(call, sync, None, device, ctx.repeats, ctx.budget_s)]


def run_case(case: DistributedCase, ctx: Context) -> dict:
    """Measure one case (see the module docstring); a sharded case spawns its ranks."""
    ranks = _single(case, ctx) if case.name == "single" else _sharded(case, ctx)
    calls = min(len(r["times"]) for r in ranks)
    slowest = [max(r["times"][i] for r in ranks) for i in range(calls)]
    compute = [statistics.median(t - c for t, c in zip(r["times"], r["comms"])) for r in ranks]
    share = statistics.mean(statistics.median(c / t for t, c in zip(r["times"], r["comms"])) for r in ranks)
    peaks = [r["peak"] for r in ranks]
    time_s = statistics.median(slowest)
    return {"time_s": time_s, "times_s": slowest,
            "peak_bytes": max(peaks) if all(p is not None for p in peaks) else None,
            "peak_method": ranks[0]["method"], "tokens_per_s": case.B * case.N / time_s,
            "rank_peak_bytes": peaks, "rank_compute_s": compute, "comm_share": share,
            "compute_spread": max(compute) / min(compute) - 1 if min(compute) > 0 else None,
            # causal: N(N+1)/2 allowed pairs per head; 2 matmuls forward and 5 backward, 2 D flops per pair each
            "flops": case.B * case.H * case.N * (case.N + 1) / 2 * 7 * 2 * case.D}


def _find(records: list[dict], name: str, n: int, ranks: int | None = None, threads: int | None = None):
    for r in records:
        st = r["settings"]
        if (r["suite"] == SUITE and r["name"] == name and r["N"] == n and r["status"] == "ok"
                and (ranks is None or st["ranks"] == ranks) and (threads is None or st["threads"] == threads)):
            return r
    return None


def verdicts(records: list[dict]) -> list[dict]:
    """Per N: the zigzag balance, the memory and the speed of 2 ranks against one process, 4 ranks' peak."""
    out = []
    gib = 1024**3
    for n in sorted({r["N"] for r in records}):
        parts = []
        for p in (2, 4):
            r = _find(records, "ring", n, ranks=p)
            if r is not None and r.get("compute_spread") is not None:
                parts.append(f"ring P={p} per-rank compute within {100 * r['compute_spread']:.1f} %, "
                             f"{100 * r['comm_share']:.0f} % of the time blocked on communication")
        single1 = _find(records, "single", n, threads=1)
        single2 = _find(records, "single", n, threads=2)
        for name in ("ring", "ulysses"):
            r2 = _find(records, name, n, ranks=2)
            if r2 is None:
                continue
            if single1 is not None and single1["peak_bytes"] and r2["peak_bytes"] is not None:
                parts.append(f"{name} P=2 per-rank peak {r2['peak_bytes'] / single1['peak_bytes']:.2f}x one process's")
            if single2 is not None:
                speed = r2["tokens_per_s"] / single2["tokens_per_s"]
                parts.append(f"{name} 2 ranks x 1 thread at {speed:.2f}x the throughput of 1 process x 2 threads")
        for name in ("ring", "ulysses"):
            r4 = _find(records, name, n, ranks=4)
            if r4 is not None and r4["peak_bytes"] is not None:
                parts.append(f"{name} P=4 peaks at {r4['peak_bytes'] / gib:.2f} GiB per rank")
        if not parts:
            continue
        out.append({"suite": SUITE, "N": n, "mask": "causal", "mode": "fwd+bwd", "fastest": None, "frugal": None,
                    "text": f"sequence parallelism at N={n:,} (causal, fwd+bwd): " + "; ".join(parts) + "."})
    return out


def rows(records: list[dict], width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the distributed table (one row per case of this suite among ``records``; its status
    column at most ``width`` characters, default 60)."""
    head = ["strategy", "N", "ranks x threads", "seconds", "tokens/s", "peak MB per rank", "comm share",
            "compute spread", "status"]
    out = []
    for c in records:
        if c["suite"] != SUITE:
            continue
        st, ok = c["settings"], c["status"] == "ok"
        peaks = c.get("rank_peak_bytes") or []
        out.append([c["name"], f"{c['N']:,}", f"{st['ranks']} x {st['threads']}",
                    f"{c['time_s']:.3f}" if ok else "", f"{c['tokens_per_s']:,.0f}" if ok else "",
                    " / ".join(f"{p / 2**20:,.0f}" for p in peaks if p is not None) if ok else "",
                    f"{100 * c['comm_share']:.0f} %" if ok and c.get("comm_share") is not None else "",
                    f"{100 * c['compute_spread']:.1f} %" if ok and c.get("compute_spread") is not None else "",
                    c["status"] if ok else f"{c['status']}: {c.get('reason') or ''}"[:width or 60]])
    return head, out


_NUMS = {"type": "array", "items": {"type": ["number", "null"]}}


@register_suite
class DistributedSuite(Suite):
    """Ring and Ulysses attention on 1, 2 and 4 processes against one process (memory, speed, communication)."""

    name = SUITE
    summary = "sequence-parallel attention (ring, Ulysses) on P gloo processes: per-rank memory, speed, comm share"
    title = "Sequence parallelism"
    default = False  # it spawns processes and takes minutes at the full lengths: asked for by name
    order = 60
    Options = DistributedOptions
    kinds = ("sequence_parallel",)
    modes = ("fwd+bwd",)
    result_keys = ("tokens_per_s", "rank_peak_bytes", "rank_compute_s", "comm_share", "compute_spread")
    record_defaults = {"tokens_per_s": None, "rank_peak_bytes": None, "rank_compute_s": None, "comm_share": None,
                       "compute_spread": None}
    case_properties = {
        "rank_peak_bytes": {**_NUMS, "description": "distributed: each rank's peak memory beyond its inputs"},
        "rank_compute_s": {**_NUMS, "description": "distributed: each rank's seconds not blocked on communication"},
        "comm_share": {"type": ["number", "null"], "minimum": 0,
                       "description": "distributed: share of the call's time blocked in transfers (mean over ranks)"},
        "compute_spread": {"type": ["number", "null"],
                           "description": "distributed: slowest rank's compute / fastest's - 1"},
    }
    settings_properties = {"distributed": {"type": "object", "description": "ranks, threads and shape of the "
                                                                            "distributed suite"}}

    def check(self, opts: RunOptions) -> None:
        _settings(opts)

    def known_names(self) -> set[str]:
        return set(STRATEGIES)

    def cases(self, opts: RunOptions) -> list[Job]:
        return cases(opts)

    run_case = staticmethod(run_case)  # the module's: the suite adds nothing

    def settings(self, opts: RunOptions) -> dict:
        return {"distributed": _settings(opts)}

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return verdicts(records)

    rows = staticmethod(rows)

    def about(self, records: list[dict]) -> str:
        return ("Causal attention (fwd+bwd) with the sequence sharded over P processes of this machine "
                "(gloo, one thread each; zigzag layout), by ring attention (key/value blocks passed around "
                "a ring) and Ulysses (all-to-all to head shards), against one process running "
                "attnlab.attention with T threads. Seconds: the slowest rank, median over calls; peak: each "
                "rank's memory beyond its inputs; comm share: time blocked on transfers not hidden behind "
                "compute; compute spread: how much longer the busiest rank computes than the idlest.")

    def tiny_options(self) -> dict | None:
        return {"lengths": [64], "names": ["ring", "single"],
                "suite_options": {SUITE: {"ranks": (2,), "threads": (1,), "H": 2, "D": 8}}}



def _main(argv: list[str]) -> None:
    """``python -m attnlab.bench.suites.distributed RANK WORLD INIT_FILE BACKEND DIR``: one rank of the case in DIR/spec.json."""
    rank, world, init_file, backend, out_dir = argv
    with open(os.path.join(out_dir, "spec.json")) as f:
        job = json.load(f)
    _rank_main(int(rank), int(world), init_file, backend, job, out_dir)


if __name__ == "__main__":
    _main(sys.argv[1:])

__all__ = ["PROFILES", "STRATEGIES", "SUITE", "DistributedCase", "DistributedOptions", "DistributedSuite", "cases", "rows", "run_case", "verdicts"]
