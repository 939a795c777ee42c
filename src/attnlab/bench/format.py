"""How bench results are shown: table cells, text and Markdown tables, verdict phrases, line plots.

The bottom floor of ``attnlab.bench`` beside :mod:`.measure`: it imports nothing else of the
bench, so the suites, the report and ``compare`` take their cells and words from here and
every table and verdict reads the same way ("2.1x faster than sdpa", "12.0x less memory
than exact"). Verdicts are computed from measured cases, never typed by hand; comparisons
are against what a user would otherwise use: SDPA
(``torch.nn.functional.scaled_dot_product_attention``) for exact attention, exact attention
for an approximation.

Tables are lists of strings rendered by one function with tabulate. The terminal gets
fixed-width columns: the first two (names) and the last (notes) to the left, the figures
between them to the right. Markdown gets pipe tables with one space around each cell and no
padding, so a row of ``report.md`` reads the same whatever the other rows hold
(``| exact | mqar | 64 | 12 |``) and can be searched for as it is.
"""

from __future__ import annotations

import os
from typing import Literal

from tabulate import tabulate

# -- tables ---------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(head: list[str], rows: list[list[str]], fmt: Literal["text", "markdown"] = "text") -> str:
    """``head`` and ``rows`` (cells already formatted as strings) as a ``text`` or ``markdown`` table."""
    if fmt == "markdown":
        # stralign=None: cells as they are, not padded to the column's width
        return tabulate([[_md_cell(c) for c in r] for r in rows], headers=[_md_cell(h) for h in head],
                        tablefmt="pipe", stralign=None, numalign=None, disable_numparse=True)
    if fmt != "text":
        raise ValueError(f"table format must be 'text' or 'markdown', got {fmt!r}")
    last = len(head) - 1
    align = ["left" if i in (0, 1, last) else "right" for i in range(len(head))]
    return tabulate(rows, headers=head, tablefmt="simple", colalign=align, disable_numparse=True)


def text_table(head: list[str], rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal (the Markdown report renders its tables alike)."""
    return render_table(head, rows, "text")


# -- cells the suites' tables share ---------------------------------------------------------------


def ms_cell(c: dict | None) -> str:
    """A case's median time in ms (its status when it did not run)."""
    if c is None:
        return ""
    if c["status"] != "ok":
        return c["status"]
    return f"{c['time_s'] * 1e3:,.2f}" if c["time_s"] < 1 else f"{c['time_s'] * 1e3:,.0f}"


def mb_cell(c: dict | None) -> str:
    """A case's peak memory in MB."""
    if c is None or c["status"] != "ok":
        return ""
    return "n/a" if c["peak_bytes"] is None else f"{c['peak_bytes'] / 2**20:,.1f}"


def num(x: float | None, fmt: str) -> str:
    """``format(x, fmt)``, or empty for None."""
    return "" if x is None else format(x, fmt)


def clip(text: str, width: int | None) -> str:
    """``text`` cut to ``width`` characters (ending in ``...``); None keeps it whole."""
    return text[: width - 3] + "..." if width and len(text) > width else text


def notes_cell(*cs: dict | None) -> str:
    """The distinct reasons and notes of the given cases, joined (a table's notes column)."""
    seen: list[str] = []
    for c in cs:
        if c is None:
            continue
        for r in (c.get("reason"), c.get("note"), *c.get("notes", [])):
            if r and r not in seen:
                seen.append(r)
    return "; ".join(seen)


def mode_pairs(cases: list[dict], kind: str | None = None) -> list[tuple[dict | None, dict | None]]:
    """(fwd, fwd_bwd) records of the same (kind, name, mask, N), in run order."""
    rows: dict[tuple, list] = {}
    for c in cases:
        if kind is not None and c["kind"] != kind:
            continue
        key = (c["kind"], c["name"], c["mask"], c["N"])
        rows.setdefault(key, [None, None])[0 if c["mode"] == "fwd" else 1] = c
    return [tuple(v) for v in rows.values()]  # type: ignore[misc]


# -- the words of verdicts -------------------------------------------------------------------------

MODE_WORDS = {"fwd": "forward", "fwd_bwd": "forward+backward"}

MASK_WORDS = {"none": "no mask", "causal": "causal", "sliding_window": "sliding window", "padding": "padding",
              "document": "document"}

#: below this, peak memory is measurement noise (thread stacks, allocator pages): no ratios
MIN_RATIO_BYTES = 1 << 20


def is_ok(c: dict) -> bool:
    """The case ran and has a time."""
    return c["status"] == "ok" and c["time_s"] is not None


def mb_text(b: int | None) -> str:
    """``'12.3 MB'`` (``'n/a'`` when unknown)."""
    return "n/a" if b is None else f"{b / 2**20:,.1f} MB"


def ms_text(s: float) -> str:
    """``'12.3 ms'`` below ten seconds, ``'12.3 s'`` above."""
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.1f} s"


def ratio_text(x: float | None) -> str:
    """``'2.31x'``, ``'12x'``, or ``'n/a'``."""
    return "n/a" if x is None else (f"{x:.2f}x" if x < 10 else f"{x:.0f}x")


def times_phrase(a: float, b: float, more: str = "faster", less: str = "slower") -> str:
    """``'2.1x faster than'`` style comparison of ``a`` (ours) with ``b`` (theirs), lower is better."""
    if a <= 0 or b <= 0:
        return "compared with"
    r = b / a
    if r >= 1.05:
        return f"{r:.1f}x {more} than"
    if r <= 1 / 1.05:
        return f"{1 / r:.1f}x {less} than"
    return "about the same as"


def mem_phrase(a: int, b: int, other: str) -> str:
    """``'12.0x less than math'``; when either figure is too small for a ratio, which is less and the other's
    figure: ``'less than math's 0.4 MB'``."""
    if a < MIN_RATIO_BYTES or b < MIN_RATIO_BYTES:
        if a == b:
            return f"the same as {other}'s {mb_text(b)}"
        return f"{'less' if a < b else 'more'} than {other}'s {mb_text(b)}"
    r = b / a
    if r >= 1.05:
        return f"{r:.1f}x less than {other}"
    if r <= 1 / 1.05:
        return f"{1 / r:.1f}x more than {other}"
    return f"about the same as {other}"


# -- plots ----------------------------------------------------------------------------------------


def _series(cs: list[dict], key: str, name_of) -> dict[str, list[tuple[int, float]]]:
    """``name -> [(N, value), ...]`` sorted by N, of the cases whose ``key`` is positive."""
    by: dict[str, list[tuple[int, float]]] = {}
    for c in cs:
        val = c[key]
        if val is not None and val > 0:
            by.setdefault(name_of(c), []).append((c["N"], val))
    return {k: sorted(v) for k, v in by.items()}


def line_plot(plt, out_dir: str, fname: str, title: str, panels, name_of=lambda c: c["name"]) -> list[str]:
    """One figure of log-log panels: ``key`` x ``scale`` against N, a line per name.

    ``panels`` is a list of ``(title, cases, key, ylabel, scale)``, or a list of such lists
    (rows of a grid). Writes ``out_dir/fname`` and returns ``[fname]``; returns ``[]`` (no
    file) when no case has the figure.
    """
    grid = panels if panels and isinstance(panels[0], list) else [panels]
    grid = [[p for p in row if _series(p[1], p[2], name_of)] for row in grid]
    grid = [row for row in grid if row]
    if not grid:
        return []
    cols = max(len(row) for row in grid)
    fig, axes = plt.subplots(len(grid), cols, figsize=(4.6 * cols, 3.6 * len(grid)), squeeze=False)
    for r, row in enumerate(grid):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(row):
                ax.axis("off")
                continue
            sub, cs, key, ylabel, scale = row[c]
            for name, pts in _series(cs, key, name_of).items():
                ax.plot([p[0] for p in pts], [p[1] * scale for p in pts], marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.set_title(sub, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, fname), dpi=90)
    plt.close(fig)
    return [fname]


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated by another (lower x and higher y are better)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


__all__ = ["MASK_WORDS", "MIN_RATIO_BYTES", "MODE_WORDS", "clip", "is_ok", "line_plot", "mb_cell", "mb_text",
           "mem_phrase", "mode_pairs", "ms_cell", "ms_text", "notes_cell", "num", "pareto_front", "ratio_text",
           "render_table", "text_table", "times_phrase"]
