"""Print the README's mini-LRA table from an arena run's results.json.

    .venv/bin/python scripts/arena_table.py runs/arena/results.json

One row per contender, one column group per (task, N): the score (accuracy %, or bits
per character), its fraction of exact attention's, and the peak training memory as a
ratio to naive and to lean exact. Every figure is read from the file, none typed in.
"""

from __future__ import annotations

import sys

from attnlab.bench import load
from attnlab.bench.tasks import arena_groups, derive


def _score(c: dict) -> str:
    if c["status"] != "ok":
        return c["status"]
    if c["name"] == "exact-naive":
        return "(cost only)"
    if c.get("score_name") == "bits_per_char":
        return f"{c['score']:.3f} bpc"
    return f"{100 * c['score']:.1f}"


def _x(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}x"


def table(results: dict) -> str:
    """The Markdown table."""
    cases = results["cases"]
    derive(cases)
    groups = arena_groups(cases)
    if not groups:
        raise SystemExit("no tasks-suite cases in this results.json")
    names = list(dict.fromkeys(c["name"] for g in groups.values() for c in g))
    head = ["mechanism"]
    for task, n in groups:
        head += [f"{task} {n}: score", "vs exact", "mem vs naive / lean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        row = [name]
        for g in groups.values():
            c = next((c for c in g if c["name"] == name), None)
            if c is None:
                row += ["", "", ""]
                continue
            ratio = c.get("score_ratio")
            mem = f"{_x(c.get('mem_vs_naive'))} / {_x(c.get('mem_vs_lean'))}" if c["status"] == "ok" else ""
            row += [_score(c), "" if ratio is None else f"{ratio:.0%}", mem]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/arena_table.py RESULTS.json")
    print(table(load(sys.argv[1])))
