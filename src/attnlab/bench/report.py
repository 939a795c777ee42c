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
from .verdict import MODE_WORDS

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


def _real_sources(results: dict) -> str:
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


def terminal_summary(results: dict) -> str:
    """What ``attnlab bench`` prints at the end: tables and verdicts."""
    out = []
    from .verdict import decision_table

    dhead, drows = decision_table(results["cases"])
    if drows:
        out += ["which attention to use, measured on this machine:", text_table(dhead, drows), ""]
    arena = [v for v in results["verdicts"] if v["suite"] == "tasks"]
    if arena:
        out += ["accuracy at length (the arena):"] + [f"  - {v['text']}" for v in arena] + [""]
    ce = results["ceilings"]
    mm = ", ".join(f"{k} {v:,.0f} GFLOP/s" for k, v in ce.get("matmul_gflops", {}).items() if v)
    if mm or ce.get("copy_gbps"):
        out.append(f"ceilings: matmul {mm}; copy {_num(ce.get('copy_gbps'), ',.1f')} GB/s")
    if any(c["suite"] == "kernels" and c["kind"] == "backend" for c in results["cases"]):
        out += ["", "kernels (time ms, peak MB beyond inputs):", text_table(*kernel_rows(results, width=60))]
    if any(c["kind"] == "layer" for c in results["cases"]):
        out += ["", "layers:", text_table(*kernel_rows(results, "layer", width=60))]
    if any(c["suite"] == "mechanisms" for c in results["cases"]):
        out += ["", "mechanisms:", text_table(*mechanism_rows(results, width=60))]
    if any(c["suite"] == "generate" for c in results["cases"]):
        out += ["", "generate (greedy, CausalLM):", text_table(*generate_rows(results, width=60))]
    if any(c["suite"] == "tasks" for c in results["cases"]):
        out += ["", "tasks (each mechanism trained from scratch, same seed, data and steps):",
                text_table(*task_rows(results, width=60))]
    if results["auto_vs_sdpa"]:
        out += ["", "auto / sdpa time: " + ", ".join(
            f"{r['mask']} N={r['N']} {r['mode']}: {r['ratio']:.2f}" for r in results["auto_vs_sdpa"])]
    details = [v for v in results["verdicts"] if v["suite"] != "tasks"]
    if details:
        out += ["", "details:"] + [f"  - {v['text']}" for v in details]
    return "\n".join(out)


# -- plots ----------------------------------------------------------------------------------------


def make_plots(results: dict, out_dir: str) -> tuple[list[str], list[str]]:
    """Write the PNG plots; returns (file names, notes)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], [f"plots skipped: matplotlib is not installed ({MATPLOTLIB_HINT})"]
    files: list[str] = []
    cases = [c for c in results["cases"] if c["status"] == "ok"]

    def series(cs, key):
        by: dict[str, list[tuple[int, float]]] = {}
        for c in cs:
            val = c[key]
            if val is not None and val > 0:
                by.setdefault(c["name"], []).append((c["N"], val))
        return {k: sorted(v) for k, v in by.items()}

    def line_plot(fname, title, key, ylabel, groups, scale=1.0):
        if not any(series(cs, key) for cs in groups.values()):
            return
        fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
        for ax, (sub, cs) in zip(axes[0], groups.items()):
            for name, pts in series(cs, key).items():
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
        files.append(fname)

    kern = [c for c in cases if c["suite"] == "kernels" and c["kind"] == "backend"]
    for mask in dict.fromkeys(c["mask"] for c in kern):
        groups = {MODE_WORDS[m]: [c for c in kern if c["mask"] == mask and c["mode"] == m] for m in MODE_WORDS}
        line_plot(f"kernels_time_{mask}.png", f"kernels, mask {mask}: time", "time_s", "ms per call", groups, 1e3)
        line_plot(f"kernels_memory_{mask}.png", f"kernels, mask {mask}: peak memory", "peak_bytes",
                  "MB beyond inputs", groups, 1 / 2**20)
    mech = [c for c in cases if c["suite"] == "mechanisms"]
    if mech:
        groups = {MODE_WORDS[m]: [c for c in mech if c["mode"] == m] for m in MODE_WORDS}
        line_plot("mechanisms_time.png", "mechanisms: time", "time_s", "ms per call", groups, 1e3)
        line_plot("mechanisms_memory.png", "mechanisms: peak memory", "peak_bytes", "MB beyond inputs", groups,
                  1 / 2**20)
        pts = [c for c in mech if c["mode"] == "fwd" and c["error"] is not None and c["time_s"]]
        if pts:
            fig, ax = plt.subplots(figsize=(6.5, 4.5))
            for name in dict.fromkeys(c["name"] for c in pts):
                cs = sorted((c for c in pts if c["name"] == name), key=lambda c: c["N"])
                ax.plot([c["time_s"] * 1e3 for c in cs], [max(c["error"], 1e-9) for c in cs], marker="o", label=name)
                for c in cs:
                    ax.annotate(str(c["N"]), (c["time_s"] * 1e3, max(c["error"], 1e-9)), fontsize=7)
            ax.axhline(results["settings"]["max_error"], color="grey", linestyle="--", linewidth=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("forward time, ms (labels: N)")
            ax.set_ylabel("relative error vs exact")
            ax.set_title("mechanisms: error vs cost")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, "mechanisms_error_vs_cost.png"), dpi=90)
            plt.close(fig)
            files.append("mechanisms_error_vs_cost.png")
    gen = [c for c in cases if c["suite"] == "generate" and c.get("tokens_per_s")]
    if gen:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = [f"{c['name']}\nP={c['settings']['prompt_len']} T={c['settings']['new_tokens']}" for c in gen]
        bars = ax.bar(range(len(gen)), [c["tokens_per_s"] for c in gen],
                      color=["tab:blue" if c["name"] == "kv_cache" else "tab:orange" for c in gen])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(gen)), labels, fontsize=8)
        ax.set_ylabel("new tokens per second")
        ax.set_title("generate: greedy CausalLM, with and without the KV cache")
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "generate_tokens_per_s.png"), dpi=90)
        plt.close(fig)
        files.append("generate_tokens_per_s.png")
    files += _arena_plots(cases, out_dir, plt)
    return files, []


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated by another (lower x and higher y are better)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _arena_plots(cases: list[dict], out_dir: str, plt) -> list[str]:
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
    from .verdict import decision_table

    dhead, drows = decision_table(results["cases"])
    arena = [v["text"] for v in results["verdicts"] if v["suite"] == "tasks"]
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
    details = [v["text"] for v in results["verdicts"] if v["suite"] != "tasks"]
    if details:
        b.append(("h2", "Details"))
        b.append(("ul", details))
    if any(c["suite"] == "kernels" and c["kind"] == "backend" for c in results["cases"]):
        b.append(("h2", "Kernels"))
        b.append(("p", "Time is the median per call; memory is the peak allocated beyond the inputs; FLOPs count "
                       "only allowed score elements; error is max|out−ref| / max|ref| against a float64 oracle."))
        b.append(("table", *kernel_rows(results)))
    if results["auto_vs_sdpa"]:
        b.append(("h2", "auto vs sdpa"))
        b.append(("table", ["mask", "N", "mode", "auto ms", "sdpa ms", "auto/sdpa", "auto chose"],
                  [[r["mask"], str(r["N"]), r["mode"], f"{r['auto_s'] * 1e3:,.2f}", f"{r['sdpa_s'] * 1e3:,.2f}",
                    f"{r['ratio']:.2f}", r.get("chosen") or ""] for r in results["auto_vs_sdpa"]]))
    if any(c["kind"] == "layer" for c in results["cases"]):
        b.append(("h2", "Layers"))
        b.append(("p", "attnlab MultiHeadAttention vs torch.nn.MultiheadAttention, same weights; error of attnlab's "
                       "output against torch's."))
        b.append(("table", *kernel_rows(results, "layer")))
    if any(c["suite"] == "mechanisms" for c in results["cases"]):
        b.append(("h2", "Mechanisms"))
        b.append(("p", "Error is ||out−exact||_F / ||exact||_F: on random q, k, v (the hardest case for every "
                       "approximation), and on q, k, v captured from real models (mean over layers): "
                       + _real_sources(results) + ". Cost is the mechanism's own estimate for one forward call."))
        b.append(("table", *mechanism_rows(results)))
    gen = [c for c in results["cases"] if c["suite"] == "generate"]
    if gen:
        st = gen[0]["settings"]
        b.append(("h2", "Generation"))
        b.append(("p", f"Greedy generation of a random CausalLM ({st['layers']} layer{'s' if st['layers'] != 1 else ''}, {st['dim']} wide, "
                       f"{st['heads']} heads, vocabulary {st['vocab_size']}, {st['positional']} positions, batch "
                       f"{st['batch']}): {st['new_tokens']} new tokens after a {st['prompt_len']}-token prompt, "
                       "with the KV cache (each step feeds the new token) and without it (each step recomputes "
                       "the whole prefix). Seconds are the median of whole generations, prompt included; "
                       "tokens/s counts new tokens; memory is the peak allocated beyond the model and prompt; "
                       "speedup is seconds without / with the cache; 'same tokens' compares what both generated."))
        b.append(("table", *generate_rows(results)))
    if any(c["suite"] == "tasks" for c in results["cases"]):
        b.append(("h2", "Arena: accuracy at length"))
        b.append(("p", "Each mechanism trains the same model (2 layers, width 64, 2 heads: the LRA reruns' "
                       "configuration) from scratch on each task, with the same seed, data and steps; only the "
                       "attention differs. Score: test accuracy (chars: validation bits per character). 'vs exact': "
                       "score as a fraction of exact attention's. Memory: peak of the whole training run beyond what "
                       "the process held before, as a ratio to exact through the naive N×N formula (exact-naive, "
                       "which trains a few steps only: it computes the same function) and to memory-lean exact. "
                       "'to 90 %': training seconds until the validation score first reached 90 % of exact's final "
                       "score. 'act. error': max|out−exact| / max|exact| on the trained model's own q, k, v "
                       "(largest over layers). Settings: each mechanism's LRA settings, capped at N/4."))
        b.append(("table", *task_rows(results)))
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


__all__ = ["blocks", "generate_rows", "task_rows", "make_plots", "terminal_summary", "text_table", "to_html", "to_markdown", "write_reports"]
