"""The ``attnlab bench`` subcommand: a thin skin over :func:`attnlab.bench.run` and ``compare``.

    attnlab bench                      # quick profile, every suite
    attnlab bench kernels              # one suite (or --suite kernels,mechanisms)
    attnlab bench generate             # CausalLM tokens/s with and without the KV cache
    attnlab bench generate --prompt-len 512 --new-tokens 256
    attnlab bench tasks                # the arena: every mechanism trained on the same tasks (quick profile)
    attnlab bench tasks --profile standard --out runs/arena     # N >= 1K, up to two hours; --resume continues
    attnlab bench tasks --profile full --tasks mqar --lengths 512,2048
    attnlab bench --profile full --device cuda --dtype bfloat16 --lengths 1024,4096
    attnlab bench compare A.json B.json
    attnlab bench calibrate            # measure each backend's cost here; auto then uses the constants
"""

from __future__ import annotations

import argparse

from .common import MASK_KINDS
from .suite import default_suite_names, suite_names


def add_bench_parser(subparsers) -> None:
    """Register ``bench`` on an ``argparse`` subparsers object; ``args.func(args)`` runs it."""
    p = subparsers.add_parser(
        "bench", help="measure attention backends, mechanisms, generation and task accuracy on this machine",
        description="Measure exact attention backends, efficient mechanisms and KV-cached generation on this "
                    "machine and write "
                    "results.json, report.md, report.html and plots. "
                    "'attnlab bench compare A.json B.json' prints the ratios between two runs.",
    )
    p.add_argument("targets", nargs="*", metavar="SUITE",
                   help=f"suites to run ({', '.join(suite_names())}; default {','.join(default_suite_names())}), "
                        "or: compare A.json B.json, or: calibrate (the cost constants auto uses)")
    p.add_argument("--suite", default=None, help="comma-separated suites (same as the positional names)")
    p.add_argument("--profile", default="quick",
                   help="quick (<= 5 min on a small CPU, default), standard (the tasks arena at N >= 1K, up to "
                        "2 h; other suites as quick) or full (N up to 16384; generate: 256 tokens after a 512-token "
                        "prompt; tasks: the --tasks at the --lengths you name)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--lengths", default=None, help="sequence lengths, e.g. 512,1024,2048 (default per profile)")
    p.add_argument("--masks", default=None, help=f"mask kinds of the kernels suite (default {','.join(MASK_KINDS)})")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="generate suite: prompt length (default per profile: quick 256, full 512)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="generate suite: tokens to generate (default per profile: quick 64, full 256)")
    p.add_argument("--only", default=None, help="only these backends/mechanisms, e.g. sdpa,chunked,auto")
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out/)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per case (default per profile)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per case after warm-up")
    p.add_argument("--max-error", type=float, default=0.05,
                   help="relative error under which an approximation counts as good (default 0.05)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run cases in this process (faster start; peak memory less honest, no timeouts)")
    p.add_argument("--tasks", default=None, help="tasks suite: arena tasks to run (mqar,listops,chars; default all of "
                                                 "the profile's)")
    p.add_argument("--data-dir", default=None,
                   help="tasks suite: the shared data folder (chars reads tinyshakespeare/input.txt there; default "
                        "$ATTNLAB_DATA or ../shared/data)")
    p.add_argument("--activations", default=None, metavar="RUN",
                   help="mechanisms suite: also measure the error on the q, k, v of this 'attnlab train chars' run "
                        "or checkpoint (MiniLM's on real sentences are always measured, N <= 512)")
    p.add_argument("--threads", type=int, default=None,
                   help="tasks suite: torch threads of each training run (default: all cores)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the cases already finished in OUT/cases.jsonl (after a killed run)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=bench_main)


def bench_main(args: argparse.Namespace) -> int:
    """Run ``attnlab bench`` from parsed arguments; returns the exit status."""
    from . import compare, compare_table, run

    targets = list(args.targets or [])
    if targets and targets[0] == "compare":
        if len(targets) != 3:
            raise SystemExit(f"attnlab bench: compare needs two results.json files (attnlab bench compare A.json "
                             f"B.json), got {len(targets) - 1}")
        try:
            rows = compare(targets[1], targets[2])
        except ValueError as e:
            raise SystemExit(f"attnlab bench: {e}") from e
        print(compare_table(rows))
        return 0
    if targets and targets[0] == "calibrate":
        return _calibrate(args, targets[1:])
    suites = [s for t in targets for s in t.split(",") if s]
    if args.suite:
        suites += [s for s in args.suite.split(",") if s]
    try:
        run(
            suites or list(default_suite_names()), profile=args.profile, device=args.device, dtype=args.dtype, lengths=args.lengths,
            out_dir=args.out, timeout=args.timeout, repeats=args.repeats, isolate=not args.no_isolate,
            max_error=args.max_error, names=args.only, mask_kinds=args.masks.split(",") if args.masks else None,
            progress=not args.quiet, task_names=args.tasks, data_dir=args.data_dir, resume=args.resume,
            threads=args.threads, activations=args.activations,
            generate_sizes={k: v for k, v in (("prompt_len", args.prompt_len), ("new_tokens", args.new_tokens))
                            if v is not None} or None,
        )
    except ValueError as e:
        raise SystemExit(f"attnlab bench: {e}") from e
    return 0


def _calibrate(args: argparse.Namespace, extra: list[str]) -> int:
    """``attnlab bench calibrate``: time the backends on a small grid and write the constants auto reads."""
    import sys

    from ..exact import calibration
    from .calibrate import GRID_LENGTHS, calibrate
    from .runner import _parse_lengths

    if extra:
        raise SystemExit(f"attnlab bench: calibrate takes no suite names, got {extra}")
    try:
        lengths = _parse_lengths(args.lengths) or list(GRID_LENGTHS)
    except ValueError as e:
        raise SystemExit(f"attnlab bench: {e}") from e
    repeats = args.repeats or 3
    if repeats < 1:
        raise SystemExit(f"attnlab bench: repeats must be >= 1, got {repeats}")
    say = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    data = calibrate(lengths=lengths, repeats=repeats, progress=say)
    path = calibration.write(data)
    print(f"wrote {path}")
    for name, modes in data["constants"].items():
        for mode, (scale, overhead) in modes.items():
            print(f"  {name:<8} {mode:<8} seconds = {scale:.3f} x default model + {overhead * 1e3:.2f} ms")
    return 0


__all__ = ["add_bench_parser", "bench_main"]
