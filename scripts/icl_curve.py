"""The in-context regression curve: squared error against in-context examples, model and baselines.

    attnlab train icl-linear --task-opt noise=1 --out runs/icl-linear
    python scripts/icl_curve.py runs/icl-linear --png docs/figures/icl_curve.png --json /tmp/icl_curve.json

Reads the run's checkpoint and task, computes :func:`attnlab.tasks.icl.icl_curve` on the
task's 1,000 test prompts (least squares, ridge, averaging and 3-nearest-neighbour predictors
in NumPy float64 on the same prompts), prints the table at ``k = d, 2d, 3d - 1`` and the checks
against the baselines, and plots the curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.tasks.icl import BASELINES, icl_curve
from attnlab.train.trainer import load_run

LABELS = {"transformer": "Transformer", "least_squares": "least squares", "ridge": "ridge",
          "averaging": "averaging", "nearest_3": "3-nearest neighbours"}


def checks(curve: dict) -> list[str]:
    """The comparisons at ``k >= d`` and ``k >= 2d``, in words."""
    d, t = curve["n_dims"], curve["transformer"]
    ks = curve["examples"]
    ratio = max(t[k] / curve["least_squares"][k] for k in ks if k >= 2 * d)
    below = all(t[k] < min(curve["averaging"][k], curve["nearest_3"][k]) for k in ks if k >= d)
    return [f"largest Transformer / least-squares error ratio at k >= {2 * d}: {ratio:.3f}",
            f"Transformer below averaging and 3-NN at every k >= {d}: {below}"]


def plot(curve: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name in ("transformer", *BASELINES):
        ax.plot(curve["examples"], curve[name], label=LABELS[name], lw=2.2 if name == "transformer" else 1.3,
                ls="-" if name == "transformer" else "--")
    d = curve["n_dims"]
    ax.axvline(d, color="grey", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("in-context examples")
    ax.set_ylabel("squared error / d")
    ax.set_title(f"In-context linear regression, d = {d}, noise {curve['noise']:g} ({curve['prompts']} prompts)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="an `attnlab train icl-linear` run directory or checkpoint")
    ap.add_argument("--png", type=Path, help="write the plot here")
    ap.add_argument("--json", type=Path, help="write the curves here")
    args = ap.parse_args()
    task, model, _ = load_run(args.run, need_data=True)
    curve = icl_curve(model, task)
    d = curve["n_dims"]
    names = ("transformer", *BASELINES)
    print("k    " + "  ".join(f"{LABELS[n]:>20}" for n in names))
    for k in sorted({1, d // 2, d, 2 * d, len(curve["examples"]) - 1}):
        print(f"{k:<4} " + "  ".join(f"{curve[n][k]:>20.4f}" for n in names))
    for line in checks(curve):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(curve, indent=1))
    if args.png:
        plot(curve, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
