"""``run(suites, options)``: measure the ceilings, run the suites' cases, write results and reports.

The runner names no suite: it asks each chosen :class:`~attnlab.bench.suite.Suite` for its
typed cases (:class:`~attnlab.bench.suite.Case`, each alone or in a :class:`~attnlab.bench.suite.Job`),
turns each into its spec (:meth:`~attnlab.bench.suite.Job.spec`: the dict its executors and journal
read, the case under ``case``), runs every spec (in its own process unless ``isolate=False``), journals each
finished case (``cases.jsonl``, so ``resume`` continues a killed run), lets each chosen
suite derive its figures from its own records, collects the verdicts, and writes
``results.json`` (checked against :mod:`.schema`), ``report.md``, ``report.html`` and the
plots.

Lanes. With ``jobs > 1`` the cases of suites that may run side by side
(:attr:`~attnlab.bench.suite.Suite.parallel`: they train models, they do not time kernels)
run in that many lanes at once, each a child process of its own; a case of any other suite
runs alone, once the lanes are idle. A case may name others it ``needs`` (by ``id``): it
starts once they finished, and gets their records (:attr:`~attnlab.bench.suite.Context.needed`); a needed case that
did not end ``ok`` makes it ``skipped``, with the reason. A case that would run the very kernel
of another (``auto`` choosing ``native``) names it in ``same_as`` (``{"id": ..., "result": {...}}``):
it is not run again, and its record is that case's measurement, with its own ``result`` fields
and a note saying whose time it is. Among the cases that may start, those
with the higher ``priority`` (a number in the spec, default 0: the suite's guess of the longest)
start first, so no lane idles at the end behind one long case. Records keep the order of the specs
whatever the order in which the lanes finished, so a resumed or parallel run writes the same
results as a serial one.

Executors. ``executor="local"`` runs the cases on this machine (:class:`~attnlab.bench.isolate.Runner`);
``executor="ray"`` runs each as a task on a Ray cluster (:class:`~attnlab.bench.executor_ray.RayRunner`,
imported only then), with one lane per case: the cluster queues them. Either way only this process
writes the journal. A case the executor reports ``lost`` (its machine went away) is shown in the
results but not journaled, nor are the cases it made skip, so ``--resume`` runs them again. A run on
a cluster reads and writes no result cache: its cases ran on other machines' CPUs.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from .cache import ResultCache
from .isolate import Runner
from .measure import machine_info
from .progress import BenchProgress
from .report import make_plots, terminal_summary, write_reports
from .schema import SCHEMA_VERSION
from .suite import BASE_RESULT_KEYS, RECORD_KEYS, Job, RunOptions, Suite, as_job, split_names
from .suites import default_suite_names, get_suite, suite_names, validate

#: repeats, time budget and case timeout of each profile; the lengths and sizes per profile are the suites' own
PROFILE_TIMING: dict[str, dict] = {
    "quick": {"repeats": 3, "budget_s": 1.0, "timeout_s": 120.0},
    "standard": {"repeats": 3, "budget_s": 1.0, "timeout_s": 120.0},
    "full": {"repeats": 5, "budget_s": 3.0, "timeout_s": 600.0},
}

#: keys of a case record copied from the spec (what its typed case says, :meth:`~attnlab.bench.suite.Case.record`)
_SPEC_KEYS = RECORD_KEYS


def _record(suite: Suite, spec: dict, res: dict, ceiling: float | None) -> dict:
    rec = {k: spec[k] for k in _SPEC_KEYS}
    rec["notes"] = list(spec.get("notes") or [])
    if res.get("timed_as"):
        rec["notes"].append(f"the kernel of {res['timed_as']}, timed once there")
    rec["status"] = res.get("status", "error")
    rec["reason"] = res.get("reason")
    for k in (*BASE_RESULT_KEYS, *suite.result_keys):
        if k in res:
            rec[k] = res[k]
    for k in ("time_s", "peak_bytes", "flops", "error"):
        rec.setdefault(k, None)
    rec.setdefault("times_s", [])
    rec.setdefault("wall_s", 0.0)
    for k, v in suite.record_defaults.items():
        rec.setdefault(k, v)
    for k in ("time_s", "flops", "error"):  # never store NaN/inf: a non-finite figure is an error
        if rec[k] is not None and not math.isfinite(rec[k]):
            rec["notes"].append(f"{k} was {rec[k]!r}")
            rec[k] = None
            if k == "error":
                rec["status"], rec["reason"] = "error", "output is not finite"
    ok = rec["status"] == "ok" and rec["time_s"] and rec["flops"]
    rec["gflops"] = rec["flops"] / rec["time_s"] / 1e9 if ok else None
    rec["frac_of_ceiling"] = rec["gflops"] / ceiling if rec["gflops"] and ceiling else None
    return rec


def _same_as(spec: dict) -> dict:
    """The result of a case whose kernel another case timed: that case's measurement, with this one's own fields."""
    same = spec["same_as"]
    rec = spec["needed"][same["id"]]
    res = {k: v for k, v in rec.items() if k not in (*_SPEC_KEYS, "notes", "gflops", "frac_of_ceiling")}
    res.update(same.get("result") or {})
    res["timed_as"] = same["id"]
    return res


def case_key(spec: dict) -> str:
    """A case's identity in the journal: everything that decides what it measures."""
    ident = {k: spec.get(k) for k in (*_SPEC_KEYS, "repeats", "budget_s", "skip", "same_as")}
    return json.dumps(ident, sort_keys=True, default=str)


class Journal:
    """``cases.jsonl``: one line per finished case, so a killed run resumes where it stopped.

    Args:
        path: the journal file.
        resume: read the finished cases already there; else start the file afresh.
    """

    def __init__(self, path: str, resume: bool):
        self.path = path
        self.done: dict[str, dict] = {}
        self._lock = threading.Lock()
        if resume and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:  # a line cut off by the kill: that case runs again
                        continue
                    self.done[row["key"]] = row["record"]
        else:
            open(path, "w").close()

    def add(self, key: str, record: dict) -> None:
        """Append one finished case (flushed and synced before the call returns; safe from several lanes)."""
        with self._lock:
            with open(self.path, "a") as f:
                f.write(json.dumps({"key": key, "record": record}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.done[key] = record


def _resolve(suites: str | Sequence[str] | None, options: RunOptions | None) -> tuple[list[Suite], RunOptions]:
    """The chosen suites (checked against the registry and each other's options) and the run's options."""
    opts = options if options is not None else RunOptions()
    if not isinstance(opts, RunOptions):
        raise ValueError(f"options must be a RunOptions, got {type(opts).__name__}")
    names = list(dict.fromkeys(split_names(suites, "suites") or default_suite_names()))
    known = suite_names()
    bad = [s for s in names if s not in known]
    if not names or bad:
        raise ValueError(f"suites must be among {list(known)}, got {names!r}")
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {opts.device!r} requested but torch.cuda.is_available() is False")
    bad = sorted(set(opts.suite_options) - set(known))
    if bad:
        raise ValueError(f"suite_options keys must be suite names among {list(known)}, got {bad}")
    chosen = [get_suite(s) for s in names]
    if opts.names is not None:
        every = set().union(*(s.known_names() for s in chosen))
        unknown = [x for x in opts.names if x not in every]
        if unknown:
            raise ValueError(f"names must be among {sorted(every)} (what the chosen suites measure), got {unknown}")
    timing = PROFILE_TIMING[opts.profile]
    opts = opts.with_(repeats=opts.repeats or timing["repeats"],
                      budget_s=opts.budget_s if opts.budget_s is not None else timing["budget_s"])
    for suite in chosen:
        suite.check(opts)
    return chosen, opts


def _jobs(suite: Suite, opts: RunOptions) -> list[Job]:
    """``suite``'s cases as jobs, each checked to be a case of that suite."""
    jobs = [as_job(item) for item in suite.cases(opts)]
    for job in jobs:
        if job.case.suite != suite.name:
            raise ValueError(f"suite {suite.name!r} made a case of suite {job.case.suite!r}: "
                             f"{type(job.case).__name__}.suite must be {suite.name!r}")
    return jobs


def _measure_ceilings(runner: Runner, opts: RunOptions, notes: list[str]) -> dict:
    """The machine's matmul GFLOP/s and copy GB/s (or why they are missing, noted)."""
    res = runner({"suite": "ceilings", "device": opts.device, "dtypes": [opts.dtype], "size": opts.ceiling_size,
                  "copy_mb": opts.copy_mb, "budget_s": min(opts.budget_s, 1.0)})
    if res.get("status") == "ok":
        return res["ceilings"]
    notes.append(f"ceilings not measured: {res.get('reason')}")
    return {"matmul_gflops": {}, "copy_gbps": None, "status": res.get("status", "error"), "reason": res.get("reason")}


class _NoCache:
    """The result cache of a run on a cluster: nothing reused, nothing kept (the cache is per CPU model)."""

    def get(self, key: str) -> None:
        return None

    def put(self, key: str, record: dict) -> None:
        pass

    def describe(self) -> str:
        return "no result cache (executor ray: the cases ran on the cluster's CPUs)"


def _make_runner(opts: RunOptions):
    """The executor of ``opts``: a local :class:`Runner`, or a :class:`~.executor_ray.RayRunner` (ImportError
    naming the pip line when ray is missing)."""
    timeout_s = opts.timeout_s or PROFILE_TIMING[opts.profile]["timeout_s"]
    if opts.executor == "ray":
        from .executor_ray import RayRunner

        return RayRunner(address=opts.ray_address, isolate=opts.isolate, timeout_s=timeout_s)
    return Runner(isolate=opts.isolate, timeout_s=timeout_s)


def reusable(specs: list[dict], cache: ResultCache) -> dict[int, dict]:
    """The cached records the run may reuse, by spec index.

    Only cases of suites whose :attr:`~attnlab.bench.suite.Suite.cached` is set. A case that
    another case needs (exact's run, whose checkpoints the swap-ins start from) is reused only
    when every case that needs it is reused too: else it runs, so its files are there.
    """
    found = {i: rec for i, s in enumerate(specs)
             if get_suite(s["suite"]).cached and not s.get("skip") and (rec := cache.get(case_key(s))) is not None}
    by_id = {s["id"]: i for i, s in enumerate(specs) if s.get("id")}
    changed = True
    while changed:
        changed = False
        for i, s in enumerate(specs):
            if i in found:
                continue
            for need in s.get("needs") or []:
                j = by_id.get(need)
                if j in found:
                    del found[j]
                    changed = True
    return found


class _Schedule:
    """Runs the specs in lanes (see the module docstring); :meth:`run` returns their records in spec order."""

    def __init__(self, specs: list[dict], runner: Runner, journal: Journal, bar: BenchProgress, opts: RunOptions,
                 ceiling: float | None, cache: ResultCache):
        self.specs = [{**s, "repeats": opts.repeats, "budget_s": opts.budget_s} for s in specs]
        self.runner, self.journal, self.bar, self.ceiling, self.cache = runner, journal, bar, ceiling, cache
        plan = getattr(runner, "plan", None)  # an executor that wants to see the run first (groups, artifacts)
        if plan is not None:
            plan(self.specs)
        self.jobs = getattr(runner, "lanes", None) or opts.jobs
        self.lost: set[int] = set()  # cases whose machine went away: not journaled
        self.records: list[dict | None] = [None] * len(self.specs)
        self.by_id = {s["id"]: i for i, s in enumerate(self.specs) if s.get("id")}
        self.cached = reusable(self.specs, cache)

    def _needed(self, i: int) -> tuple[bool, dict | None]:
        """(ready, skip): whether spec ``i``'s needs (its ``same_as`` included) have finished, and the skip result if
        one failed."""
        found = {}
        same = (self.specs[i].get("same_as") or {}).get("id")
        for need in [*(self.specs[i].get("needs") or []), *([same] if same else [])]:
            j = self.by_id.get(need)
            if j is None:
                return True, {"status": "skipped", "reason": f"needs case {need!r}, which this run does not have"}
            rec = self.records[j]
            if rec is None:
                return False, None
            if rec["status"] != "ok":
                return True, {"status": "skipped", "reason": f"needs {need}, which ended {rec['status']}: "
                                                             f"{rec.get('reason') or ''}".rstrip(": "),
                              "lost": j in self.lost}
            found[need] = rec
        self.specs[i]["needed"] = found
        return True, None

    def _one(self, i: int, skip: dict | None) -> None:
        self._run_one(i, skip)
        finished = getattr(self.runner, "finished", None)  # e.g. the Ray executor frees a finished group's node
        if finished is not None and self.records[i] is not None:
            finished(self.specs[i])

    def _run_one(self, i: int, skip: dict | None) -> None:
        spec = self.specs[i]
        suite = get_suite(spec["suite"])
        key = case_key(spec)
        if key in self.journal.done:
            self.records[i] = self.journal.done[key]
            self.bar.step(suite.name)
            return
        if i in self.cached:
            rec = self.cached[i]
            self.journal.add(key, rec)
            self.records[i] = rec
            self.bar.step(suite.name)
            return
        self.bar.start(suite.name, spec["case"].label())
        t_case = time.perf_counter()
        if skip or spec.get("skip"):
            res = dict(skip or spec["skip"])
        elif spec.get("same_as"):
            res = _same_as(spec)
        else:
            res = self.runner(spec)
        if getattr(self.runner, "stopped", False):
            return  # interrupted: a killed case is not a result (--resume runs it again)
        rec = _record(suite, spec, res, self.ceiling)
        if res.get("lost"):  # not a result: --resume runs it again
            self.lost.add(i)
        else:
            self.journal.add(key, rec)
            if suite.cached:
                self.cache.put(key, rec)
        self.records[i] = rec
        self.bar.step(suite.name, time.perf_counter() - t_case)

    def run(self) -> list[dict]:
        pending = list(range(len(self.specs)))
        running: dict[Future, int] = {}
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            while pending or running:
                started = self._start_ready(pending, running, pool)
                if running and not started:
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for fut in done:
                        running.pop(fut)
                        fut.result()  # a bug in the runner itself: raise it
                elif not running and not started and pending:  # pragma: no cover - needs that never come
                    raise RuntimeError(f"cases wait on needs that never finish: {[self.specs[i]['id'] for i in pending]}")
        except KeyboardInterrupt:
            # Ctrl-C: stop the cases in flight now rather than wait for them; the journal keeps every
            # finished case, so --resume goes on from here
            stop = getattr(self.runner, "stop", None)
            if stop is not None:
                stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [r for r in self.records if r is not None]

    def _start_ready(self, pending: list[int], running: dict, pool: ThreadPoolExecutor) -> bool:
        """Start every pending spec that may start now (in spec order, higher ``priority`` first among the parallel
        suites' cases); returns whether one started."""
        started = False
        lanes = [i for i in pending if get_suite(self.specs[i]["suite"]).parallel]
        first = iter(sorted(lanes, key=lambda i: -float(self.specs[i].get("priority") or 0)))
        # the parallel suites' cases swap places among themselves; every other case keeps its own
        order = [next(first) if get_suite(self.specs[i]["suite"]).parallel else i for i in pending]
        for i in order:
            parallel = get_suite(self.specs[i]["suite"]).parallel and self.jobs > 1
            if len(running) >= self.jobs or (running and not parallel):
                break
            ready, skip = self._needed(i)
            if not ready:
                if not parallel:
                    break  # a serial case keeps its place: nothing after it jumps ahead
                continue
            pending.remove(i)
            running[pool.submit(self._one, i, skip)] = i
            started = True
            if not parallel:
                break  # it runs alone
        return started


def run(suites: str | Sequence[str] | None = None, options: RunOptions | None = None) -> dict:
    """Run benchmark suites and write ``results.json``, ``report.md``, ``report.html`` and plots.

    Args:
        suites: suite names (the registered ones; see :func:`attnlab.bench.suites.suites`) as a list
            or comma-separated string; default: every suite whose ``default`` is set.
        options: the run's :class:`~attnlab.bench.suite.RunOptions` (default: a quick run into
            ``bench-out/``); each suite's own options go in ``options.suite_options[name]``.

    Returns:
        The results dict written to ``results.json`` (see :mod:`attnlab.bench.schema`).

    Raises:
        ValueError: naming the option, for unknown suites or names, or options a suite rejects.
    """
    chosen, opts = _resolve(suites, options)
    os.makedirs(opts.out_dir, exist_ok=True)
    t_start = time.perf_counter()
    created = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    runner = _make_runner(opts)
    notes: list[str] = []
    specs: list[dict] = []
    lengths_by_suite: dict[str, list[int]] = {}
    extra_settings: dict = {}
    for suite in chosen:
        jobs = _jobs(suite, opts)
        lengths_by_suite[suite.name] = suite.lengths(opts, [j.case for j in jobs])
        extra_settings.update(suite.settings(opts))
        specs += [j.spec() for j in jobs]
    bar = BenchProgress({s.name: sum(sp["suite"] == s.name for sp in specs) for s in chosen}, enabled=opts.progress)
    try:
        ceils = _measure_ceilings(runner, opts, notes)
        journal = Journal(os.path.join(opts.out_dir, "cases.jsonl"), resume=opts.resume)
        if journal.done:
            notes.append(f"resumed: {len(journal.done)} finished case(s) read from {journal.path}")
        cache = ResultCache(opts.cache_dir, fresh=opts.fresh) if opts.executor == "local" else _NoCache()
        schedule = _Schedule(specs, runner, journal, bar, opts, ceils["matmul_gflops"].get(opts.dtype), cache)
        if any(get_suite(s["suite"]).cached for s in specs):
            notes.append(f"{cache.describe()}: {len(schedule.cached)} case(s) reused")
        records = schedule.run()
    finally:
        close = getattr(runner, "close", None)
        if close is not None:
            close()
    bar.close()
    notes += _executor_notes(records, schedule)
    settings = {"suites": [s.name for s in chosen], "profile": opts.profile, "device": opts.device,
                "dtype": opts.dtype, "lengths": lengths_by_suite, "timeout_s": runner.timeout_s,
                "repeats": opts.repeats, "budget_s": opts.budget_s, "isolate": bool(opts.isolate), "jobs": opts.jobs,
                "executor": opts.executor, "names": list(opts.names) if opts.names is not None else None,
                **extra_settings}
    results = {"schema_version": SCHEMA_VERSION, "created": created, "elapsed_s": 0.0, "settings": settings,
               "machine": machine_info(opts.device), "ceilings": ceils, "cases": records}
    verdicts: list[dict] = []
    for suite in chosen:
        mine = suite.own(records)
        suite.finish(mine)
        results.update(suite.extra_results(mine))
        verdicts += suite.verdicts(mine, settings)
    results.update(verdicts=verdicts, plots=[], notes=notes)
    return _write(results, opts, t_start)


def _executor_notes(records: list[dict], schedule: _Schedule) -> list[str]:
    """What the run's notes say about where the cases ran: the cases lost with their machine, and mixed nodes."""
    notes = []
    if schedule.lost:
        notes.append(f"{len(schedule.lost)} case(s) lost with the machine running them (or skipped for it): not "
                     "journaled, so --resume runs them again")
    nodes = sorted({r["node"] for r in records if r.get("node")})
    if len(nodes) > 1:
        notes.append(f"the cases ran on {len(nodes)} machines ({', '.join(nodes)}; each row's node says which): the "
                     "cases of one group (an arena task at one N) ran on one machine, so the ratios within a group "
                     "compare like with like; times of different groups may come from different machines")
    return notes


def _write(results: dict, opts: RunOptions, t_start: float) -> dict:
    """Plots, the schema check, results.json and the reports; prints the summary when ``opts.echo``."""
    if not opts.isolate:
        results["notes"].append("cases ran in one process (--no-isolate): peak memory may be understated")
    plots, key, plot_notes = make_plots(results, opts.out_dir)
    results["plots"], results["key_plots"] = plots, key
    results["notes"] += plot_notes
    results["elapsed_s"] = time.perf_counter() - t_start
    problems = validate(results)
    if problems:  # pragma: no cover - a bug in this package; say so rather than hide it
        results["notes"].append("results do not match the schema: " + "; ".join(problems[:5]))
    with open(os.path.join(opts.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_reports(results, opts.out_dir)
    if opts.echo:
        print(terminal_summary(results))
        print(f"\nwrote {opts.out_dir}/results.json, report.md, report.html"
              + (f" and {len(plots)} plots" if plots else ""))
    return results


__all__ = ["PROFILE_TIMING", "Journal", "case_key", "reusable", "run"]
