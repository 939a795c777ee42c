"""Glimpse paths of recurrent attention models on cluttered test digits: one row of canvases per run.

    attnlab train cluttered-digits --out runs/ram
    attnlab train cluttered-digits --task-opt model=ram-random --out runs/ram-random
    python scripts/glimpse_paths.py runs/ram runs/ram-random --png docs/dynamic/glimpses.png
    python scripts/glimpse_paths.py runs/ram --hits     # how often a glimpse finds the digit
    python scripts/glimpse_paths.py runs/ram runs/ram-random runs/cnn --table   # the runs' results, as Markdown rows

Reads each run's checkpoint and task (``load_run``), runs the model on the first ``-n`` test
canvases (:func:`attnlab.tasks.cluttered_digits.glimpse_paths`; the learned policy at its means, the
random one from the task's seeded generator, as the evaluation does) and draws every glimpse: its
second patch (thin square, twice the finest's side), its finest patch (bold square, numbered in
order) and the path between them. Each title gives the true class and the model's answer; the row's
label gives the run's test accuracy and coverage (from its ``result.json``) and the digit's box is
drawn dashed. ``--table`` prints one Markdown row per run (any model, the CNN too) from its
``result.json``: test accuracy, coverage, full-resolution coverage and training seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.models.glimpse import glimpse_corners
from attnlab.tasks.cluttered_digits import glimpse_hits, glimpse_paths
from attnlab.train.trainer import load_run


def _row_label(run: Path, model: str) -> str:
    result = run / "result.json"
    if not result.is_file():
        return f"{run.name} ({model})"
    test = json.loads(result.read_text()).get("metrics", {}).get("test", {})
    return (f"{run.name} ({model})\naccuracy {test.get('accuracy', float('nan')):.1%}\ncoverage {test.get('coverage', float('nan')):.1%}"
            f"\nfine {test.get('fovea_coverage', float('nan')):.1%}")


def table_row(run: Path) -> str:
    """``| model (run) | accuracy | coverage | full-resolution coverage | training seconds | steps |`` of a run."""
    if not (run / "result.json").is_file():
        raise SystemExit(f"{run} has no result.json: not a finished `attnlab train cluttered-digits` run")
    result = json.loads((run / "result.json").read_text())
    spec = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    model = spec.get("task_options", {}).get("model", "ram")
    test = result["metrics"]["test"]
    pct = lambda key: "–" if key not in test else f"{test[key]:.1%}".replace("%", " %")  # noqa: E731
    return (f"| `{model}` ({run.name}) | {pct('accuracy')} | {pct('coverage')} | {pct('fovea_coverage')} | "
            f"{result['seconds']:.1f} | {result['step']:,} |")


def plot(runs: list[Path], n: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(len(runs), n, figsize=(1.9 * n + 0.8, 2.1 * len(runs)), dpi=120, squeeze=False)
    for row, run in enumerate(runs):
        task, model, _ = load_run(run, need_data=True)
        cfg = model.config
        paths = glimpse_paths(model, task, "test", n=n)
        corners = glimpse_corners(paths["locations"], cfg.image_size)  # (n, G, 2)
        for i in range(n):
            ax = axes[row, i]
            ax.imshow(paths["images"][i, 0], cmap="gray", vmin=0, vmax=1)
            r, c = paths["corners"][i].tolist()
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 8, 8, fill=False, ec="cyan", lw=0.8, ls="--"))
            pts = corners[i].tolist()
            for t, (y, x) in enumerate(pts):
                colour = plt.cm.autumn(t / max(1, len(pts) - 1))
                small = cfg.patch_size
                big = small * 2 if cfg.scales > 1 else small
                ax.add_patch(Rectangle((x - big // 2 - 0.5, y - big // 2 - 0.5), big, big, fill=False, ec=colour,
                                       lw=0.6, alpha=0.7))
                ax.add_patch(Rectangle((x - small // 2 - 0.5, y - small // 2 - 0.5), small, small, fill=False,
                                       ec=colour, lw=1.6))
                ax.text(x - 0.5, y - 0.5, str(t + 1), color=colour, fontsize=7, ha="center", va="center")
            ys, xs = [p[0] - 0.5 for p in pts], [p[1] - 0.5 for p in pts]
            ax.plot(xs, ys, color="yellow", lw=0.7, alpha=0.8)
            ok = int(paths["predictions"][i]) == int(paths["labels"][i])
            ax.set_title(f"{int(paths['labels'][i])} -> {int(paths['predictions'][i])}", fontsize=8,
                         color="black" if ok else "red")
            ax.set_xlim(-0.5, cfg.image_size - 0.5)
            ax.set_ylim(cfg.image_size - 0.5, -0.5)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row, 0].set_ylabel(_row_label(run, task.options["model"]), fontsize=8)
    fig.suptitle("Glimpses on cluttered test digits (1 = first; bold: finest patch, thin: the next; dashed: the digit)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="`attnlab train cluttered-digits` run directories (ram models)")
    ap.add_argument("-n", type=int, default=6, help="test canvases per run")
    ap.add_argument("--png", type=Path, help="write the figure here")
    ap.add_argument("--hits", action="store_true",
                    help="print, per run, how often a glimpse lands on the digit and the accuracy when it does")
    ap.add_argument("--table", action="store_true", help="print one Markdown row per run from its result.json")
    args = ap.parse_args()
    if args.png is None and not args.hits and not args.table:
        ap.error("give --png PATH, --hits, --table or several")
    if args.table:
        print("| model (run) | test accuracy | coverage | full-resolution coverage | training seconds | steps |")
        print("|---|---|---|---|---|---|")
        for run in args.runs:
            print(table_row(run))
    if args.hits:
        for run in args.runs:
            task, model, _ = load_run(run, need_data=True)
            h = glimpse_hits(model, task, "test")
            fmt = lambda x: "–" if x is None else f"{x:.1%}"  # noqa: E731
            print(f"{run}: accuracy {fmt(h['accuracy'])}; a glimpse within 2 px of the digit's centre on "
                  f"{fmt(h['hit_rate'])} of the test canvases (accuracy there {fmt(h['accuracy_hit'])}, elsewhere "
                  f"{fmt(h['accuracy_miss'])}); per glimpse {', '.join(fmt(x) for x in h['per_glimpse'])}")
    if args.png is not None:
        plot(args.runs, args.n, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
