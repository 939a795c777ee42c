"""``run()``: measure ceilings, run the suites case by case, write results and reports.

The runner names no suite: it loops over the registered :class:`~attnlab.bench.suite.Suite`
objects (their cases, labels, post-processing, verdicts, report sections and plots).

Profiles: ``quick`` (kernels N = 512..4096, mechanisms N = 1024..4096, generation of 64
tokens after a 256-token prompt, 3 timed calls, flex skipped on CPU; a few minutes on a
2-core CPU) and ``full`` (N up to 16384, generation of 256 tokens after a 512-token
prompt, 5 timed calls, every backend). Every case runs isolated in its own process
unless ``isolate=False``. The ``tasks`` suite (every mechanism trained on the same task,
:mod:`.tasks`) takes minutes per mechanism, so it runs only when asked for.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time

import torch

from ..train.progress import ProgressBar, format_duration
from .common import MASK_KINDS
from .isolate import Runner
from .measure import machine_info, torch_dtype
from .report import make_plots, terminal_summary, write_reports
from .schema import SCHEMA_VERSION, validate
from .suite import BASE_RESULT_KEYS, RunOptions, Suite, default_suite_names, get_suite, suite_names
from .suite import suites as registered_suites


def __getattr__(name: str):
    """``SUITES`` (every registered suite) and ``DEFAULT_SUITES`` (those of a plain ``attnlab bench``).

    Read from the suite registry when asked, so a suite file added later is listed too.
    """
    if name == "SUITES":
        return suite_names()
    if name == "DEFAULT_SUITES":
        return default_suite_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: what each profile sets for every suite; the lengths and sizes per profile are the suites' own
PROFILES: dict[str, dict] = {
    "quick": {"repeats": 3, "budget_s": 1.0, "timeout_s": 120.0},
    # the tasks suite's standard profile (the arena at N >= 1K); the other suites run as in quick
    "standard": {"repeats": 3, "budget_s": 1.0, "timeout_s": 120.0},
    "full": {"repeats": 5, "budget_s": 3.0, "timeout_s": 600.0},
}

#: keys of a case record copied from the spec
_SPEC_KEYS = ("suite", "kind", "name", "mask", "N", "B", "H", "D", "dtype", "device", "mode", "settings")


class Progress(ProgressBar):
    """The bench's progress on stderr: cases done of all, time left, and the case starting now.

    The time left counts only the cases that did work (:meth:`step` with their seconds):
    resumed cases and the ceilings pass None. Off a terminal it writes one line per case,
    so a long run's log says what ran when.
    """

    def __init__(self, total: int, enabled: bool = True, stream=None):
        super().__init__(total, enabled=enabled, stream=stream)

    def update(self, label: str) -> None:
        """Show ``label``, the case about to run."""
        eta = self.eta()
        self.show(f"{self.done}/{self.total} elapsed {format_duration(self.elapsed())}"
                  + (f" eta {format_duration(eta)}" if eta is not None and self.done < self.total else "")
                  + f"  {label}", force=True)

    def step(self, seconds: float | None = None) -> None:
        """One case done; ``seconds`` it took (None: it did no work, e.g. a resumed case)."""
        self.advance(seconds)


def _record(suite: Suite, spec: dict, res: dict, ceiling: float | None) -> dict:
    rec = {k: spec[k] for k in _SPEC_KEYS}
    rec["notes"] = list(spec.get("notes") or [])
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


def case_key(spec: dict) -> str:
    """A case's identity in the journal: everything that decides what it measures."""
    ident = {k: spec.get(k) for k in (*_SPEC_KEYS, "repeats", "budget_s", "skip")}
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
        """Append one finished case (flushed and synced before the next case starts)."""
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "record": record}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _parse_lengths(lengths) -> list[int] | None:
    if lengths is None:
        return None
    if isinstance(lengths, str):
        lengths = [x for x in lengths.replace(" ", "").split(",") if x]
    try:
        out = [int(x) for x in lengths]
    except (TypeError, ValueError):
        raise ValueError(f"lengths must be positive integers like 512,1024, got {lengths!r}") from None
    if not out or any(n < 1 for n in out):
        raise ValueError(f"lengths must be positive integers like 512,1024, got {lengths!r}")
    return out


def _options(suites, profile, device, dtype, lengths, *, timeout, repeats, budget_s, max_error, mask_kinds, names,
             layer_n, generate_sizes, task_names, data_dir, threads, activations, suite_options,
             ) -> tuple[list[Suite], RunOptions]:
    """Validate ``run()``'s arguments: the selected suites and the options their cases are built from."""
    if isinstance(suites, str):
        suites = [s for s in suites.replace(" ", "").split(",") if s]
    suites = list(dict.fromkeys(suites))
    known = suite_names()
    bad = [s for s in suites if s not in known]
    if not suites or bad:
        raise ValueError(f"suites must be among {list(known)}, got {suites!r}")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    if isinstance(task_names, str):
        task_names = [x for x in task_names.replace(" ", "").split(",") if x]
    torch_dtype(dtype)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")
    elif device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if not (isinstance(max_error, (int, float)) and max_error > 0):
        raise ValueError(f"max_error must be a positive number, got {max_error!r}")
    kinds = list(mask_kinds or MASK_KINDS)
    for k in kinds:
        if k not in MASK_KINDS:
            raise ValueError(f"mask kinds must be among {MASK_KINDS}, got {k!r}")
    if isinstance(names, str):
        names = [x for x in names.replace(" ", "").split(",") if x]
    if names is not None:
        every = set().union(*(s.known_names() for s in registered_suites().values()))
        unknown = [x for x in names if x not in every]
        if unknown:
            raise ValueError(f"names must be backends or mechanisms among {sorted(every)}, got {unknown}")
    bad = sorted(set(suite_options or {}) - set(known))
    if bad:
        raise ValueError(f"suite_options keys must be suite names among {list(known)}, got {bad}")
    prof = PROFILES[profile]
    lens = _parse_lengths(lengths)
    reps = int(repeats or prof["repeats"])
    if reps < 1:
        raise ValueError(f"repeats must be >= 1, got {reps}")
    opts = RunOptions(
        profile=profile, device=device, dtype=dtype, lengths=lens, mask_kinds=kinds, names=names,
        layer_n=(4096 if lens is None else max(lens)) if layer_n == "auto" else layer_n, repeats=reps,
        budget_s=float(budget_s if budget_s is not None else prof["budget_s"]),
        timeout_s=float(timeout or prof["timeout_s"]), user_timeout=float(timeout) if timeout else None,
        max_error=float(max_error), generate_sizes=generate_sizes, task_names=task_names, data_dir=data_dir,
        threads=threads, activations=activations, suite_options=dict(suite_options or {}))
    chosen = [get_suite(s) for s in suites]
    for suite in chosen:
        suite.check(opts)
    return chosen, opts


def _measure_ceilings(runner: Runner, opts: RunOptions, ceiling_size: int, copy_mb: int, notes: list[str]) -> dict:
    """The machine's matmul GFLOP/s and copy GB/s (or why they are missing, noted)."""
    res = runner({"suite": "ceilings", "device": opts.device, "dtypes": [opts.dtype], "size": ceiling_size,
                  "copy_mb": copy_mb, "budget_s": min(opts.budget_s, 1.0)})
    if res.get("status") == "ok":
        return res["ceilings"]
    notes.append(f"ceilings not measured: {res.get('reason')}")
    return {"matmul_gflops": {}, "copy_gbps": None, "status": res.get("status", "error"), "reason": res.get("reason")}


def _run_cases(specs: list[dict], runner: Runner, journal: Journal, bar: Progress, opts: RunOptions,
               ceiling: float | None) -> list[dict]:
    """Run (or take from the journal) every spec, in order; returns their records."""
    records = []
    for spec in specs:
        suite = get_suite(spec["suite"])
        spec = {**spec, "repeats": opts.repeats, "budget_s": opts.budget_s}
        bar.update(suite.label(spec))
        key = case_key(spec)
        if key in journal.done:
            records.append(journal.done[key])
            bar.step()
            continue
        t_case = time.perf_counter()
        res = dict(spec["skip"]) if spec.get("skip") else runner(spec)
        rec = _record(suite, spec, res, ceiling)
        journal.add(key, rec)
        records.append(rec)
        bar.step(time.perf_counter() - t_case)
    return records


def run(
    suites=None,
    profile: str = "quick",
    device: str = "cpu",
    dtype: str = "float32",
    lengths=None,
    out_dir: str = "bench-out",
    *,
    timeout: float | None = None,
    repeats: int | None = None,
    budget_s: float | None = None,
    isolate: bool = True,
    max_error: float = 0.05,
    mask_kinds=None,
    names=None,
    layer_n: int | None | str = "auto",
    generate_sizes: dict | None = None,
    ceiling_size: int = 2048,
    copy_mb: int = 256,
    progress: bool = True,
    echo: bool = True,
    task_names=None,
    data_dir: str | None = None,
    resume: bool = False,
    threads: int | None = None,
    activations: str | None = None,
    suite_options: dict[str, dict] | None = None,
) -> dict:
    """Run benchmark suites and write ``results.json``, ``report.md``, ``report.html`` and plots.

    Args:
        suites: suite names (the registered ones: ``"kernels"``, ``"mechanisms"``, ``"generate"``,
            ``"tasks"``, ...) as a list or comma-separated string; default :data:`DEFAULT_SUITES` (every
            suite whose ``default`` is set: all but ``tasks``).
        profile: ``"quick"``, ``"standard"`` or ``"full"`` (repeats, timeout, and each suite's lengths;
            see :data:`PROFILES`).
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        lengths: sequence lengths of the kernels and mechanisms suites (list or ``"512,1024"``); default
            per profile. The generate suite takes its sizes from ``generate_sizes``.
        out_dir: folder for the output files (created).
        timeout: hard limit in seconds of one case (default per profile; a ``tasks`` case, a whole training
            run, defaults to :data:`attnlab.bench.tasks.TIMEOUT_S`).
        repeats: most timed calls per case after warm-up (default per profile).
        budget_s: stop adding timed calls once they total this many seconds.
        isolate: run every case in its own process (honest peak memory, timeouts, OOM isolation).
        max_error: relative-error threshold of the mechanisms verdict.
        mask_kinds: mask kinds of the kernels suite (default all of :data:`MASK_KINDS`).
        names: only these backends / mechanisms (list or comma-separated string; default all); the
            generate suite always runs both of its cases; the tasks suite takes mechanism names.
        layer_n: N of the layer comparison (``"auto"``: 4096, or the largest of ``lengths``; None: skip).
        generate_sizes: overrides of the generate suite's sizes (keys of
            :data:`attnlab.bench.generate.DEFAULT_SIZES`: ``layers``, ``dim``, ``heads``,
            ``vocab_size``, ``prompt_len``, ``new_tokens``, ``batch``); default per profile.
        ceiling_size: size of the square matmul measuring the FLOP ceiling.
        copy_mb: MiB copied to measure memory bandwidth.
        progress: draw a progress bar on stderr.
        echo: print the tables and verdicts at the end.
        task_names: arena tasks of the ``tasks`` suite (list or comma-separated; default all of the
            profile's: ``mqar``, ``listops``, ``chars``).
        data_dir: the shared data folder the ``chars`` arena task reads (default ``$ATTNLAB_DATA`` or
            ``../shared/data``).
        resume: reuse the cases already finished in ``out_dir/cases.jsonl`` (a killed run loses at most
            the case in progress); without it the journal starts afresh.
        threads: torch threads of each ``tasks`` training run (default: torch's own, all cores).
        activations: an ``attnlab train chars`` run or checkpoint whose q, k, v the mechanisms suite
            also measures its error on (besides MiniLM's on real sentences).
        suite_options: per suite name, options of that suite (read by the suite from
            :meth:`~attnlab.bench.suite.RunOptions.options_for`), e.g. ``{"mechanisms": {"real": False}}``.

    Returns:
        The results dict written to ``results.json`` (see :mod:`attnlab.bench.schema`).
    """
    chosen, opts = _options(
        default_suite_names() if suites is None else suites, profile, device, dtype, lengths, timeout=timeout,
        repeats=repeats, budget_s=budget_s, max_error=max_error, mask_kinds=mask_kinds, names=names,
        layer_n=layer_n, generate_sizes=generate_sizes, task_names=task_names, data_dir=data_dir, threads=threads,
        activations=activations, suite_options=suite_options)
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.perf_counter()
    created = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    runner = Runner(isolate=isolate, timeout_s=opts.timeout_s)
    notes: list[str] = []
    specs: list[dict] = []
    lengths_by_suite: dict[str, list[int]] = {}
    extra_settings: dict = {}
    for suite in chosen:
        got = suite.cases(opts)
        lengths_by_suite[suite.name] = suite.lengths(opts, got)
        extra_settings.update(suite.settings(opts))
        specs += got
    bar = Progress(len(specs) + 1, enabled=progress)
    bar.update("ceilings")
    ceils = _measure_ceilings(runner, opts, ceiling_size, copy_mb, notes)
    bar.step()  # not a case: its time says nothing about the cases' ETA
    journal = Journal(os.path.join(out_dir, "cases.jsonl"), resume=resume)
    if journal.done:
        notes.append(f"resumed: {len(journal.done)} finished case(s) read from {journal.path}")
    records = _run_cases(specs, runner, journal, bar, opts, ceils["matmul_gflops"].get(opts.dtype))
    for suite in registered_suites().values():
        suite.finish(records)
    bar.update("reports")
    bar.close()
    settings = {"suites": [s.name for s in chosen], "profile": profile, "device": device, "dtype": dtype,
                "lengths": lengths_by_suite, "mask_kinds": opts.mask_kinds, "timeout_s": opts.timeout_s,
                "repeats": opts.repeats, "budget_s": opts.budget_s, "isolate": bool(isolate),
                "max_error": opts.max_error, "names": opts.names, **extra_settings}
    results = {"schema_version": SCHEMA_VERSION, "created": created, "elapsed_s": 0.0, "settings": settings,
               "machine": machine_info(device), "ceilings": ceils, "cases": records}
    verdicts: list[dict] = []
    for suite in registered_suites().values():
        results.update(suite.extra_results(records))
        verdicts += suite.verdicts(records, settings)
    results.update(verdicts=verdicts, plots=[], notes=notes)
    return _write(results, out_dir, isolate, echo, t_start)


def _write(results: dict, out_dir: str, isolate: bool, echo: bool, t_start: float) -> dict:
    """Plots, the schema check, results.json and the reports; prints the summary when ``echo``."""
    if not isolate:
        results["notes"].append("cases ran in one process (--no-isolate): peak memory may be understated")
    plots, plot_notes = make_plots(results, out_dir)
    results["plots"] = plots
    results["notes"] += plot_notes
    results["elapsed_s"] = time.perf_counter() - t_start
    problems = validate(results)
    if problems:  # pragma: no cover - a bug in this package; say so rather than hide it
        results["notes"].append("results do not match the schema: " + "; ".join(problems[:5]))
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_reports(results, out_dir)
    if echo:
        print(terminal_summary(results))
        print(f"\nwrote {out_dir}/results.json, report.md, report.html" + (f" and {len(plots)} plots" if plots else ""))
    return results


# SUITES and DEFAULT_SUITES come from the module __getattr__ above
__all__ = ["DEFAULT_SUITES", "PROFILES", "SUITES", "Journal", "Progress", "case_key", "run"]  # noqa: F822
