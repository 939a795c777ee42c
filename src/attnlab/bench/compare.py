"""``compare(a, b)``: ratios between two benchmark runs, case by case.

Cases match on (suite, kind, name, mask, N, B, H, D, dtype, mode); for each pair
measured in both runs it gives ``time B / time A`` and ``peak B / peak A`` (below 1:
run B is faster / lighter). Cases measured in one run only are listed as such.
"""

from __future__ import annotations

import json

from .format import text_table
from .suites import validate

_KEY = ("suite", "kind", "name", "mask", "N", "B", "H", "D", "dtype", "mode")


def load(path: str) -> dict:
    """Read a ``results.json`` and check it against the schema (ValueError naming the file)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read benchmark results {path!r}: {e}") from e
    problems = validate(data)
    if problems:
        raise ValueError(f"{path!r} is not an attnlab bench results.json: {'; '.join(problems[:3])}")
    return data


def compare(a: dict | str, b: dict | str) -> list[dict]:
    """Rows ``{key..., "time_a", "time_b", "time_ratio", "peak_a", "peak_b", "peak_ratio", "status"}``."""
    a = load(a) if isinstance(a, str) else a
    b = load(b) if isinstance(b, str) else b
    ia = {tuple(c[k] for k in _KEY): c for c in a["cases"]}
    ib = {tuple(c[k] for k in _KEY): c for c in b["cases"]}
    rows = []
    for key in list(ia) + [k for k in ib if k not in ia]:
        ca, cb = ia.get(key), ib.get(key)
        row = dict(zip(_KEY, key))
        row.update(time_a=None, time_b=None, time_ratio=None, peak_a=None, peak_b=None, peak_ratio=None)
        if ca is None or cb is None:
            row["status"] = "only in A" if cb is None else "only in B"
        elif ca["status"] != "ok" or cb["status"] != "ok":
            row["status"] = f"A {ca['status']}, B {cb['status']}"
        else:
            row["status"] = "ok"
            row.update(time_a=ca["time_s"], time_b=cb["time_s"], time_ratio=cb["time_s"] / ca["time_s"])
            if ca["peak_bytes"] and cb["peak_bytes"] is not None:
                row.update(peak_a=ca["peak_bytes"], peak_b=cb["peak_bytes"],
                           peak_ratio=cb["peak_bytes"] / ca["peak_bytes"])
        rows.append(row)
    return rows


def compare_table(rows: list[dict]) -> str:
    """The rows of :func:`compare` as a terminal table."""
    head = ["suite", "name", "mask", "N", "mode", "A ms", "B ms", "B/A time", "A MB", "B MB", "B/A mem", "status"]
    f = lambda x, s, fmt: "" if x is None else format(x * s, fmt)  # noqa: E731
    body = [[r["suite"], r["name"], r["mask"], str(r["N"]), r["mode"], f(r["time_a"], 1e3, ",.2f"),
             f(r["time_b"], 1e3, ",.2f"), f(r["time_ratio"], 1, ".2f"), f(r["peak_a"], 2**-20, ",.1f"),
             f(r["peak_b"], 2**-20, ",.1f"), f(r["peak_ratio"], 1, ".2f"), r["status"]] for r in rows]
    return text_table(head, body)


__all__ = ["compare", "compare_table", "load"]
