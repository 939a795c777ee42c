"""The mini-LRA table of the benchmarks page: an arena run's ListOps scores beside the published ones.

    .venv/bin/python scripts/lra_table.py runs/arena/results.json
    .venv/bin/python scripts/lra_table.py --arena runs/arena/results.json   # every task, from scratch
    .venv/bin/python scripts/lra_table.py --swap-in runs/arena/results.json  # every task, swapped in

With ``--arena`` it prints instead, per mechanism trained from scratch, each (task, N) of the run
as three columns: the score, the score as a fraction of exact attention's, and the peak training
memory against exact attention through the naive formula and through the lean kernel (the
table the tour's efficient-variants page plots).

With ``--swap-in`` it prints, per mechanism swapped into exact attention's trained model, each
(task, N) as one cell: the score as a fraction of exact's with no training, then after the
fine-tuning steps (``23% → 25%``).

Otherwise it prints a Markdown table: per mechanism, this run's ListOps test accuracy (trained from
scratch with the arena's curriculum, and swapped into exact's model), then three published
columns, cited, not measured here: the Long Range Arena paper's ListOps column (Tay et al.,
2021, table 1), the Nystromformer authors' PyTorch rerun of ListOps 2K (Xiong et al., 2021),
and xFormers' LRA average with its peak memory (the xFormers LRA benchmark page). A dash is a
mechanism the source did not report.
"""

from __future__ import annotations

import sys

from attnlab.bench import load
from attnlab.bench.suites.tasks.results import score_text

#: the Long Range Arena paper's ListOps column (Tay et al., 2021, table 1), test accuracy %
LRA_PAPER = {"exact": 36.37, "linformer": 35.70, "reformer": 37.27, "performer": 18.01, "bigbird": 36.05,
             "longformer": 35.63, "local": 15.82, "linear": 16.13}
#: the Nystromformer authors' PyTorch rerun, ListOps 2K (Xiong et al., 2021), test accuracy %
NYSTROMFORMER_RERUN = {"exact": 37.10, "nystrom": 37.15, "linformer": 37.25, "reformer": 19.05, "performer": 18.80}
#: xFormers' LRA benchmark: the average over its tasks (%) and the peak memory (MB)
XFORMERS_AVERAGE = {"exact": (57.69, 2291), "nystrom": (57.61, 383)}


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def main(path: str) -> None:
    res = load(path)
    cases = [c for c in res["cases"] if c["suite"] == "tasks" and c["settings"]["task"] == "listops"]
    if not cases:
        raise SystemExit(f"{path} has no ListOps case of the arena (run attnlab bench tasks --profile standard)")
    n = cases[0]["N"]
    scratch = {c["name"]: c for c in cases if c["mode"] == "train" and c["name"] != "exact-naive"}
    swapped = {c["name"]: c for c in cases if c["mode"] == "swap_in"}
    print(f"| mechanism | this run, ListOps {n}, from scratch | swapped into exact's model | LRA paper | "
          "Nystromformer rerun | xFormers LRA average (peak MB) |")
    print("|---|---|---|---|---|---|")
    for name in sorted(set(scratch) | set(LRA_PAPER) | set(NYSTROMFORMER_RERUN), key=lambda x: (x != "exact", x)):
        ours = scratch.get(name)
        mine = _pct(ours["score"]) if ours and ours["status"] == "ok" else (ours["status"] if ours else "–")
        sw = swapped.get(name)
        swap = _pct(sw["score"]) if sw and sw["status"] == "ok" else (sw["status"] if sw else "–")
        xf = XFORMERS_AVERAGE.get(name)
        print(f"| {name} | {mine} | {swap} | {LRA_PAPER.get(name, '–')} | {NYSTROMFORMER_RERUN.get(name, '–')} | "
              f"{f'{xf[0]} ({xf[1]:,})' if xf else '–'} |")


def arena_table(path: str) -> None:
    res = load(path)
    cases = [c for c in res["cases"] if c["suite"] == "tasks" and c["mode"] == "train" and c["name"] != "exact-naive"]
    groups = sorted({(c["settings"]["task"], c["N"]) for c in cases})
    if not groups:
        raise SystemExit(f"{path} has no arena case trained from scratch")
    by = {(c["name"], c["settings"]["task"], c["N"]): c for c in cases}
    print("| mechanism | " + " | ".join(f"{t} {n}: score | vs exact | mem vs naive / lean" for t, n in groups) + " |")
    print("|---" * (1 + 3 * len(groups)) + "|")
    for name in sorted({c["name"] for c in cases}, key=lambda x: (x != "exact", x)):
        cells = []
        for t, n in groups:
            c = by.get((name, t, n))
            if c is None or c["status"] != "ok":
                cells += [c["status"] if c else "–", "", ""]
                continue
            ratio = f"{c['score_ratio']:.0%}" if c.get("score_ratio") is not None else ""
            mem = (f"{c['mem_vs_naive']:.2f}x / {c['mem_vs_lean']:.2f}x"
                   if c.get("mem_vs_naive") and c.get("mem_vs_lean") else "")
            cells += [score_text(c), ratio, mem]
        print(f"| {name} | " + " | ".join(cells) + " |")


def swap_in_table(path: str) -> None:
    res = load(path)
    cases = [c for c in res["cases"] if c["suite"] == "tasks" and c["mode"] == "swap_in"]
    groups = sorted({(c["settings"]["task"], c["N"]) for c in cases})
    if not groups:
        raise SystemExit(f"{path} has no swap-in case of the arena (run it without --no-swap-in)")
    by = {(c["name"], c["settings"]["task"], c["N"]): c for c in cases}
    steps = sorted({c["settings"]["swap_steps"] for c in cases})
    print("| mechanism | " + " | ".join(f"{t} {n}: untrained → +{'/'.join(map(str, steps))} steps"
                                       for t, n in groups) + " |")
    print("|---" * (1 + len(groups)) + "|")
    for name in sorted({c["name"] for c in cases}):
        cells = []
        for t, n in groups:
            c = by.get((name, t, n))
            if c is None or c["status"] != "ok":
                cells.append(c["status"] if c else "–")
            elif c.get("score_ratio") is None:  # exact attention did not learn the task: no ratio to give
                cells.append("–")
            else:
                cells.append(f"{c['score_0_ratio']:.0%} → {c['score_ratio']:.0%}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--arena":
        arena_table(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--swap-in":
        swap_in_table(sys.argv[2])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        raise SystemExit("usage: scripts/lra_table.py [--arena | --swap-in] RESULTS.json")
