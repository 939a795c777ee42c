"""Turning a results dict into a terminal summary, ``report.md``, ``report.html`` and plots.

Generic: the suites' rows, verdicts, sections and plots come from the suites. The report
shows before it tells: first the short "which attention to use" table (each suite's rows,
compared against what a user would otherwise use), then the suites' key plots, then the
details — the verdicts as a table, the machine, each suite's section, every plot, the
notes — in collapsible sections of the HTML page.

The report is first built as a list of blocks (headings, paragraphs, lists, tables, images,
collapsible sections) and then rendered to Markdown and to a self-contained HTML page whose
plots are embedded as base64 ``data:`` URIs (no network needed to view it). Plots use
matplotlib, imported lazily; without it they are skipped with a note naming the
``pip install`` line.
"""

from __future__ import annotations

import base64
import html
import os

from .suite import suites
from .tables import render_table
from .verdict import decision_table

MATPLOTLIB_HINT = "pip install matplotlib"


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


def reasons(*cs: dict | None) -> str:
    """The distinct reasons and notes of the given cases, joined."""
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


def text_table(head: list[str], rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal (the Markdown report renders its tables alike)."""
    return render_table(head, rows, "text")


def _chosen(results: dict) -> list:
    every = suites()
    return [every[n] for n in results["settings"]["suites"] if n in every]


def _headline(results: dict) -> list[str]:
    """Texts of the verdicts of headline suites (the arena), which the report shows first."""
    heads = {s.name for s in _chosen(results) if s.headline}
    return [v["text"] for v in results["verdicts"] if v["suite"] in heads]


def terminal_summary(results: dict) -> str:
    """What ``attnlab bench`` prints at the end: the decision table, the headline verdicts, each suite's tables."""
    out = []
    dhead, drows = decision_table(results, _chosen(results))
    if drows:
        out += ["which attention to use, measured on this machine:", text_table(dhead, drows), ""]
    headline = _headline(results)
    if headline:
        out += ["accuracy at length (the arena):"] + [f"  - {t}" for t in headline] + [""]
    ce = results["ceilings"]
    mm = ", ".join(f"{k} {v:,.0f} GFLOP/s" for k, v in ce.get("matmul_gflops", {}).items() if v)
    if mm or ce.get("copy_gbps"):
        out.append(f"ceilings: matmul {mm}; copy {num(ce.get('copy_gbps'), ',.1f')} GB/s")
    for suite in _chosen(results):
        out += suite.summary_lines(results)
    details = [v["text"] for v in results["verdicts"] if v["text"] not in headline]
    if details:
        out += ["", "details:"] + [f"  - {t}" for t in details]
    return "\n".join(out)


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


def make_plots(results: dict, out_dir: str) -> tuple[list[str], list[str], list[str]]:
    """Write the chosen suites' PNG plots; returns (file names, the key ones shown first, notes)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], [], [f"plots skipped: matplotlib is not installed ({MATPLOTLIB_HINT})"]
    files: list[str] = []
    key: list[str] = []
    for suite in _chosen(results):
        mine = [c for c in suite.own(results["cases"]) if c["status"] == "ok"]
        got = suite.plots(results, mine, out_dir, plt)
        files += got
        key += suite.key_plots(got)
    return files, key, []


# -- the report document ------------------------------------------------------------------------


def _machine_items(results: dict) -> list[str]:
    m, ce = results["machine"], results["ceilings"]
    mem = m.get("memory_total_bytes")
    items = [f"CPU: {m['cpu_model']} ({m['logical_cpus']} logical CPUs, {m.get('physical_cores') or '?'} physical "
             f"cores, torch threads {m.get('torch_threads')})",
             f"memory: {mem / 2**30:.1f} GiB" if mem else "memory: unknown",
             f"device: {m['device']} ({m.get('device_name', '')})",
             f"python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, attnlab {m['attnlab']}"]
    items += [f"matmul {k} ({ce.get('matmul_size', {}).get(k)}²): " + (f"{v:,.1f} GFLOP/s" if v else "not measured")
              for k, v in ce.get("matmul_gflops", {}).items()]
    items.append(f"copy ({num(ce.get('copy_bytes') and ce['copy_bytes'] / 2**20, ',.0f')} MiB): "
                 f"{num(ce.get('copy_gbps'), ',.1f')} GB/s (read + write)")
    if ce.get("reason"):
        items.append(f"ceilings failed: {ce['reason']}")
    return items


def blocks(results: dict) -> list[tuple]:
    """The report as blocks: ("h1"|"h2"|"p", text), ("ul", items), ("table", head, rows), ("img", file),
    ("details", summary, blocks) — a collapsible section."""
    st = results["settings"]
    chosen = _chosen(results)
    b: list[tuple] = [("h1", f"attnlab bench — {results['created']}"),
                      ("p", f"Profile {st['profile']}, suites {', '.join(st['suites'])}, device {st['device']}, "
                            f"dtype {st['dtype']}, {results['elapsed_s']:.0f} s in all, on "
                            f"{results['machine']['cpu_model']}.")]
    dhead, drows = decision_table(results, chosen)
    headline = _headline(results)
    if drows or headline:
        b.append(("h2", "Which attention to use"))
        b.append(("p", "Measured on this machine by this run. Exact attention is compared with SDPA "
                       "(torch.nn.functional.scaled_dot_product_attention, what a PyTorch user would otherwise call); "
                       "an approximation with exact attention, at its measured accuracy."))
        if drows:
            b.append(("table", dhead, drows))
    key = [f for f in results.get("key_plots", []) if f in results["plots"]]
    if key:  # the plots right under the table: the first screen shows before it tells
        b.append(("h2", "At a glance"))
        b += [("img", f) for f in key]
    if headline:
        b.append(("h2", "In words"))
        b.append(("ul", headline))
    details = [v for v in results["verdicts"] if v["text"] not in headline]
    if details:
        b.append(("details", "Every verdict", [("table", ["suite", "verdict"],
                                                [[v["suite"], v["text"]] for v in details])]))
    for suite in chosen:
        section = suite.report_blocks(results)
        if section:
            title = section[0][1] if section[0][0] == "h2" else suite.name
            b.append(("details", title, section[1:] if section[0][0] == "h2" else section))
    rest = [f for f in results["plots"] if f not in key]
    if rest:
        b.append(("details", "Every plot", [("img", f) for f in rest]))
    b.append(("details", "Machine and ceilings", [("ul", _machine_items(results))]))
    if results["notes"]:
        b.append(("details", "Notes", [("ul", list(results["notes"]))]))
    return b


def to_markdown(bs: list[tuple]) -> str:
    """Render blocks as Markdown (images linked by relative file name; a collapsible section is a heading)."""
    out = []
    for blk in bs:
        kind = blk[0]
        if kind == "h1":
            out.append(f"# {blk[1]}\n")
        elif kind in ("h2", "details"):
            out.append(f"## {blk[1]}\n")
            if kind == "details":
                out.append(to_markdown(blk[2]))
        elif kind == "p":
            out.append(f"{blk[1]}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {x}" for x in blk[1]) + "\n")
        elif kind == "table":
            out.append(render_table(blk[1], blk[2], "markdown") + "\n")
        elif kind == "img":
            out.append(f"![{blk[1]}]({blk[1]})\n")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.6em 0}td,th{border:1px solid #ccc;padding:3px 7px}
th{background:#f2f2f2}td{text-align:right}td:first-child,td:last-child{text-align:left}
img{max-width:100%;display:block;margin:0.6em 0}h2{border-bottom:1px solid #ddd;margin-top:1em}
h1{font-size:1.5em;margin:0.2em 0}details{margin:0.4em 0}summary{cursor:pointer;font-weight:600;font-size:1.1em}
.glance{display:flex;flex-wrap:wrap;gap:1em}.glance img{max-width:48%}"""


def _html_blocks(bs: list[tuple], out_dir: str) -> list[str]:
    e = html.escape
    out: list[str] = []
    imgs: list[str] = []
    for blk in bs + [("end",)]:
        kind = blk[0]
        if kind != "img" and imgs:  # consecutive images sit side by side
            out.append('<div class="glance">' + "".join(imgs) + "</div>")
            imgs = []
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{e(blk[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{e(blk[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in blk[1]) + "</ul>")
        elif kind == "table":
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in blk[2])
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in blk[1]) + f"</tr>{rows}</table>")
        elif kind == "img":
            with open(os.path.join(out_dir, blk[1]), "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
            imgs.append(f'<img alt="{e(blk[1])}" src="data:image/png;base64,{data}">')
        elif kind == "details":
            out.append(f"<details><summary>{e(blk[1])}</summary>" + "".join(_html_blocks(blk[2], out_dir))
                       + "</details>")
    return out


def to_html(bs: list[tuple], out_dir: str) -> str:
    """Render blocks as one self-contained HTML page (plots inlined as base64 PNG, details collapsed)."""
    return "\n".join(["<!DOCTYPE html>", '<html><head><meta charset="utf-8"><title>attnlab bench</title>',
                      f"<style>{_CSS}</style></head><body>", *_html_blocks(bs, out_dir), "</body></html>"])


def write_reports(results: dict, out_dir: str) -> None:
    """Write ``report.md`` and ``report.html`` into ``out_dir``."""
    bs = blocks(results)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(to_markdown(bs))
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(to_html(bs, out_dir))


__all__ = ["blocks", "clip", "line_plot", "make_plots", "mb_cell", "mode_pairs", "ms_cell", "num", "pareto_front",
           "reasons", "terminal_summary", "text_table", "to_html", "to_markdown", "write_reports"]
