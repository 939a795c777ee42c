"""Plain-words verdicts computed from the measured cases (never typed by hand).

For every mask kind and N of the kernels suite: the fastest exact backend and the
most memory-frugal one, each compared with the ``math`` baseline (or the runner-up
when ``math`` is itself the winner or did not run). For every N of the mechanisms
suite: which approximations stay under the error threshold and how their time and
memory compare with exact attention. For the generate suite: how much faster the KV
cache makes generation (tokens per second with and without it) and whether both
generated the same tokens. For every task and N of the tasks suite (the arena): which
approximations hold :data:`HOLD_FRACTION` of exact attention's score, and at what memory
and speed. :func:`decision_table` condenses all of it into one row per situation.
"""

from __future__ import annotations

MODE_WORDS = {"fwd": "forward", "fwd_bwd": "forward+backward"}


def _ok(c: dict) -> bool:
    return c["status"] == "ok" and c["time_s"] is not None


def _mb(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.1f} MB"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.1f} s"


def _times(a: float, b: float, more: str, less: str) -> str:
    """``'2.1x faster than'`` style comparison of ``a`` (ours) with ``b`` (theirs), lower is better."""
    if a <= 0 or b <= 0:
        return "compared with"
    r = b / a
    if r >= 1.05:
        return f"{r:.1f}x {more} than"
    if r <= 1 / 1.05:
        return f"{1 / r:.1f}x {less} than"
    return "about the same as"


#: below this, peak memory is measurement noise (thread stacks, allocator pages): no ratios
MIN_RATIO_BYTES = 1 << 20


def _mem_vs(a: int, b: int, other: str) -> str:
    """``'12.0x less than math'``, or both figures when either is too small for a ratio."""
    if a < MIN_RATIO_BYTES or b < MIN_RATIO_BYTES:
        return f"vs {_mb(b)} for {other}"
    r = b / a
    if r >= 1.05:
        return f"{r:.1f}x less than {other}"
    if r <= 1 / 1.05:
        return f"{1 / r:.1f}x more than {other}"
    return f"about the same as {other}"


def _baseline(ok: list[dict], win: dict, key: str) -> dict | None:
    """What ``win`` is compared with: ``math`` if it ran and is not ``win``, else the runner-up on ``key``."""
    math_ = next((c for c in ok if c["name"] == "math"), None)
    if math_ is not None and win["name"] != "math":
        return math_
    rest = [c for c in ok if c is not win and c.get(key) is not None]
    return min(rest, key=lambda c: c[key]) if rest else None


def kernel_verdicts(cases: list[dict]) -> list[dict]:
    """One verdict per (mask, N, mode) of the kernels suite's exact backends."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        if c["suite"] == "kernels" and c["kind"] == "backend" and c["name"] != "auto":
            groups.setdefault((c["mask"], c["N"], c["mode"]), []).append(c)
    for (mask, n, mode), cs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        ok = [c for c in cs if _ok(c)]
        if not ok:
            reasons = "; ".join(f"{c['name']}: {c['status']}" for c in cs)
            out.append({"suite": "kernels", "N": n, "mask": mask, "mode": mode, "fastest": None, "frugal": None,
                        "text": f"at N={n} {mask}, {MODE_WORDS[mode]}: no backend completed ({reasons})."})
            continue
        fastest = min(ok, key=lambda c: c["time_s"])
        with_mem = [c for c in ok if c["peak_bytes"] is not None]
        frugal = min(with_mem, key=lambda c: c["peak_bytes"]) if with_mem else None
        text = f"at N={n} {mask}, {MODE_WORDS[mode]}, on this machine: {fastest['name']} is fastest ({_ms(fastest['time_s'])}"
        base = _baseline(ok, fastest, "time_s")
        if base is not None:
            text += f", {_times(fastest['time_s'], base['time_s'], 'faster', 'slower')} {base['name']}"
        text += ")"
        if frugal is not None:
            text += f"; {frugal['name']} needs the least memory ({_mb(frugal['peak_bytes'])}"
            mbase = _baseline(ok, frugal, "peak_bytes")
            if mbase is not None and mbase["peak_bytes"] is not None:
                vs = _mem_vs(frugal["peak_bytes"], mbase["peak_bytes"], mbase["name"])
                text += (" " if vs.startswith("vs ") else ", ") + vs
            text += ")"
        failed = [c for c in cs if c["status"] in ("oom", "timeout", "error")]
        if failed:
            text += "; " + ", ".join(f"{c['name']} {c['status']}" for c in failed)
        out.append({"suite": "kernels", "N": n, "mask": mask, "mode": mode, "fastest": fastest["name"],
                    "frugal": frugal["name"] if frugal else None, "text": text + "."})
    return out


def mechanism_verdicts(cases: list[dict], max_error: float) -> list[dict]:
    """One verdict per N of the mechanisms suite (forward): which approximations stay under ``max_error``."""
    out = []
    fwd = [c for c in cases if c["suite"] == "mechanisms" and c["mode"] == "fwd"]
    for n in sorted({c["N"] for c in fwd}):
        cs = [c for c in fwd if c["N"] == n]
        exact = next((c for c in cs if c["name"] == "exact" and _ok(c)), None)
        approx = [c for c in cs if c["name"] != "exact" and _ok(c) and c["error"] is not None]
        good = sorted((c for c in approx if c["error"] <= max_error), key=lambda c: c["time_s"])
        bad = sorted((c for c in approx if c["error"] > max_error), key=lambda c: c["error"])
        parts = []
        for c in good:
            p = f"{c['name']} (error {c['error']:.1%}"
            if exact is not None:
                p += f", {_times(c['time_s'], exact['time_s'], 'faster', 'slower')} exact"
                if c["peak_bytes"] is not None and exact["peak_bytes"] is not None:
                    vs = _mem_vs(c["peak_bytes"], exact["peak_bytes"], "exact")
                    p += f", {_mb(c['peak_bytes'])} " + (vs if vs.startswith("vs ") else f"({vs})")
            parts.append(p + ")")
        text = f"at N={n}, forward, on this machine: "
        text += (f"under {max_error:.0%} error: " + "; ".join(parts)) if parts else (
            f"no approximation stays under {max_error:.0%} error")
        if bad:
            text += "; over it: " + ", ".join(f"{c['name']} ({c['error']:.0%})" for c in bad)
        failed = [c for c in cs if c["status"] != "ok"]
        if failed:
            text += "; not measured: " + ", ".join(f"{c['name']} ({c['status']})" for c in failed)
        out.append({"suite": "mechanisms", "N": n, "mask": "none", "mode": "fwd", "fastest": None, "frugal": None,
                    "under_error": [c["name"] for c in good], "text": text + "."})
    return out


def _speed(speedup: float) -> str:
    if speedup >= 1.05:
        return f"{speedup:.1f}x faster"
    if speedup <= 1 / 1.05:
        return f"{1 / speedup:.1f}x slower"
    return "about as fast"


def generate_verdicts(cases: list[dict], target: float = 5.0) -> list[dict]:
    """One verdict per pair of generate cases (with / without the KV cache) with the same settings.

    ``target`` is kept for callers of the earlier signature; the text states the measured
    speedup only.
    """
    out = []
    groups: dict[str, dict[str, dict]] = {}
    for c in cases:
        if c["suite"] == "generate":
            key = repr(sorted((k, v) for k, v in c["settings"].items() if k != "use_cache"))
            groups.setdefault(key, {})[c["name"]] = c
    for g in groups.values():
        cached, full = g.get("kv_cache"), g.get("no_cache")
        any_c = cached or full
        st = any_c["settings"]
        sizes = (f"{st['layers']} layer{'s' if st['layers'] != 1 else ''}, {st['dim']} wide, {st['heads']} heads, {st['prompt_len']}-token prompt, "
                 f"{st['new_tokens']} new tokens" + (f", batch {st['batch']}" if st.get("batch", 1) != 1 else ""))
        v = {"suite": "generate", "N": any_c["N"], "mask": any_c["mask"], "mode": any_c["mode"], "fastest": None,
             "frugal": None, "speedup": None, "tokens_match": None}
        if not (cached and full and _ok(cached) and _ok(full) and cached.get("tokens_per_s")
                and full.get("tokens_per_s")):
            why = "; ".join(f"{name}: {c['status']}" for name, c in g.items() if c["status"] != "ok") or "a case is missing"
            v["text"] = f"generation on this machine: KV cache not compared ({why}; {sizes})."
            out.append(v)
            continue
        speedup = full["time_s"] / cached["time_s"]
        match = cached.get("tokens_digest") is not None and cached.get("tokens_digest") == full.get("tokens_digest")
        text = (f"generation on this machine: KV cache {_speed(speedup)} ({cached['tokens_per_s']:,.1f} vs "
                f"{full['tokens_per_s']:,.1f} tokens/s; {sizes}); "
                + ("same tokens with and without the cache" if match else
                   "the generated tokens DIFFER with and without the cache"))
        v.update(text=text + ".", speedup=speedup, tokens_match=match,
                 fastest="kv_cache" if speedup >= 1 else "no_cache")
        if cached["peak_bytes"] is not None and full["peak_bytes"] is not None:
            v["frugal"] = "kv_cache" if cached["peak_bytes"] <= full["peak_bytes"] else "no_cache"
        out.append(v)
    return out


#: an approximation "holds" exact's accuracy at this fraction of exact's score (arena)
HOLD_FRACTION = 0.9
#: how far above the trivial baseline a score must be to count as learned (attnlab.bench.tasks.LEARNED_MARGIN)
LEARNED_MARGIN = 0.05

MASK_WORDS = {"none": "no mask", "causal": "causal", "sliding_window": "sliding window", "padding": "padding",
              "document": "document"}


def _score(c: dict) -> str:
    if c.get("score_name") == "bits_per_char":
        return f"{c['score']:.3f} bits/char"
    return f"{100 * c['score']:.1f} %"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:.2f}x" if x < 10 else f"{x:.0f}x")


def task_verdicts(cases: list[dict]) -> list[dict]:
    """One line per arena task and N: which approximations hold 90 % of exact's score, at what cost.

    Needs the derived figures of :func:`attnlab.bench.tasks.derive` (``score_ratio``,
    ``mem_vs_lean``, ``mem_vs_naive``).
    """
    out = []
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        if c["suite"] == "tasks":
            groups.setdefault((c["settings"]["task"], c["N"], c["mask"]), []).append(c)
    for (task, n, mask), cs in groups.items():
        exact = next((c for c in cs if c["name"] == "exact" and _ok(c) and c.get("score") is not None), None)
        rivals = [c for c in cs if c["name"] not in ("exact", "exact-naive") and _ok(c)
                  and c.get("score_ratio") is not None]
        held = sorted((c for c in rivals if c["score_ratio"] >= HOLD_FRACTION), key=lambda c: c["time_s"])
        lost = sorted((c for c in rivals if c["score_ratio"] < HOLD_FRACTION), key=lambda c: -c["score_ratio"])
        steps = exact["steps"] if exact else cs[0]["settings"]["steps"]
        head = f"{task} at N={n} ({MASK_WORDS.get(mask, mask)}, {steps} steps)"
        if exact is None:
            text = f"{head}: exact attention did not finish, so nothing is compared"
        elif exact.get("exact_learned") is False:
            base = exact["baseline_score"]
            text = (f"{head}: exact attention did not learn the task within this run ({_score(exact)}; a predictor "
                    f"that ignores the input scores {_score({**exact, 'score': base})}), so ratios to it say "
                    "nothing about kept accuracy")
            lower = exact["settings"]["lower_is_better"]
            def learned(c: dict, base: float = base, lower: bool = lower) -> bool:
                return c["score"] <= base * (1 - LEARNED_MARGIN) if lower else c["score"] >= base + LEARNED_MARGIN

            beat = sorted((c for c in rivals if learned(c)), key=lambda c: c["score"], reverse=not lower)
            if beat:
                text += "; these learned it faster: " + ", ".join(f"{c['name']} ({_score(c)})" for c in beat)
            held, lost = [], []
        else:
            naive = next((c for c in cs if c["name"] == "exact-naive" and c["status"] == "ok"), None)
            text = f"{head}: exact scores {_score(exact)}"
            if naive is not None and exact.get("mem_vs_naive"):
                text += f" in {_ratio(exact['mem_vs_naive'])} the memory of the naive N×N formula"
            if held:
                parts = []
                for c in held:
                    p = f"{c['name']} ({c['score_ratio']:.0%} of exact, memory {_ratio(c.get('mem_vs_lean'))} lean exact"
                    if c.get("mem_vs_naive"):
                        p += f" / {_ratio(c['mem_vs_naive'])} naive"
                    if c.get("tokens_per_s") and exact.get("tokens_per_s"):
                        p += f", {_ratio(c['tokens_per_s'] / exact['tokens_per_s'])} exact's tokens/s"
                    parts.append(p + ")")
                text += f"; hold ≥ {HOLD_FRACTION:.0%} of it: " + "; ".join(parts)
            else:
                text += f"; no approximation holds {HOLD_FRACTION:.0%} of it"
            if lost:
                text += "; below: " + ", ".join(f"{c['name']} ({c['score_ratio']:.0%})" for c in lost)
        failed = [c for c in cs if c["status"] != "ok"]
        if failed:
            text += "; cannot run: " + ", ".join(f"{c['name']} ({c['status']})" for c in failed)
        mem = [c for c in cs if _ok(c) and c.get("peak_bytes") is not None]
        out.append({"suite": "tasks", "N": n, "mask": mask, "mode": "train", "text": text + ".",
                    "fastest": min((c for c in cs if _ok(c)), key=lambda c: c["time_s"])["name"] if any(
                        _ok(c) for c in cs) else None,
                    "frugal": min(mem, key=lambda c: c["peak_bytes"])["name"] if mem else None,
                    "close_to_exact": [c["name"] for c in held], "task": task})
    return out


def decision_table(cases: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The short answer: one row per measured situation, what to use, the gain, the runner-up.

    Each registered suite contributes its rows (:meth:`attnlab.bench.suite.Suite.decision_rows`):
    exact attention from the kernels suite (:func:`kernel_decision_rows`), training on a
    task from the tasks suite (:func:`task_decision_rows`).
    """
    from .suite import suites

    head = ["situation", "use", "measured gain", "runner-up"]
    rows: list[list[str]] = []
    for suite in suites().values():
        rows += suite.decision_rows(cases)
    return head, rows


def kernel_decision_rows(cases: list[dict]) -> list[list[str]]:
    """The kernels suite's rows of :func:`decision_table`: per mask kind and mode, at the shortest and the
    longest N measured, the fastest backend against ``math`` (or the runner-up)."""
    rows: list[list[str]] = []
    kern: dict[tuple, list[dict]] = {}
    for c in cases:
        if c["suite"] == "kernels" and c["kind"] == "backend" and c["name"] not in ("auto", "reference") and _ok(c):
            kern.setdefault((c["mode"], c["mask"]), []).append(c)
    for (mode, mask), cs in sorted(kern.items(), key=lambda kv: (kv[0][0] != "fwd", kv[0][1])):
        ns = sorted({c["N"] for c in cs})
        for label, n in (("short", ns[0]), ("long", ns[-1])) if len(ns) > 1 else (("", ns[0]),):
            at = sorted((c for c in cs if c["N"] == n), key=lambda c: c["time_s"])
            win = at[0]
            base = next((c for c in at if c["name"] == "math"), None)
            if base is None or base is win:
                base = at[1] if len(at) > 1 else None
            gain = ""
            if base is not None:
                gain = f"{_times(win['time_s'], base['time_s'], 'faster', 'slower')} {base['name']}"
                if win.get("peak_bytes") is not None and base.get("peak_bytes") is not None:
                    gain += "; memory " + _mem_vs(win["peak_bytes"], base["peak_bytes"], base["name"])
            second = at[1] if len(at) > 1 else None
            runner = (f"{second['name']} ({second['time_s'] / win['time_s']:.2f}x the time)" if second else "")
            situation = f"{label + ' ' if label else ''}(N={n}), {'inference' if mode == 'fwd' else 'training'}, " \
                        f"{MASK_WORDS.get(mask, mask)}"
            rows.append([situation.strip(), f"exact, {win['name']} backend", gain, runner])
    return rows


def task_decision_rows(cases: list[dict]) -> list[list[str]]:
    """The tasks suite's rows of :func:`decision_table`: among the mechanisms that hold
    :data:`HOLD_FRACTION` of exact's score, the fastest of those within 2 % of the best score."""
    rows: list[list[str]] = []
    for v in task_verdicts(cases):
        cs = [c for c in cases if c["suite"] == "tasks" and c["settings"]["task"] == v["task"] and c["N"] == v["N"]]
        exact = next((c for c in cs if c["name"] == "exact" and _ok(c)), None)
        held = sorted((c for c in cs if c["name"] in v["close_to_exact"] and _ok(c)), key=lambda c: c["time_s"])
        situation = f"training at N={v['N']} like {v['task']} ({MASK_WORDS.get(v['mask'], v['mask'])})"
        if exact is None or exact.get("exact_learned") is False:
            continue
        if not held:
            rows.append([situation, "exact (lean backend)", f"no approximation held {HOLD_FRACTION:.0%} of its score",
                         ""])
            continue
        pool = held + [exact]  # exact itself competes: a slower approximation that scores no better loses to it
        top = max(c["score_ratio"] for c in pool)  # the best score; among those within 2 % of it, the fastest
        held = sorted(pool, key=lambda c: (c["score_ratio"] < top - 0.02, c["time_s"]))
        best = held[0]
        if best is exact:
            second = held[1]
            rows.append([situation, "exact (lean backend)", f"no approximation scores better and runs faster; "
                         f"{second['name']} keeps {second['score_ratio']:.0%} at {second['time_s'] / exact['time_s']:.2f}x "
                         "the time", second["name"]])
            continue
        gain = (f"{best['score_ratio']:.0%} of exact's score, {_times(best['time_s'], exact['time_s'], 'faster', 'slower')}"
                f" exact, memory {_ratio(best.get('mem_vs_lean'))} of lean exact")
        runner = (f"{held[1]['name']} ({held[1]['score_ratio']:.0%}, {held[1]['time_s'] / best['time_s']:.2f}x the time)"
                  if len(held) > 1 else "exact")
        rows.append([situation, best["name"], gain, runner])
    return rows


def auto_vs_sdpa(cases: list[dict]) -> list[dict]:
    """Time of ``auto`` over time of ``sdpa`` for every (mask, N, mode) where both ran."""
    idx = {(c["name"], c["mask"], c["N"], c["mode"]): c for c in cases
           if c["suite"] == "kernels" and c["kind"] == "backend" and _ok(c)}
    out = []
    for (name, mask, n, mode), a in sorted(idx.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        s = idx.get(("sdpa", mask, n, mode))
        if name == "auto" and s is not None:
            out.append({"mask": mask, "N": n, "mode": mode, "auto_s": a["time_s"], "sdpa_s": s["time_s"],
                        "ratio": a["time_s"] / s["time_s"], "chosen": a.get("chosen")})
    return out


__all__ = ["HOLD_FRACTION", "auto_vs_sdpa", "decision_table", "generate_verdicts", "kernel_decision_rows",
           "kernel_verdicts", "mechanism_verdicts", "task_decision_rows", "task_verdicts"]
