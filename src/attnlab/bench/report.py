"""Turning a results dict into a terminal summary, ``report.md``, ``report.html`` and plots.

Generic: the suites' rows, verdicts, sections and plots come from the suites. The report
shows before it tells: first the short "which attention to use" table (each suite's rows,
compared against what a user would otherwise use), then the suites' key plots, then the
details — the verdicts as a table, the machine, each suite's section, every plot, the
notes — in collapsible sections of the HTML page.

The report is first built as a list of sections (headings, paragraphs, lists, tables, images,
collapsible details, each a tuple such as ``("h2", title)``: :func:`sections`) and then
rendered to Markdown and to a self-contained HTML page whose plots are embedded as base64
``data:`` URIs (no network needed to view it). Plots use matplotlib, imported lazily;
without it they are skipped with a note naming the ``pip install`` line. The cells, tables
and phrases come from :mod:`attnlab.bench.format`, a floor below the suites.
"""

from __future__ import annotations

import base64
import html
import os

from .format import num, render_table, text_table
from .suites import suites

MATPLOTLIB_HINT = "pip install matplotlib"

#: the columns of the "which attention to use" table
DECISION_HEAD = ["situation", "use", "measured gain", "compared with"]


def decision_table(results: dict, chosen: list) -> tuple[list[str], list[list[str]]]:
    """The short answer: one row per measured situation, what to use, the gain, what it is compared with.

    Each suite of ``chosen`` (the run's, in report order) contributes its rows
    (:meth:`attnlab.bench.suite.Suite.decision_rows`) from its own records.
    """
    rows: list[list[str]] = []
    for suite in chosen:
        rows += suite.decision_rows(suite.own(results["cases"]))
    return DECISION_HEAD, rows


def _chosen(results: dict) -> list:
    every = suites()
    return [every[n] for n in results["settings"]["suites"] if n in every]


def _headline_tables(results: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """The suites' tables shown right under the decision table (the arena's accuracy, one row per contender)."""
    return [t for s in _chosen(results) for t in s.headline_tables(results)]


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
    for caption, head, rows in _headline_tables(results):
        out += [caption, text_table(head, rows), ""]
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


def sections(results: dict) -> list[tuple]:
    """The report as sections: ("h1"|"h2"|"p", text), ("ul", items), ("table", head, rows), ("img", file),
    ("details", summary, sections) — a collapsible one."""
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
    for caption, head, rows in _headline_tables(results):
        b += [("p", caption), ("table", head, rows)]
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
        own = suite.report_sections(results)
        if own:
            title = own[0][1] if own[0][0] == "h2" else suite.name
            b.append(("details", title, own[1:] if own[0][0] == "h2" else own))
    rest = [f for f in results["plots"] if f not in key]
    if rest:
        b.append(("details", "Every plot", [("img", f) for f in rest]))
    b.append(("details", "Machine and ceilings", [("ul", _machine_items(results))]))
    if results["notes"]:
        b.append(("details", "Notes", [("ul", list(results["notes"]))]))
    return b


def to_markdown(secs: list[tuple]) -> str:
    """Render sections as Markdown (images linked by relative file name; a collapsible section is a heading)."""
    out = []
    for sec in secs:
        kind = sec[0]
        if kind == "h1":
            out.append(f"# {sec[1]}\n")
        elif kind in ("h2", "details"):
            out.append(f"## {sec[1]}\n")
            if kind == "details":
                out.append(to_markdown(sec[2]))
        elif kind == "p":
            out.append(f"{sec[1]}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {x}" for x in sec[1]) + "\n")
        elif kind == "table":
            out.append(render_table(sec[1], sec[2], "markdown") + "\n")
        elif kind == "img":
            out.append(f"![{sec[1]}]({sec[1]})\n")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.6em 0}td,th{border:1px solid #ccc;padding:3px 7px}
th{background:#f2f2f2}td{text-align:right}td:first-child,td:last-child{text-align:left}
img{max-width:100%;display:block;margin:0.6em 0}h2{border-bottom:1px solid #ddd;margin-top:1em}
h1{font-size:1.5em;margin:0.2em 0}details{margin:0.4em 0}summary{cursor:pointer;font-weight:600;font-size:1.1em}
.glance{display:flex;flex-wrap:wrap;gap:1em}.glance img{max-width:48%}"""


def _html_sections(secs: list[tuple], out_dir: str) -> list[str]:
    e = html.escape
    out: list[str] = []
    imgs: list[str] = []
    for sec in secs + [("end",)]:
        kind = sec[0]
        if kind != "img" and imgs:  # consecutive images sit side by side
            out.append('<div class="glance">' + "".join(imgs) + "</div>")
            imgs = []
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{e(sec[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{e(sec[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in sec[1]) + "</ul>")
        elif kind == "table":
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in sec[2])
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in sec[1]) + f"</tr>{rows}</table>")
        elif kind == "img":
            with open(os.path.join(out_dir, sec[1]), "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
            imgs.append(f'<img alt="{e(sec[1])}" src="data:image/png;base64,{data}">')
        elif kind == "details":
            out.append(f"<details><summary>{e(sec[1])}</summary>" + "".join(_html_sections(sec[2], out_dir))
                       + "</details>")
    return out


def to_html(secs: list[tuple], out_dir: str) -> str:
    """Render sections as one self-contained HTML page (plots inlined as base64 PNG, details collapsed)."""
    return "\n".join(["<!DOCTYPE html>", '<html><head><meta charset="utf-8"><title>attnlab bench</title>',
                      f"<style>{_CSS}</style></head><body>", *_html_sections(secs, out_dir), "</body></html>"])


def write_reports(results: dict, out_dir: str) -> None:
    """Write ``report.md`` and ``report.html`` into ``out_dir``."""
    secs = sections(results)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(to_markdown(secs))
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(to_html(secs, out_dir))


__all__ = ["DECISION_HEAD", "decision_table", "make_plots", "sections", "terminal_summary", "to_html", "to_markdown",
           "write_reports"]
