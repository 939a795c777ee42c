"""What the arena derives from its finished cases: ratios to exact, verdicts, the decision rows, plots.

Derived per (task, N) group (:func:`derive`, in place):

* ``exact_learned``: exact attention beat the task's trivial predictor (``baseline_score``) by
  :data:`LEARNED_MARGIN` (accuracy points; bits per character below the smoothed bigram model).
  When it did not, no ratio says anything about kept accuracy, and the verdict says so.
* ``exact_still_rising``: exact's validation curve still rose over its last interval (by more
  than :data:`RISING`): a ratio above 100 % is then reported with that caveat, never as kept
  accuracy alone.
* ``score_ratio``: the score as a fraction of exact's (bits per character: exact's over this);
  a swap-in also ``score_0_ratio`` (no training).
* ``mem_vs_naive`` / ``mem_vs_lean``: peak memory over ``exact-naive``'s (the N x N formula) and
  over memory-lean exact's; ``speed_vs_exact``: tokens per second at N over exact's.
* ``time_to_reach_s``: training seconds until the validation score first reached
  :data:`HOLD_FRACTION` of exact's final score (None: never in the run).
* ``run_void``: exact attention stayed below its task's gate (:data:`GATES`): the verdict says
  the run is void, and no ratio of it answers which attention to pick.
* ``phase_exact``: per curriculum phase, whether the mechanism computes exact attention at that
  phase's length (its window, block or landmarks cover it), so that phase was exact training.

The video runs (moving-digits' attention variants, :func:`is_video`) are compared with each other,
not with exact attention (:func:`derive_video`): ``steps_to_target``, the steps until the validation
score first reached :data:`TARGETS` (a run continuing from a shorter one counts from its checkpoint),
and for the cost cases ``time_vs_joint``, the training step's time over joint attention's.
"""

from __future__ import annotations

import os

from ...format import MASK_WORDS, clip, is_ok, mb_cell, notes_cell, num, pareto_front, ratio_text
from .plan import exact_up_to

SUITE = "tasks"
#: exact attention learned a task when it beats the trivial predictor by this much (accuracy points)
LEARNED_MARGIN = 0.05
#: ... and, for the character LM, by this many bits per character below the smoothed bigram model
LEARNED_MARGIN_BPC = 0.3
#: an approximation keeps exact's accuracy at this fraction of exact's score
HOLD_FRACTION = 0.9
#: ... and the claim's memory half: at least this many times less training memory (the tutorials' 5-10x)
CLAIM_MEMORY_FACTOR = 5.0
#: exact's validation score "still rising" at the end: its last interval gained more than this (points / bits)
RISING = 0.01
#: local attention "matches" exact (the task is local-dominated) within this fraction of exact's score
LOCAL_MATCH = 0.98
#: the score exact attention must reach on a task for the run to say anything about it (below: the run is void):
#: what exact attention reaches with the profiles' recipes (chars: :data:`LEARNED_MARGIN_BPC` below the bigram model)
GATES = {"mqar": 0.95, "passkey": 0.95, "listops": 0.36}


def groups(cases: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """Arena records grouped by ``(task, N)``, in run order."""
    out: dict[tuple[str, int], list[dict]] = {}
    for c in cases:
        out.setdefault((c["settings"]["task"], c["N"]), []).append(c)
    return out


def _lower(c: dict) -> bool:
    return c.get("score_name") == "bits_per_char"


def _scored(c: dict) -> bool:
    return c["status"] == "ok" and c.get("score") is not None


def _learned(exact: dict) -> bool | None:
    base = exact.get("baseline_score")
    if base is None:
        return None
    if _lower(exact):
        return exact["score"] <= base - LEARNED_MARGIN_BPC
    return exact["score"] >= base + LEARNED_MARGIN


def _rising(exact: dict) -> bool | None:
    curve = [v for _, v in exact.get("curve") or []] + [exact["score"]]
    if len(curve) < 2:
        return None
    gain = (curve[-2] - curve[-1]) if _lower(exact) else (curve[-1] - curve[-2])
    return gain > RISING


def _ratio(c: dict, e: float, key: str = "score") -> float | None:
    s = c.get(key)
    if s is None:
        return None
    if _lower(c):
        return e / s if s > 0 else None
    return s / e if e > 0 else None


def _reach(c: dict, e: float) -> float | None:
    goal = e / HOLD_FRACTION if _lower(c) else e * HOLD_FRACTION
    per_step = c["time_s"] / c["steps"] if c.get("steps") else None
    for step, val in c.get("curve") or []:
        if (val <= goal) if _lower(c) else (val >= goal):
            return step * per_step if per_step else None
    final = (c["score"] <= goal) if _lower(c) else (c["score"] >= goal)
    return c["time_s"] if final else None


def gate(exact: dict) -> float | None:
    """The score exact attention must reach on its task (:data:`GATES`; None: the task has no gate)."""
    return GATES.get(exact["settings"]["task"])


def _group_context(group: list[dict]) -> dict:
    exact = next((c for c in group if c["name"] == "exact" and c["mode"] == "train" and _scored(c)), None)
    naive = next((c for c in group if c["name"] == "exact-naive" and c["status"] == "ok"), None)
    ctx = {"exact": exact, "naive": naive, "learned": None, "rising": None, "void": None}
    if exact is not None:
        ctx["learned"], ctx["rising"] = _learned(exact), _rising(exact)
        need = gate(exact)
        if need is not None and exact["score"] < need:
            ctx["void"] = (f"void: exact attention reached {score_text(exact)}, below the {100 * need:.0f} % it reaches "
                           f"on {exact['settings']['task']} with this recipe, so this run says nothing about the "
                           "approximations")
        elif ctx["learned"] is False:
            ctx["void"] = "exact attention did not learn the task"
    return ctx


def derive(cases: list[dict]) -> None:
    """Fill in each arena record's figures relative to exact attention (in place; see the module docstring); the
    video runs' records their own (:func:`derive_video`)."""
    derive_video([c for c in cases if is_video(c)])
    for group in groups(_sequence(cases)).values():
        ctx = _group_context(group)
        exact, naive = ctx["exact"], ctx["naive"]
        for c in group:
            c.update(score_ratio=None, score_0_ratio=None, mem_vs_naive=None, mem_vs_lean=None, speed_vs_exact=None,
                     time_to_reach_s=None, exact_learned=ctx["learned"], exact_still_rising=ctx["rising"],
                     run_void=ctx["void"] is not None if exact is not None else None)
            st = c["settings"]
            c["phase_exact"] = exact_up_to(st["mechanism"], st["mechanism_settings"], [p[0] for p in st["curriculum"]])
            if c["status"] != "ok":
                continue
            peak = c.get("peak_bytes")
            if peak and naive is not None and naive.get("peak_bytes"):
                c["mem_vs_naive"] = peak / naive["peak_bytes"]
            if peak and exact is not None and exact.get("peak_bytes"):
                c["mem_vs_lean"] = peak / exact["peak_bytes"]
            if exact is None or c["name"] == "exact-naive" or not _scored(c):
                continue
            if c.get("tokens_per_s") and exact.get("tokens_per_s"):
                c["speed_vs_exact"] = c["tokens_per_s"] / exact["tokens_per_s"]
            c["score_ratio"] = _ratio(c, exact["score"])
            c["score_0_ratio"] = _ratio(c, exact["score"], "score_0") if c["mode"] == "swap_in" else None
            c["time_to_reach_s"] = _reach(c, exact["score"]) if c["mode"] == "train" else None


# -- words ----------------------------------------------------------------------------------------


def score_text(c: dict, value: float | None = None) -> str:
    """A score in its unit: ``'97.3 %'`` or ``'2.154 bits/char'``."""
    v = c["score"] if value is None else value
    if v is None:
        return "n/a"
    return f"{v:.3f} bits/char" if _lower(c) else f"{100 * v:.1f} %"


def _curriculum_text(c: dict) -> str:
    phases = c["settings"]["curriculum"]
    return "→".join(str(p[0]) for p in phases) + f", {sum(p[1] for p in phases)} steps"


def _kept(c: dict, ctx: dict) -> str:
    """How a contender kept exact's score, with the caveat when exact was still improving."""
    text = f"{c['score_ratio']:.0%}"
    if c["score_ratio"] > 1.0 and ctx["rising"]:
        text += ", exact still improving at the end"
    return text


def _scratch_part(held: list[dict], lost: list[dict], ctx: dict) -> str:
    if not held:
        return f"from scratch no approximation keeps {HOLD_FRACTION:.0%} of it" + (
            "; below: " + ", ".join(f"{c['name']} ({c['score_ratio']:.0%})" for c in lost) if lost else "")
    parts = []
    for c in held:
        p = f"{c['name']} ({_kept(c, ctx)}, memory {ratio_text(c.get('mem_vs_lean'))} lean exact"
        if c.get("mem_vs_naive"):
            p += f" / {ratio_text(c['mem_vs_naive'])} naive"
        if c.get("speed_vs_exact"):
            p += f", {ratio_text(c['speed_vs_exact'])} exact's tokens/s"
        parts.append(p + ")")
    text = f"from scratch, keep ≥ {HOLD_FRACTION:.0%}: " + "; ".join(parts)
    if lost:
        text += "; below: " + ", ".join(f"{c['name']} ({c['score_ratio']:.0%})" for c in lost)
    return text


def _swap_part(swaps: list[dict]) -> str:
    ok = [c for c in swaps if c.get("score_ratio") is not None]
    if not ok:
        return ""
    steps = ok[0]["settings"]["swap_steps"]
    parts = [f"{c['name']} {'n/a' if c.get('score_0_ratio') is None else format(c['score_0_ratio'], '.0%')}"
             f" → {c['score_ratio']:.0%}" for c in sorted(ok, key=lambda c: -c["score_ratio"])]
    return f"swapped into exact's trained model (no training → after {steps} steps): " + ", ".join(parts)


def _coverage_part(group: list[dict]) -> str:
    """Which mechanisms trained their first phases as exact attention (their budget covers those lengths)."""
    by_phase: dict[int, list[str]] = {}
    for c in group:
        if c["mode"] != "train" or c["name"] in ("exact", "exact-naive"):
            continue
        phases = c["settings"]["curriculum"]
        for (length, _, _), exact in zip(phases[:-1], c.get("phase_exact") or []):
            if exact:
                by_phase.setdefault(length, []).append(c["name"])
    return "; ".join(f"phase at {length} was exact attention for {', '.join(names)}"
                     for length, names in sorted(by_phase.items()))


def _verdict(task: str, n: int, group: list[dict]) -> dict:
    ctx = _group_context(group)
    exact = ctx["exact"]
    mask = group[0]["mask"]
    head = f"{task} at N={n} ({MASK_WORDS.get(mask, mask)}, curriculum {_curriculum_text(group[0])})"
    trained = [c for c in group if c["mode"] == "train" and c["name"] not in ("exact", "exact-naive") and _scored(c)
               and c.get("score_ratio") is not None]
    swaps = [c for c in group if c["mode"] == "swap_in"]
    held = sorted((c for c in trained if c["score_ratio"] >= HOLD_FRACTION), key=lambda c: -c["score_ratio"])
    lost = sorted((c for c in trained if c["score_ratio"] < HOLD_FRACTION), key=lambda c: -c["score_ratio"])
    if exact is None:
        text = f"{head}: exact attention did not finish, so nothing is compared"
        held = []
    elif ctx["void"] is not None and ctx["learned"] is not False:
        text = f"{head}: {ctx['void']}"
        held = []
    elif ctx["learned"] is False:
        text = (f"{head}: exact attention did not learn the task in this run ({score_text(exact)}; the trivial "
                f"predictor scores {score_text(exact, exact['baseline_score'])}), so ratios to it say nothing about "
                "kept accuracy")
        held = []
    else:
        text = f"{head}: exact scores {score_text(exact)}"
        if exact.get("baseline_score") is not None:
            text += f" (trivial predictor {score_text(exact, exact['baseline_score'])})"
        if exact.get("mem_vs_naive"):
            text += f" in {ratio_text(exact['mem_vs_naive'])} the memory of the naive N×N formula"
        text += "; " + _scratch_part(held, lost, ctx)
        swap = _swap_part(swaps)
        if swap:
            text += "; " + swap
        local = next((c for c in trained if c["name"] == "local"), None)
        if task == "chars" and local is not None and local["score_ratio"] >= LOCAL_MATCH:
            text += "; local attention matches exact: at this length the task is local-dominated"
    coverage = _coverage_part(group)
    if coverage and exact is not None:
        text += f"; {coverage} (its later phases test it as a swap-in of sorts)"
    failed = [c for c in group if c["status"] != "ok"]
    if failed:
        text += "; cannot run: " + ", ".join(f"{c['name']}{' swap-in' if c['mode'] == 'swap_in' else ''} "
                                             f"({c['status']})" for c in failed)
    mem = [c for c in group if is_ok(c) and c.get("peak_bytes") is not None and c["mode"] == "train"]
    return {"suite": SUITE, "N": n, "mask": mask, "mode": "train", "text": text + ".", "task": task,
            "fastest": min((c for c in group if is_ok(c) and c["mode"] == "train"), key=lambda c: c["time_s"])["name"]
            if any(is_ok(c) and c["mode"] == "train" for c in group) else None,
            "frugal": min(mem, key=lambda c: c["peak_bytes"])["name"] if mem else None,
            "close_to_exact": [c["name"] for c in held],
            "swapped_close": [c["name"] for c in swaps if (c.get("score_ratio") or 0) >= HOLD_FRACTION]}


def claim(cases: list[dict]) -> dict | None:
    """The tutorials' claim, "over 90 % of the accuracy at 5-10x less memory", answered from this run's numbers."""
    pairs, held = [], []
    for group in groups(cases).values():
        ctx = _group_context(group)
        if ctx["exact"] is None or ctx["learned"] is not True or ctx["void"] is not None:
            continue
        for c in group:
            if c["mode"] == "train" and c["name"] not in ("exact", "exact-naive") and c.get("score_ratio") is not None:
                pairs.append(c)
                if c["score_ratio"] >= HOLD_FRACTION:
                    held.append(c)
    if not pairs:
        return None
    tasks_ = sorted({(c["settings"]["task"], c["N"]) for c in pairs})
    s1 = (f"Of {len(pairs)} approximation-task pairs trained from scratch where exact attention learned the task "
          f"({', '.join(f'{t} at {n}' for t, n in tasks_)}), {len(held)} kept at least {HOLD_FRACTION:.0%} of exact's "
          "score" + (f": {', '.join(sorted({c['name'] for c in held}))}." if held else "."))
    naive = [1 / c["mem_vs_naive"] for c in held if c.get("mem_vs_naive")]
    lean = [1 / c["mem_vs_lean"] for c in held if c.get("mem_vs_lean")]
    if held and naive and lean:
        s2 = (f"Those used {min(naive):.1f}-{max(naive):.1f}x less training memory than the naive N×N formula and "
              f"{min(lean):.2f}-{max(lean):.2f}x less than memory-lean exact attention (above 1: less).")
    elif held:
        s2 = "None of those has a memory figure against both exact baselines."
    else:
        saved = [1 / c["mem_vs_lean"] for c in pairs if c.get("mem_vs_lean")]
        s2 = ("With no approximation keeping the accuracy, the memory half does not arise" +
              (f"; against memory-lean exact attention they used {min(saved):.2f}-{max(saved):.2f}x less training "
               "memory (above 1: less)." if saved else "."))
    both_naive = sum(1 for c in held if c.get("mem_vs_naive") and 1 / c["mem_vs_naive"] >= CLAIM_MEMORY_FACTOR)
    both_lean = sum(1 for c in held if c.get("mem_vs_lean") and 1 / c["mem_vs_lean"] >= CLAIM_MEMORY_FACTOR)
    s3 = (f"So the claim ({HOLD_FRACTION:.0%} of exact's score at {CLAIM_MEMORY_FACTOR:g}x less training memory or "
          f"better) holds on this machine for {both_naive} of {len(pairs)} pairs against naive attention and for "
          f"{both_lean} against memory-lean exact attention, which is what a PyTorch user gets from SDPA.")
    return {"suite": SUITE, "N": max(n for _, n in tasks_), "mask": "any", "mode": "claim", "task": "all",
            "fastest": None, "frugal": None, "close_to_exact": sorted({c["name"] for c in held}),
            "swapped_close": [], "text": " ".join((s1, s2, s3))}


def verdicts(cases: list[dict]) -> list[dict]:
    """One line per (task, N), then the answer to the tutorials' claim; one per frames of the video runs."""
    seq = _sequence(cases)
    out = [_verdict(task, n, group) for (task, n), group in groups(seq).items()]
    answer = claim(seq)
    return out + ([answer] if answer else []) + video_verdicts([c for c in cases if is_video(c)])


def decision_rows(cases: list[dict]) -> list[list[str]]:
    """Per learned (task, N): approximations that keep ≥ 90 % of exact's score while faster or leaner than exact,
    trained from scratch and swapped in; else exact."""
    rows: list[list[str]] = []
    for (task, n), group in groups(_sequence(cases)).items():
        ctx = _group_context(group)
        exact = ctx["exact"]
        if exact is None or ctx["learned"] is not True:
            continue
        situation = f"at N={n} like {task}"
        if ctx["void"] is not None:
            rows.append([f"training {situation}", "exact (memory-lean backend)", ctx["void"], ""])
            continue
        mask = MASK_WORDS.get(group[0]["mask"], group[0]["mask"])
        for mode, words in (("train", "training"), ("swap_in", "swapping into a trained model")):
            good = [c for c in group if c["mode"] == mode and c["name"] not in ("exact", "exact-naive")
                    and (c.get("score_ratio") or 0) >= HOLD_FRACTION
                    and ((c.get("speed_vs_exact") or 0) > 1.0 or (c.get("mem_vs_lean") or 9) < 1.0)]
            situation = f"{words} at N={n} like {task} ({mask})"
            if not good:
                if mode == "train":
                    rows.append([situation, "exact (memory-lean backend)",
                                 f"no approximation kept {HOLD_FRACTION:.0%} of its score while faster or leaner", ""])
                continue
            best = max(good, key=lambda c: (c.get("speed_vs_exact") or 0))
            gain = (f"{best['score_ratio']:.0%} of exact's score, {ratio_text(best.get('speed_vs_exact'))} its tokens/s, "
                    f"memory {ratio_text(best.get('mem_vs_lean'))} of exact's")
            rows.append([situation, best["name"], gain, "exact attention (memory-lean backend)"])
    return rows


def _pct(c: dict | None, key: str, void: bool) -> str:
    return "" if void or c is None or c.get(key) is None else f"{c[key]:.0%}"


def accuracy_rows(cases: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The report's first table on accuracy: per (task, N), one row per contender (exact's cost baselines included).

    Accuracy from scratch and swapped in (no training → after the fine-tuning steps) as % of
    exact's score, memory against naive and against memory-lean exact, tokens/s against
    exact's, and whether the mechanism can serve the task at all (else why not).
    """
    head = ["task", "contender", "from scratch", "swapped in", "memory vs naive", "memory vs lean", "speed vs exact",
            "serves the task"]
    out = []
    for (task, n), group in groups(_sequence(cases)).items():
        ctx = _group_context(group)
        void = ctx["void"] is not None or ctx["exact"] is None
        names = list(dict.fromkeys(c["name"] for c in group))
        for name in names:
            train = next((c for c in group if c["name"] == name and c["mode"] == "train"), None)
            swap = next((c for c in group if c["name"] == name and c["mode"] == "swap_in"), None)
            both = [c for c in (train, swap) if c is not None]
            bad = [c for c in both if c["status"] != "ok"]
            serves = "yes" if not bad else "; ".join(f"{c['status']}: {c.get('reason') or ''}".rstrip(": ")
                                                    for c in bad[:1])
            cost = train if train is not None and train["status"] == "ok" else None
            scratch = "(cost only)" if name == "exact-naive" else (
                "100 %" if name == "exact" and cost and not void else _pct(train, "score_ratio", void))
            swapped = ""
            if swap is not None and swap.get("score_ratio") is not None and not void:
                swapped = (f"{_pct(swap, 'score_0_ratio', void) or 'n/a'} → {_pct(swap, 'score_ratio', void)} "
                           f"(+{swap['settings']['swap_steps']} steps)")
            out.append([f"{task} at N={n}", name, scratch, swapped,
                        ratio_text(cost["mem_vs_naive"]) if cost and cost.get("mem_vs_naive") else "",
                        ratio_text(cost["mem_vs_lean"]) if cost and cost.get("mem_vs_lean") else "",
                        ratio_text(cost["speed_vs_exact"]) if cost and cost.get("speed_vs_exact") else "",
                        clip(serves, 80)])
    return head, out


# -- the table and the plots ----------------------------------------------------------------------


def rows(cases: list[dict], width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the arena table (one row per case; a ``node`` column when the cases ran on several)."""
    head = ["mechanism", "how", "task", "N", "steps", "score", "vs exact", "untrained swap", "mem vs naive",
            "mem vs lean", "tokens/s", "vs exact's", "to 90 % s", "act. error", "peak MB", "positions", "notes"]
    out = []
    for c in cases:
        st, ok = c["settings"], c["status"] == "ok"
        how = {"train": "scratch", "naive": "cost only", "cost": "cost only",
               "swap_in": f"swap-in +{st['swap_steps']}"}[st["kind"]]
        ratio = c.get("score_ratio")
        score = score_text(c) if ok and c.get("score") is not None else c["status"]
        vs = "" if ratio is None else f"{ratio:.0%}"
        if c["name"] == "exact-naive" and ok:
            score, vs = "(cost only)", "same function"
        untrained = "" if c.get("score_0_ratio") is None else f"{c['score_0_ratio']:.0%}"
        reach = c.get("time_to_reach_s")
        out.append([c["name"], how, st["task"], str(c["N"]), str(c.get("steps") or st.get("swap_steps") or ""), score, vs,
                    untrained, ratio_text(c.get("mem_vs_naive")) if c.get("mem_vs_naive") else "",
                    ratio_text(c.get("mem_vs_lean")) if c.get("mem_vs_lean") else "",
                    num(c.get("tokens_per_s"), ",.0f"), ratio_text(c.get("speed_vs_exact")) if c.get("speed_vs_exact")
                    else "", num(reach, ",.0f") if reach is not None else ("never" if ok and st["kind"] == "train"
                                                                          and ratio is not None else ""),
                    num(c.get("activation_error"), ".3f"), mb_cell(c) if ok else "", st["positional"],
                    clip(notes_cell(c), width)])
    nodes = {c["node"] for c in cases if c.get("node")}
    if len(nodes) > 1:  # a run on a cluster: each (task, N) ran on one machine, named here
        head.append("node")
        for row, c in zip(out, cases):
            row.append(c.get("node") or "")
    return head, out


#: where a point's label may sit, in points from the point: right, above, left, below, then the diagonals
_LABEL_OFFSETS = [(4, 3), (4, 10), (-4, 3), (4, -10), (-4, 10), (-4, -10), (10, 16), (10, -18), (-10, 16), (-10, -18),
                  (16, 0), (-16, 0), (4, 24), (4, -26)]


def place_labels(ax, points: list[tuple[float, float]], labels: list[str], fontsize: int = 7) -> None:
    """Annotate each point with its label where the label overlaps no label placed before it (or the fewest).

    Tries the offsets of :data:`_LABEL_OFFSETS` in turn, measuring each label's box with the
    figure's renderer; a label that overlaps at every offset goes where it overlaps least.
    """
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list = []
    for (x, y), text in zip(points, labels):
        best, best_hits = None, None
        for dx, dy in _LABEL_OFFSETS:
            ann = ax.annotate(text, (x, y), fontsize=fontsize, xytext=(dx, dy), textcoords="offset points",
                              ha="left" if dx >= 0 else "right", va="center")
            box = ann.get_window_extent(renderer).expanded(1.05, 1.15)
            hits = sum(box.overlaps(other) for other in placed)
            if best_hits is None or hits < best_hits:
                if best is not None:
                    best[0].remove()
                best, best_hits = (ann, box), hits
            else:
                ann.remove()
            if hits == 0:
                break
        placed.append(best[1])


def _wrapped(text: str, width_in: float) -> str:
    """``text`` wrapped to the figure's width (about 11 characters per inch at the title's size)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(30, int(width_in * 11))))


def overview_plot(cases: list[dict], out_dir: str, plt) -> list[str]:
    """The key picture: per (task, N), score kept (vs exact) against training memory (vs naive exact), every mechanism."""
    panels = [(key, [c for c in g if c.get("score_ratio") is not None and c.get("mem_vs_naive")])
              for key, g in groups(cases).items()]
    panels = [(k, cs) for k, cs in panels if cs]
    if not panels:
        return []
    width = max(6.5, 5.6 * len(panels))
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 4.6), squeeze=False)
    for ax, ((task, n), cs) in zip(axes[0], panels):
        for c in cs:
            swap = c["mode"] == "swap_in"
            color = "black" if c["name"] == "exact" else ("tab:orange" if swap else "tab:blue")
            ax.scatter(c["mem_vs_naive"], c["score_ratio"], marker="^" if swap else "o", color=color, s=36)
        ax.axhline(HOLD_FRACTION, color="gray", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("training memory / naive exact's (log)")
        ax.set_ylabel("score / exact's")
        ax.set_title(f"{task} at N={n}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.25, y=0.12)  # room for the labels at the edges
        place_labels(ax, [(c["mem_vs_naive"], c["score_ratio"]) for c in cs],
                     [c["name"] + (" (swap)" if c["mode"] == "swap_in" else "") for c in cs])
    fig.suptitle(_wrapped("the arena: accuracy kept against memory (circles: trained from scratch, triangles: "
                          "swapped in)", width), fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "arena_overview.png"), dpi=90)
    plt.close(fig)
    return ["arena_overview.png"]


def curve_plots(cases: list[dict], out_dir: str, plt) -> list[str]:
    """Per (task, N): each contender's validation score against training step, and the Pareto front of memory."""
    files = []
    for (task, n), cs in groups(cases).items():
        trained = [c for c in cs if c["mode"] == "train" and c["name"] != "exact-naive" and c.get("curve")]
        if not trained:
            continue
        lower = _lower(trained[0])
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for c in trained:
            pts = c["curve"] + [[c["steps"], c["score"]]]
            ys = [v if lower else 100 * v for _, v in pts]
            ax.plot([s for s, _ in pts], ys, marker=".", label=c["name"], color="black" if c["name"] == "exact" else None)
        for length_end in _phase_ends(trained[0]):
            ax.axvline(length_end, color="gray", lw=0.8, ls=":")
        ax.set_xlabel("training step (dotted: a phase ends)")
        ax.set_ylabel("bits per char (lower is better)" if lower else "validation score, %")
        ax.set_title(f"arena: {task} at N={n}, validation during training")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fname = f"arena_{task.replace('-', '_')}_{n}.png"
        fig.savefig(os.path.join(out_dir, fname), dpi=90)
        plt.close(fig)
        files.append(fname)
        files += _pareto_plot(task, n, [c for c in cs if c["mode"] == "train"], out_dir, plt)
    return files


def _phase_ends(c: dict) -> list[int]:
    ends, total = [], 0
    for p in c["settings"]["curriculum"][:-1]:
        total += p[1]
        ends.append(total)
    return ends


def _pareto_plot(task: str, n: int, cs: list[dict], out_dir: str, plt) -> list[str]:
    pts = [c for c in cs if c.get("score_ratio") is not None and c.get("mem_vs_naive")]
    if len(pts) < 2:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    xy = [(c["mem_vs_naive"], c["score_ratio"]) for c in pts]
    front = pareto_front(xy)
    for i, c in enumerate(pts):
        ax.scatter(*xy[i], s=40, color="black" if c["name"] == "exact" else ("tab:red" if i in front else "tab:blue"))
    ax.margins(x=0.25, y=0.12)
    place_labels(ax, xy, [c["name"] for c in pts], fontsize=8)
    ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], color="tab:red", alpha=0.5, label="Pareto front")
    ax.axhline(HOLD_FRACTION, color="gray", ls="--", lw=1, label=f"{HOLD_FRACTION:.0%} of exact")
    ax.set_xscale("log")
    ax.set_xlabel("peak training memory / naive exact's (log)")
    ax.set_ylabel("score / exact's")
    ax.set_title(f"arena: {task} at N={n}, accuracy kept vs memory (from scratch)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fname = f"pareto_{task.replace('-', '_')}_{n}.png"
    fig.savefig(os.path.join(out_dir, fname), dpi=90)
    plt.close(fig)
    return [fname]


# -- the video runs (moving-digits): the attention variants side by side --------------------------

#: the validation score the video runs count the steps to (``steps_to_target``)
TARGETS = {"moving-digits": 0.95}


def is_video(c: dict) -> bool:
    """A record of a video variant (its contender is the video model's attention, not a mechanism)."""
    return c["settings"].get("attention") is not None


def _sequence(cases: list[dict]) -> list[dict]:
    """The records of the sequence runs (every one but the video variants')."""
    return [c for c in cases if not is_video(c)]


def _frames(c: dict) -> int:
    return int(c["settings"]["task_options"]["frames"])


def steps_to(c: dict, target: float) -> int | None:
    """Steps trained at the target length until the validation score first reached ``target`` (None: never).

    Counted from the run's start, or for a run continuing from a shorter one, from its checkpoint.
    """
    for step, val in c.get("curve") or []:
        if val >= target:
            return int(step) - int(c["settings"].get("continue_step") or 0)
    return None


def derive_video(cases: list[dict]) -> None:
    """Per video record: ``steps_to_target`` (trained ones) and ``time_vs_joint`` (cost ones, at the same frames)."""
    joint = {_frames(c): c for c in cases if c["settings"]["kind"] == "cost" and c["name"] == "joint" and is_ok(c)}
    for c in cases:
        st = c["settings"]
        c.update(steps_to_target=None, target_score=TARGETS.get(st["task"]), time_vs_joint=None)
        if not is_ok(c):
            continue
        if st["kind"] == "train" and c["target_score"] is not None:
            c["steps_to_target"] = steps_to(c, c["target_score"])
        base = joint.get(_frames(c))
        if st["kind"] == "cost" and base is not None and base.get("time_s"):
            c["time_vs_joint"] = c["time_s"] / base["time_s"]


def _video_pairs(cases: list[dict]) -> list[tuple[int, str, dict | None, dict | None]]:
    """``(frames, variant, trained record, cost record)`` in frame order, then the cases' order."""
    out: dict[tuple[int, str], list] = {}
    for c in cases:
        slot = out.setdefault((_frames(c), c["name"]), [None, None])
        slot[1 if c["settings"]["kind"] == "cost" else 0] = c
    return [(t, name, tr, co) for (t, name), (tr, co) in sorted(out.items(), key=lambda kv: kv[0][0])]


def _steps_cell(c: dict | None) -> str:
    """Steps to the target; ``≤ n`` when the first validation already met it (reached somewhere before)."""
    if c is None or not is_ok(c):
        return ""
    if c.get("steps_to_target") is not None:
        first = (c.get("curve") or [[None]])[0][0]
        at_first = first is not None and c["steps_to_target"] == first - int(c["settings"].get("continue_step") or 0)
        return f"{'≤ ' if at_first else ''}{c['steps_to_target']:,}"
    trained = c["steps"] - int(c["settings"].get("continue_step") or 0)
    return f"not in {trained:,}"


def video_rows(cases: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The moving-digits table: per frames and attention, test accuracy (and with the frames shuffled), the steps
    to the target validation score, and the time and memory of a training step at the cost patches."""
    head = ["frames", "attention", "patch", "test accuracy", "frames shuffled",
            f"steps to {100 * TARGETS['moving-digits']:.0f} %", "cost patch",
            "ms / training step", "vs joint", "peak MiB of a step"]
    rows_ = []
    for t, name, tr, co in _video_pairs(cases):
        ok_tr, ok_co = tr is not None and is_ok(tr), co is not None and is_ok(co)
        acc = f"{100 * tr['score']:.1f} %" if ok_tr else (tr["status"] if tr else "")
        shuf = tr.get("accuracy_frames_shuffled") if ok_tr else None
        rows_.append([str(t), name, str(tr["settings"]["task_options"]["patch_size"]) if tr else "", acc,
                      "" if shuf is None else f"{100 * shuf:.1f} %", _steps_cell(tr),
                      str(co["settings"]["task_options"]["patch_size"]) if co else "",
                      f"{1e3 * co['time_s']:,.0f}" if ok_co else (co["status"] if co else ""),
                      f"{co['time_vs_joint']:.2f}" if ok_co and co.get("time_vs_joint") is not None else "",
                      f"{co['peak_bytes'] / 2**20:,.0f}" if ok_co and co.get("peak_bytes") else ""])
    return head, rows_


def video_verdicts(cases: list[dict]) -> list[dict]:
    """One line per frames: each variant's test accuracy and steps to the target, the fastest step."""
    out = []
    by: dict[int, list] = {}
    for t, name, tr, co in _video_pairs(cases):
        by.setdefault(t, []).append((name, tr, co))
    for t, items in by.items():
        trained = [(n, tr) for n, tr, _ in items if tr is not None and is_ok(tr)]
        task = items[0][1]["settings"]["task"] if items[0][1] else items[0][2]["settings"]["task"]
        target = TARGETS.get(task)
        parts = []
        for name, tr in trained:
            reach = ("" if target is None else f", {100 * target:.0f} % after {_steps_cell(tr)} steps"
                     if tr.get("steps_to_target") is not None else f", never {100 * target:.0f} %")
            parts.append(f"{name} {score_text(tr)}{reach}")
        costs = [(n, co) for n, _, co in items if co is not None and is_ok(co)]
        fastest = min(costs, key=lambda x: x[1]["time_s"])[0] if costs else None
        frugal = min((x for x in costs if x[1].get("peak_bytes")), key=lambda x: x[1]["peak_bytes"], default=(None,))[0]
        text = f"{task} at T={t}: " + ("; ".join(parts) if parts else "no variant finished training")
        if fastest is not None:
            text += f"; fastest training step: {fastest}" + (f", least memory: {frugal}" if frugal else "")
        failed = [f"{n} ({c['status']})" for n, tr, co in items for c in (tr, co) if c is not None and not is_ok(c)]
        if failed:
            text += "; cannot run: " + ", ".join(failed)
        n_tokens = next(c["N"] for _, tr, co in items for c in (tr, co) if c is not None)
        out.append({"suite": SUITE, "N": n_tokens, "mask": "padding", "mode": "train", "text": text + ".",
                    "task": task, "fastest": fastest, "frugal": frugal,
                    "close_to_exact": [n for n, tr in trained if target is not None and tr["score"] >= target],
                    "swapped_close": []})
    return out
