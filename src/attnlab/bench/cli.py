"""The ``attnlab bench`` subcommand: a thin skin over :func:`attnlab.bench.run` and its companions.

    attnlab bench                      # the main job: every default suite, quick profile
    attnlab bench kernels              # one suite (or --suite kernels,mechanisms)
    attnlab bench tasks --profile standard --jobs 2 --out runs/arena    # the arena; --resume continues
    attnlab bench tasks --profile standard --executor ray --address HEAD:6379 --threads 1   # on a Ray cluster
    attnlab bench --profile full --device cuda --dtype bfloat16 --lengths 1024,4096
    attnlab bench compare A.json B.json     # the ratios between two runs
    attnlab bench summary RESULTS.json      # the decision table and verdicts of a finished run
    attnlab bench calibrate                 # measure each backend's cost here; auto then uses the constants

Each suite adds its own flags (``attnlab bench --help`` lists them by suite). Errors are
raised as ValueError and printed by :func:`attnlab.command.run_command` as one line.
"""

from __future__ import annotations

import argparse
import os

from .suite import RunOptions
from .suites import default_suite_names, suite_names, suites

#: the words that are not suite names
ACTIONS = ("compare", "summary", "calibrate")


def add_bench_parser(subparsers) -> None:
    """Register ``bench`` on an ``argparse`` subparsers object; ``args.func(args)`` runs it."""
    p = subparsers.add_parser(
        "bench", help="measure attention backends, mechanisms, generation and accuracy at length on this machine",
        description="Measure exact attention backends, efficient mechanisms, KV-cached generation and the accuracy "
                    "each attention keeps when trained (the arena) on this machine, and write results.json, "
                    "report.md, report.html and plots. 'attnlab bench compare A.json B.json' prints the ratios "
                    "between two runs; 'attnlab bench summary RESULTS.json' the answer of a finished run.",
    )
    p.add_argument("targets", nargs="*", metavar="SUITE",
                   help=f"suites to run ({', '.join(suite_names())}; default {','.join(default_suite_names())}), "
                        "or: compare A.json B.json, summary RESULTS.json, calibrate")
    p.add_argument("--suite", default=None, help="comma-separated suites (same as the positional names)")
    p.add_argument("--profile", default="quick", choices=["quick", "standard", "full"],
                   help="quick (the main job: minutes on a small CPU), standard (the arena at N >= 1K, about 2 h 15 min "
                        "with --jobs 2 on 2 cores; other suites as quick) or full (N up to 16384; the arena at the --lengths "
                        "you name)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--lengths", default=None, help="sequence lengths, e.g. 512,1024,2048 (default per profile)")
    p.add_argument("--only", default=None, help="only these backends/mechanisms, e.g. sdpa,chunked,auto")
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out/)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per case (default per profile)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per case after warm-up")
    p.add_argument("--no-isolate", action="store_true",
                   help="run cases in this process (faster start; peak memory less honest, no timeouts)")
    p.add_argument("--data", "--data-dir", dest="data_dir", default=None, metavar="DIR",
                   help="a folder holding the data sets (as attnlab data fetch lays them out; default "
                        "$ATTNLAB_DATA, then ~/.cache/attnlab/data)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of each training case (default: the cores divided among the --jobs lanes)")
    p.add_argument("--jobs", type=int, default=None,
                   help="lanes the training cases (the arena) run in side by side, each with cores / jobs threads "
                        "(default: one per core, at most 4)")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where the cases run: this machine (default), or a Ray cluster, each case a task with "
                        "--threads CPUs and each arena task at one N on one node (pip install 'attnlab[ray]')")
    p.add_argument("--address", default=None, metavar="HEAD:PORT",
                   help="the Ray cluster to run on (--executor ray; default $RAY_ADDRESS, else a cluster started "
                        "on this machine, else a new local one)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the cases already finished in OUT/cases.jsonl (after a killed run)")
    p.add_argument("--fresh", action="store_true",
                   help="measure every case again: reuse nothing from the result cache of earlier runs of this "
                        "version on this CPU (~/.cache/attnlab/bench, or $ATTNLAB_CACHE/bench)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    for suite in suites().values():
        suite.add_arguments(p.add_argument_group(f"{suite.name} suite"))
    p.set_defaults(func=bench_main)


def default_jobs() -> int:
    """Lanes of a plain ``attnlab bench``: one per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The :class:`RunOptions` of parsed ``attnlab bench`` arguments (ValueError naming a bad one)."""
    per_suite = {}
    for suite in suites().values():
        own = suite.options_from_args(args)
        if own:
            per_suite[suite.name] = own
    return RunOptions(profile=args.profile, device=args.device, dtype=args.dtype, lengths=args.lengths,
                      names=args.only, repeats=args.repeats, timeout_s=args.timeout, data_dir=args.data_dir,
                      threads=args.threads, jobs=args.jobs if args.jobs is not None else default_jobs(),
                      out_dir=args.out, isolate=not args.no_isolate, executor=args.executor,
                      ray_address=args.address, resume=args.resume, fresh=args.fresh, progress=not args.quiet, suite_options=per_suite)


def bench_main(args: argparse.Namespace) -> int:
    """Run ``attnlab bench`` from parsed arguments; returns the exit status."""
    from .runner import run

    targets = list(args.targets or [])
    if targets and targets[0] in ACTIONS:
        return {"compare": _compare, "summary": _summary, "calibrate": _calibrate}[targets[0]](args, targets[1:])
    names = [s for t in targets for s in t.split(",") if s]
    if args.suite:
        names += [s for s in args.suite.split(",") if s]
    run(names or None, options_from_args(args))
    return 0


def _compare(args: argparse.Namespace, files: list[str]) -> int:
    from .compare import compare, compare_table

    if len(files) != 2:
        raise ValueError(f"compare needs two results.json files (attnlab bench compare A.json B.json), got {len(files)}")
    print(compare_table(compare(files[0], files[1])))
    return 0


def _summary(args: argparse.Namespace, files: list[str]) -> int:
    from .compare import load
    from .report import terminal_summary

    if len(files) != 1:
        raise ValueError(f"summary needs one results.json (attnlab bench summary RESULTS.json), got {len(files)}")
    print(terminal_summary(load(files[0])))
    return 0


def _calibrate(args: argparse.Namespace, extra: list[str]) -> int:
    """``attnlab bench calibrate``: time the backends on a small grid and write the constants auto reads."""
    import sys

    from ..exact import calibration
    from .calibrate import GRID_LENGTHS, calibrate
    from .suite import parse_lengths

    if extra:
        raise ValueError(f"calibrate takes no suite names, got {extra}")
    lengths = parse_lengths(args.lengths) or GRID_LENGTHS
    repeats = args.repeats or 3
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    say = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    data = calibrate(lengths=list(lengths), repeats=repeats, progress=say)
    path = calibration.write(data)
    print(f"wrote {path}")
    for name, modes in data["constants"].items():
        for mode, (scale, overhead) in modes.items():
            print(f"  {name:<8} {mode:<8} seconds = {scale:.3f} x default model + {overhead * 1e3:.2f} ms")
    return 0


__all__ = ["ACTIONS", "add_bench_parser", "bench_main", "default_jobs", "options_from_args"]
