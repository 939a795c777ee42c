"""Turning a results dict into a terminal table, ``report.md``, ``report.html`` and plots.

The report is first built as a list of blocks (headings, paragraphs, lists, tables,
images) and then rendered to Markdown and to a self-contained HTML page whose plots
are embedded as base64 ``data:`` URIs (no network needed to view it). Plots use
matplotlib, imported lazily; without it they are skipped with a note naming the
``pip install`` line.
"""

from __future__ import annotations

import base64
import html
import os

from .tables import render_table

MATPLOTLIB_HINT = "pip install matplotlib"


# -- cells ------------------------------------------------------------------------------------


def _ms(c: dict | None) -> str:
    if c is None:
        return ""
    if c["status"] != "ok":
        return c["status"]
    return f"{c['time_s'] * 1e3:,.2f}" if c["time_s"] < 1 else f"{c['time_s'] * 1e3:,.0f}"


def _mb(c: dict | None) -> str:
    if c is None or c["status"] != "ok":
        return ""
    return "n/a" if c["peak_bytes"] is None else f"{c['peak_bytes'] / 2**20:,.1f}"


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _clip(text: str, width: int | None) -> str:
    """``text`` cut to ``width`` characters (ending in ``...``); None keeps it whole."""
    return text[: width - 3] + "..." if width and len(text) > width else text


def _reason(*cs: dict | None) -> str:
    seen = []
    for c in cs:
        if c is None:
            continue
        for r in (c.get("reason"), c.get("note"), *c.get("notes", [])):
            if r and r not in seen:
                seen.append(r)
    return "; ".join(seen)


def _pairs(results: dict, suite: str, kind: str | None = None) -> list[tuple[dict | None, dict | None]]:
    """(fwd, fwd_bwd) records of the same case, in run order."""
    rows: dict[tuple, list] = {}
    for c in results["cases"]:
        if c["suite"] != suite or (kind is not None and c["kind"] != kind):
            continue
        key = (c["kind"], c["name"], c["mask"], c["N"])
        rows.setdefault(key, [None, None])[0 if c["mode"] == "fwd" else 1] = c
    return [tuple(v) for v in rows.values()]  # type: ignore[misc]


def kernel_rows(results: dict, kind: str = "backend", width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the kernels table (one row per backend x mask x N)."""
    head = ["backend", "mask", "N", "fwd ms", "fwd MB", "fwd+bwd ms", "fwd+bwd MB", "fwd GFLOP/s",
            "% of matmul", "max rel err", "notes"]
    rows = []
    for f, b in _pairs(results, "kernels", kind):
        c = f or b
        note = _reason(f, b)
        if c.get("chosen") or (b or {}).get("chosen"):
            note = f"chose {(f or {}).get('chosen') or (b or {}).get('chosen')}" + (f"; {note}" if note else "")
        rows.append([c["name"], c["mask"], str(c["N"]), _ms(f), _mb(f), _ms(b), _mb(b),
                     _num(f and f["gflops"], ",.1f"), _num(f and f["frac_of_ceiling"] and 100 * f["frac_of_ceiling"], ".1f"),
                     _num(f and f["error"], ".1e"), _clip(note, width)])
    return head, rows


def _real(c: dict | None) -> str:
    """The real-activation errors of a mechanisms case, by source (numbers only; reasons go to the notes)."""
    real = (c or {}).get("real_error") or {}
    return "; ".join(f"{src.split(' ')[0]} {v:.2%}" for src, v in real.items() if isinstance(v, (int, float)))


def real_sources(results: dict) -> str:
    """The sources of the mechanisms suite's real-activation errors, each measured or why not."""
    seen: dict[str, str] = {}
    for c in results["cases"]:
        for src, v in ((c.get("real_error") or {}).items() if c["suite"] == "mechanisms" else ()):
            if isinstance(v, (int, float)) or src not in seen:
                seen[src] = "measured" if isinstance(v, (int, float)) else str(v)
    if not seen:
        return "none measured"
    return "; ".join(src if why == "measured" else f"{src}: not measured ({why})" for src, why in seen.items())


def mechanism_rows(results: dict, width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the mechanisms table (one row per mechanism x N)."""
    head = ["mechanism", "N", "settings", "fwd ms", "fwd MB", "fwd+bwd ms", "fwd+bwd MB", "cost GFLOP",
            "cost MB", "rel err (random)", "rel err (real q, k, v)", "notes"]
    rows = []
    for f, b in _pairs(results, "mechanisms"):
        c = f or b
        cost = (f or b).get("cost") or {}
        note = _clip(_reason(f, b), width)
        settings = ", ".join(f"{k}={v}" for k, v in c["settings"].items())
        rows.append([c["name"], str(c["N"]), settings, _ms(f), _mb(f), _ms(b), _mb(b),
                     _num(cost.get("flops") and cost["flops"] / 1e9, ",.2f"),
                     _num(cost.get("bytes") and cost["bytes"] / 2**20, ",.1f"), _num(f and f["error"], ".2%"),
                     _real(f), note])
    return head, rows


def generate_rows(results: dict, width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the generate table (one row per case: with / without the KV cache)."""
    head = ["case", "prompt", "new tokens", "seconds", "tokens/s", "peak MB", "speedup", "same tokens", "notes"]
    rows = []
    for c in results["cases"]:
        if c["suite"] != "generate":
            continue
        st = c["settings"]
        ok = c["status"] == "ok"
        match = c.get("tokens_match")
        note = _clip(_reason(c), width)
        rows.append([c["name"], str(st["prompt_len"]), str(st["new_tokens"]),
                     _num(c["time_s"], ",.3f") if ok else c["status"], _num(c.get("tokens_per_s"), ",.1f"), _mb(c),
                     _num(c.get("speedup"), ".1f") + ("x" if c.get("speedup") else ""),
                     "" if match is None else ("yes" if match else "NO"), note])
    return head, rows


def _score_cell(c: dict) -> str:
    if c.get("score") is None:
        return ""
    if c.get("score_name") == "bits_per_char":
        return f"{c['score']:.3f} bpc"
    return f"{100 * c['score']:.1f} %"


def _x(v: float | None) -> str:
    return "" if v is None else (f"{v:.2f}x" if v < 10 else f"{v:.0f}x")


def task_rows(results: dict, width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the arena table (one row per contender x task x N)."""
    head = ["mechanism", "task", "N", "steps", "score", "vs exact", "mem vs naive", "mem vs lean", "tokens/s",
            "to 90 % s", "act. error", "peak MB", "settings", "notes"]
    rows = []
    for c in results["cases"]:
        if c["suite"] != "tasks":
            continue
        st = c["settings"]
        ok = c["status"] == "ok"
        note = _clip(_reason(c), width)
        settings = ", ".join(f"{k}={v}" for k, v in st["mechanism_settings"].items() if k not in ("seed", "max_len"))
        ratio = c.get("score_ratio")
        if c["name"] == "exact-naive" and ok:
            score, vs = "(cost only)", "same function"
        else:
            score = _score_cell(c) if ok else c["status"]
            vs = "" if ratio is None else f"{ratio:.0%}"
        reach = c.get("time_to_reach_s")
        rows.append([c["name"], st["task"], str(c["N"]), str(c.get("steps", st["steps"])), score, vs,
                     _x(c.get("mem_vs_naive")), _x(c.get("mem_vs_lean")), _num(c.get("tokens_per_s"), ",.0f"),
                     _num(reach, ",.0f") if reach is not None else ("never" if ok and ratio is not None else ""),
                     _num(c.get("activation_error"), ".3f"), _mb(c) if ok else "", settings, note])
    return head, rows


def text_table(head: list[str], rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal (the Markdown report renders its tables alike)."""
    return render_table(head, rows, "text")


def _headline(results: dict) -> list[str]:
    """Texts of the verdicts of headline suites (the arena), which the report shows first."""
    from .suite import suites

    heads = {n for n, su in suites().items() if su.headline}
    return [v["text"] for v in results["verdicts"] if v["suite"] in heads]


def terminal_summary(results: dict) -> str:
    """What ``attnlab bench`` prints at the end: the decision table, each suite's tables, the verdicts."""
    from .suite import suites
    from .verdict import decision_table

    out = []
    dhead, drows = decision_table(results["cases"])
    if drows:
        out += ["which attention to use, measured on this machine:", text_table(dhead, drows), ""]
    headline = _headline(results)
    if headline:
        out += ["accuracy at length (the arena):"] + [f"  - {t}" for t in headline] + [""]
    ce = results["ceilings"]
    mm = ", ".join(f"{k} {v:,.0f} GFLOP/s" for k, v in ce.get("matmul_gflops", {}).items() if v)
    if mm or ce.get("copy_gbps"):
        out.append(f"ceilings: matmul {mm}; copy {_num(ce.get('copy_gbps'), ',.1f')} GB/s")
    for suite in suites().values():
        out += suite.summary_lines(results)
    details = [v["text"] for v in results["verdicts"] if v["text"] not in headline]
    if details:
        out += ["", "details:"] + [f"  - {t}" for t in details]
    return "\n".join(out)


# -- plots ----------------------------------------------------------------------------------------


def _series(cs: list[dict], key: str) -> dict[str, list[tuple[int, float]]]:
    """``name -> [(N, value), ...]`` sorted by N, of the cases whose ``key`` is positive."""
    by: dict[str, list[tuple[int, float]]] = {}
    for c in cs:
        val = c[key]
        if val is not None and val > 0:
            by.setdefault(c["name"], []).append((c["N"], val))
    return {k: sorted(v) for k, v in by.items()}


def line_plot(plt, out_dir: str, fname: str, title: str, key: str, ylabel: str, groups: dict[str, list[dict]],
              scale: float = 1.0) -> list[str]:
    """One figure with a log-log panel per group (``title -> cases``): ``key`` against N, a line per name.

    Writes ``out_dir/fname`` and returns ``[fname]``; returns ``[]`` (no file) when no case has the figure.
    """
    if not any(_series(cs, key) for cs in groups.values()):
        return []
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    for ax, (sub, cs) in zip(axes[0], groups.items()):
        for name, pts in _series(cs, key).items():
            ax.plot([p[0] for p in pts], [p[1] * scale for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(ylabel)
        ax.set_title(sub)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, fname), dpi=90)
    plt.close(fig)
    return [fname]


def make_plots(results: dict, out_dir: str) -> tuple[list[str], list[str]]:
    """Write every suite's PNG plots (:meth:`~attnlab.bench.suite.Suite.plots`); returns (file names, notes)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], [f"plots skipped: matplotlib is not installed ({MATPLOTLIB_HINT})"]
    from .suite import suites

    files: list[str] = []
    cases = [c for c in results["cases"] if c["status"] == "ok"]
    for suite in suites().values():
        files += suite.plots(results, cases, out_dir, plt)
    return files, []


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated by another (lower x and higher y are better)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def arena_plots(cases: list[dict], out_dir: str, plt) -> list[str]:
    """Per arena task and N: score vs training time, and score ratio vs memory ratio (Pareto front)."""
    files = []
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        if c["suite"] == "tasks" and c["status"] == "ok" and c.get("score") is not None and c["time_s"]:
            groups.setdefault((c["settings"]["task"], c["N"]), []).append(c)
    for (task, n), cs in groups.items():
        tag = f"{task.replace('-', '_')}_{n}"
        lower = cs[0].get("score_name") == "bits_per_char"
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for c in (c for c in cs if c["name"] != "exact-naive"):
            y = c["score"] if lower else 100 * c["score"]
            ax.scatter(c["time_s"], y, s=40, color="black" if c["name"] == "exact" else None)
            ax.annotate(c["name"], (c["time_s"], y), fontsize=8, xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel("training time, s")
        ax.set_ylabel("bits per char (lower is better)" if lower else "test accuracy, %")
        ax.set_title(f"arena: {task} at N={n}, score vs training time")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fname = f"tasks_{tag}.png"
        fig.savefig(os.path.join(out_dir, fname), dpi=90)
        plt.close(fig)
        files.append(fname)
        pts = [c for c in cs if c.get("score_ratio") is not None and c.get("mem_vs_naive")]
        if len(pts) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        xy = [(c["mem_vs_naive"], c["score_ratio"]) for c in pts]
        front = pareto_front(xy)
        for i, c in enumerate(pts):
            ax.scatter(*xy[i], s=40, color="black" if c["name"] == "exact" else ("tab:red" if i in front else "tab:blue"))
            ax.annotate(c["name"], xy[i], fontsize=8, xytext=(4, 3), textcoords="offset points")
        ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], color="tab:red", alpha=0.5, label="Pareto front")
        ax.axhline(0.9, color="gray", ls="--", lw=1, label="90 % of exact")
        ax.set_xscale("log")
        ax.set_xlabel("peak training memory / naive exact's (log)")
        ax.set_ylabel("score / exact's")
        ax.set_title(f"arena: {task} at N={n}, accuracy kept vs memory")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fname = f"pareto_{tag}.png"
        fig.savefig(os.path.join(out_dir, fname), dpi=90)
        plt.close(fig)
        files.append(fname)
    return files


# -- the report document ------------------------------------------------------------------------


def blocks(results: dict) -> list[tuple]:
    """The report as blocks: ("h1"|"h2"|"p", text), ("ul", items), ("table", head, rows), ("img", file)."""
    m, ce, st = results["machine"], results["ceilings"], results["settings"]
    b: list[tuple] = [("h1", f"attnlab bench — {results['created']}")]
    b.append(("p", f"Profile {st['profile']}, suites {', '.join(st['suites'])}, device {st['device']}, "
                   f"dtype {st['dtype']}, {results['elapsed_s']:.0f} s in all."))
    b.append(("h2", "Machine"))
    mem = m.get("memory_total_bytes")
    b.append(("ul", [f"CPU: {m['cpu_model']} ({m['logical_cpus']} logical CPUs, "
                     f"{m.get('physical_cores') or '?'} physical cores, torch threads {m.get('torch_threads')})",
                     f"memory: {mem / 2**30:.1f} GiB" if mem else "memory: unknown",
                     f"device: {m['device']} ({m.get('device_name', '')})",
                     f"python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, attnlab {m['attnlab']}"]))
    b.append(("h2", "Ceilings"))
    items = [f"matmul {k} ({ce.get('matmul_size', {}).get(k)}²): "
             + (f"{v:,.1f} GFLOP/s" if v else "not measured") for k, v in ce.get("matmul_gflops", {}).items()]
    items.append(f"copy ({_num(ce.get('copy_bytes') and ce['copy_bytes'] / 2**20, ',.0f')} MiB): "
                 f"{_num(ce.get('copy_gbps'), ',.1f')} GB/s (read + write)")
    if ce.get("reason"):
        items.append(f"ceilings failed: {ce['reason']}")
    b.append(("ul", items))
    from .suite import suites
    from .verdict import decision_table

    dhead, drows = decision_table(results["cases"])
    arena = _headline(results)
    if drows or arena:
        b.insert(1, ("h2", "Which attention to use"))
        at = 2
        if drows:
            b.insert(at, ("p", "Measured on this machine by this run. Exact rows compare backends of the same exact "
                               "attention; training rows come from the arena below."))
            b.insert(at + 1, ("table", dhead, drows))
            at += 2
        if arena:
            b.insert(at, ("ul", arena))
    details = [v["text"] for v in results["verdicts"] if v["text"] not in arena]
    if details:
        b.append(("h2", "Details"))
        b.append(("ul", details))
    for suite in suites().values():
        b += suite.report_blocks(results)
    if results["plots"]:
        b.append(("h2", "Plots"))
        for f in results["plots"]:
            b.append(("img", f))
    if results["notes"]:
        b.append(("h2", "Notes"))
        b.append(("ul", list(results["notes"])))
    return b


def to_markdown(bs: list[tuple]) -> str:
    """Render blocks as Markdown (images linked by relative file name)."""
    out = []
    for blk in bs:
        kind = blk[0]
        if kind == "h1":
            out.append(f"# {blk[1]}\n")
        elif kind == "h2":
            out.append(f"## {blk[1]}\n")
        elif kind == "p":
            out.append(f"{blk[1]}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {x}" for x in blk[1]) + "\n")
        elif kind == "table":
            out.append(render_table(blk[1], blk[2], "markdown") + "\n")
        elif kind == "img":
            out.append(f"![{blk[1]}]({blk[1]})\n")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px}
th{background:#f2f2f2}td{text-align:right}td:first-child,td:last-child{text-align:left}
img{max-width:100%;display:block;margin:1em 0}h2{border-bottom:1px solid #ddd}"""


def to_html(bs: list[tuple], out_dir: str) -> str:
    """Render blocks as one self-contained HTML page (plots inlined as base64 PNG)."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8"><title>attnlab bench</title>',
           f"<style>{_CSS}</style></head><body>"]
    for blk in bs:
        kind = blk[0]
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
            out.append(f'<img alt="{e(blk[1])}" src="data:image/png;base64,{data}">')
    out.append("</body></html>")
    return "\n".join(out)


def write_reports(results: dict, out_dir: str) -> None:
    """Write ``report.md`` and ``report.html`` into ``out_dir``."""
    bs = blocks(results)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(to_markdown(bs))
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(to_html(bs, out_dir))


__all__ = ["arena_plots", "blocks", "generate_rows", "kernel_rows", "line_plot", "make_plots", "mechanism_rows",
           "pareto_front", "real_sources", "task_rows", "terminal_summary", "text_table", "to_html", "to_markdown",
           "write_reports"]
