"""The ``kernels`` suite: every exact backend x mask kind x sequence length.

For each case it measures the forward (under ``no_grad``) and forward+backward time
and peak memory, the useful FLOPs (only allowed score elements count:
``4 D * pairs * B * H`` forward, 2.5 times that forward+backward), GFLOP/s and their
fraction of this machine's matmul ceiling, and the maximum relative error of the
output against a float64 oracle (the NumPy ``reference`` backend on every row for
N <= 1024, float64 torch on 128 spread-out rows above). ``auto`` is measured like a
backend, with the backend it chose. The ``reference`` backend itself is not timed.

The suite also compares :class:`attnlab.layers.MultiHeadAttention` with
``torch.nn.MultiheadAttention`` (embed 512, 8 heads): ours is built from theirs with
:meth:`~attnlab.layers.MultiHeadAttention.from_torch`, so both hold the same weights.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries = keys, ``D`` head dim, ``E`` embed dim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...exact import attention, backends, choose_backend, make_call
from ...layers import MultiHeadAttention
from ...utils import positive_int
from ..format import (
    MASK_WORDS,
    MODE_WORDS,
    clip,
    is_ok,
    line_plot,
    mb_cell,
    mb_text,
    mem_phrase,
    mode_pairs,
    ms_cell,
    ms_text,
    notes_cell,
    num,
    text_table,
    times_phrase,
)
from ..measure import (
    MASK_KINDS,
    MODES,
    REFERENCE_MAX_N,
    Unsupported,
    allowed_pairs,
    check_rows,
    make_inputs,
    make_mask,
    max_rel_error,
    measure_op,
    mode_op,
    oracle_rows,
    torch_dtype,
)
from ..suite import Case, Context, Job, RunOptions, Suite, register_suite, split_names

SUITE = "kernels"
#: sequence lengths per profile (``--lengths`` replaces them)
LENGTHS = {"quick": [1024, 4096], "standard": [512, 1024, 2048, 4096],
           "full": [512, 1024, 2048, 4096, 8192, 16384]}
#: embed dim and heads of the layer comparison
LAYER_E, LAYER_H = 512, 8
#: what every exact backend is compared with: what a PyTorch user would otherwise call
BASELINE = "sdpa"


@dataclass(frozen=True)
class KernelsOptions:
    """The kernels suite's own options.

    Attributes:
        mask_kinds: mask kinds to measure (default all of :data:`~attnlab.bench.measure.MASK_KINDS`).
        layer_n: N of the layer comparison (``"auto"``: 4096, or the longest length asked for; None: skip it).
    """

    mask_kinds: tuple[str, ...] = MASK_KINDS
    layer_n: int | str | None = "auto"

    def __post_init__(self) -> None:
        kinds = split_names(self.mask_kinds, "mask_kinds") or ()
        bad = [k for k in kinds if k not in MASK_KINDS]
        if not kinds or bad:
            raise ValueError(f"mask kinds must be among {list(MASK_KINDS)}, got {list(kinds)}")
        object.__setattr__(self, "mask_kinds", kinds)
        if self.layer_n != "auto":
            positive_int(self.layer_n, "layer_n (or 'auto')", allow_none=True)


def timed_backends() -> list[str]:
    """Registered backends that are timed (all but the NumPy oracle), then ``auto``."""
    return [n for n in backends() if n != "reference"] + ["auto"]


@dataclass(frozen=True)
class KernelCase(Case):
    """One case of this suite: an exact backend (or ``auto``) or a whole layer, at one mask, length and mode.

    Attributes:
        kind: ``backend`` (``name`` is a backend of :func:`timed_backends`) or ``layer`` (``name`` is
            ``attnlab.MultiHeadAttention`` or ``torch.nn.MultiheadAttention``).
        mask: a mask kind of :data:`~attnlab.bench.measure.MASK_KINDS` (layers: ``none``).
        N, B, H, D: queries = keys, batch, heads, head dim.
        mode: ``fwd`` (under ``no_grad``) or ``fwd_bwd``.
        embed_dim: a layer's embed dim (``H * D``; None for a backend).
    """

    suite: ClassVar[str] = SUITE

    kind: str
    name: str
    mask: str
    N: int
    mode: str
    B: int = 1
    H: int = 8
    D: int = 64
    embed_dim: int | None = None

    def settings(self) -> dict:
        return {} if self.embed_dim is None else {"embed_dim": self.embed_dim}


#: the longest N at which the quick profile times ``math``
QUICK_MATH_MAX_N = 2048


def cases(lengths: list[int], device: str, dtype: str, profile: str, mask_kinds=MASK_KINDS,
          B: int = 1, H: int = 8, D: int = 64, layer_n: int | None = 4096,
          names: list[str] | None = None) -> list[Job]:
    """The jobs of this suite (one per backend x mask x N x mode, then the layers).

    ``names`` keeps only these backends (``auto`` included); the layer comparison runs
    when ``layer_n`` is set.

    A backend unavailable in this environment (``available()`` says why) is recorded
    as unsupported without starting a process, and so is one whose verdict on the call refuses
    it (:func:`decide`); ``auto`` and ``chunked``, when they would run another timed backend's
    kernel, are not timed again (their ``same_as``). On CPU the quick profile skips ``flex``,
    which compiles for every shape (about half a minute each), and ``math`` above
    :data:`QUICK_MATH_MAX_N` (the N x N formula: its training call at N = 4096 takes seconds,
    and the main job's verdicts compare the memory-lean backends).
    """
    jobs = []
    for name in timed_backends():
        if names is not None and name not in names:
            continue
        skip = None
        if name != "auto":
            why = backends()[name].available()
            if why is not None:
                skip = {"status": "unsupported", "reason": why}
        if skip is None and name == "flex" and profile == "quick" and not device.startswith("cuda"):
            skip = {"status": "skipped", "reason": "flex compiles once per shape on cpu (seconds each); "
                                                   "measured by --profile full"}
        for mask in mask_kinds:
            for n in lengths:
                this = skip
                if this is None and name == "math" and profile == "quick" and n > QUICK_MATH_MAX_N:
                    this = {"status": "skipped", "reason": f"the naive N x N formula is timed up to N={QUICK_MATH_MAX_N} "
                                                           "in the quick profile (seconds per call beyond); "
                                                           "--profile standard times it at every length"}
                for mode in MODES:
                    case = KernelCase(kind="backend", name=name, mask=mask, N=n, mode=mode, B=B, H=H, D=D,
                                      dtype=dtype, device=device)
                    jobs.append(Job(case, id=_case_id(name, mask, n, mode), skip=this))
    jobs = decide(jobs)
    if layer_n:
        for name in ("attnlab.MultiHeadAttention", "torch.nn.MultiheadAttention"):
            for mode in MODES:
                jobs.append(Job(KernelCase(kind="layer", name=name, mask="none", N=layer_n, mode=mode, B=1, H=LAYER_H,
                                           D=LAYER_E // LAYER_H, embed_dim=LAYER_E, dtype=dtype, device=device)))
    return jobs


def _case_id(name: str, mask: str, n: int, mode: str) -> str:
    return f"{SUITE}/{name}/{mask}/{n}/{mode}"


def kernel_ran(name: str, call) -> str:
    """The kernel backend ``name`` runs for ``call``: its own, or ``chunked``'s choice (the native kernel, its fused
    per-block path or its plain tiles), or for ``auto`` that of the backend it chooses."""
    from ...exact import native
    from ...exact.chunked import fused_reason

    if name == "auto":
        return kernel_ran(choose_backend(call.q, call.k, call.v, mask=call.mask), call)
    if name != "chunked":
        return name
    if native.call_reason(call) is None:
        return "native"
    return "chunked (fused per-block path)" if fused_reason(call) is None else "chunked (plain tiles)"


def decide(jobs: list[Job]) -> list[Job]:
    """``jobs`` with what the parent knows without running them (per mask x N x mode, on the case's own inputs).

    A backend whose verdict refuses the call is unsupported, with that reason. ``auto`` and
    ``chunked`` record the backend they choose (``chosen``) and the kernel they would run
    (``ran``); when that kernel is another case's (``chunked`` running ``native``), they take that
    case's measurement (``same_as``) instead of timing it again.
    """
    out = list(jobs)
    groups: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):
        c = j.case
        if c.kind == "backend" and j.skip is None:
            groups.setdefault((c.mask, c.N, c.mode, c.B, c.H, c.D, c.dtype, c.device), []).append(i)
    for group in groups.values():
        first = jobs[group[0]].case
        q, k, v = make_inputs(first)
        mask = make_mask(first.mask, first.N, first.B)
        if first.mode == "fwd_bwd":
            for t in (q, k, v):
                t.requires_grad_(True)
        with torch.set_grad_enabled(first.mode == "fwd_bwd"):
            call = make_call(q, k, v, mask=mask)
            timed = {}
            for i in group:
                name = jobs[i].case.name
                if name == "auto":
                    continue
                why = backends()[name].verdict(call)
                if why is not None:
                    out[i] = dataclasses.replace(jobs[i], skip={"status": "unsupported", "reason": why})
                elif name != "chunked":
                    timed[name] = jobs[i].id
            for i in group:
                name = out[i].case.name
                if name in ("auto", "chunked") and out[i].skip is None:
                    result = {"chosen": choose_backend(q, k, v, mask=mask)} if name == "auto" else {}
                    ran = result["ran"] = kernel_ran(result.get("chosen", name), call)
                    if ran in timed:
                        out[i] = dataclasses.replace(out[i], same_as={"id": timed[ran], "result": result})
    return out


def _flops(pairs: int, case: KernelCase) -> float:
    f = 4.0 * case.D * pairs * case.H
    return f if case.mode == "fwd" else 2.5 * f


def run_case(case: KernelCase, ctx: Context) -> dict:
    """Measure one case in this process (see the module docstring)."""
    if case.kind == "layer":
        return _run_layer(case, ctx)
    name, mode = case.name, case.mode
    q, k, v = make_inputs(case)
    mask = make_mask(case.mask, case.N, case.B)
    if mode == "fwd_bwd":
        for t in (q, k, v):
            t.requires_grad_(True)
    res: dict = {}
    with torch.set_grad_enabled(mode == "fwd_bwd"):
        call = make_call(q, k, v, mask=mask)
        if name == "auto":
            res["chosen"] = choose_backend(q, k, v, mask=mask)
        else:
            why = backends()[name].verdict(call)
            if why is not None:
                raise Unsupported(why)
        res["ran"] = kernel_ran(res.get("chosen", name), call)

    def fn(q, k, v):
        return attention(q, k, v, mask=mask, backend=name)

    res.update(measure_op(mode_op(fn, q, k, v, mode), case.device, ctx.repeats, ctx.budget_s))
    res["flops"] = _flops(allowed_pairs(mask, case.B, case.N, case.N), case)
    if mode == "fwd":
        with torch.no_grad():
            out = fn(q, k, v)  # (B, H, N, D)
        if case.N <= REFERENCE_MAX_N:
            ref = attention(q.detach(), k.detach(), v.detach(), mask=mask, backend="reference").double()
            res["error"], res["error_oracle"] = max_rel_error(out, ref), "reference (all rows)"
        else:
            rows = check_rows(case.N)
            ref = oracle_rows(q, k, v, mask, rows)  # (B, H, R, D)
            res["error"] = max_rel_error(out[:, :, rows.to(out.device)], ref)
            res["error_oracle"] = f"float64 torch ({len(rows)} rows)"
    return res


# -- the layer comparison ----------------------------------------------------------------------


def _call_layer(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Self-attention output ``(B, N, E)`` of either layer (torch's returns ``(out, None)``)."""
    if isinstance(layer, torch.nn.MultiheadAttention):
        return layer(x, x, x, need_weights=False)[0]
    return layer(x)


def _run_layer(case: KernelCase, ctx: Context) -> dict:
    e, h, n, B = case.embed_dim, case.H, case.N, case.B
    dt = torch_dtype(case.dtype)
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(e, h, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)  # the same weights
    theirs, ours = theirs.to(case.device, dt).eval(), ours.to(case.device, dt).eval()
    x = torch.randn(B, n, e, generator=torch.Generator().manual_seed(1)).to(case.device, dt)  # (B, N, E)
    layer = ours if case.name.startswith("attnlab") else theirs

    def fn(x, _k, _v):
        return _call_layer(layer, x)

    params = list(layer.parameters())
    res = measure_op(mode_op(fn, x, x, x, case.mode, params), case.device, ctx.repeats, ctx.budget_s)
    flops = B * (8.0 * n * e * e + 4.0 * n * n * e)  # projections + the two attention products
    res["flops"] = flops if case.mode == "fwd" else 3.0 * flops
    res["weights_copied"] = True
    if case.mode == "fwd" and layer is ours:
        with torch.no_grad():
            res["error"] = max_rel_error(_call_layer(ours, x), _call_layer(theirs, x))
            res["error_oracle"] = "torch.nn.MultiheadAttention with the same weights"
    return res


# -- rows, verdicts, the decision table --------------------------------------------------------


def rows(cases: list[dict], kind: str = "backend", width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the kernels table (one row per backend x mask x N)."""
    head = ["backend", "mask", "N", "fwd ms", "fwd MB", "fwd+bwd ms", "fwd+bwd MB", "fwd GFLOP/s",
            "% of matmul", "max rel err", "notes"]
    out = []
    for f, b in mode_pairs(cases, kind):
        c = f or b
        note = notes_cell(f, b)
        chose = (f or {}).get("chosen") or (b or {}).get("chosen")
        ran = (f or {}).get("ran") or (b or {}).get("ran")
        if chose or (ran and ran != c["name"]):
            what = f"chose {chose}" if chose else ""
            if ran and ran != chose:
                what += (", " if what else "") + f"ran {ran}"
            note = what + (f"; {note}" if note else "")
        out.append([c["name"], c["mask"], str(c["N"]), ms_cell(f), mb_cell(f), ms_cell(b), mb_cell(b),
                    num(f and f["gflops"], ",.1f"), num(f and f["frac_of_ceiling"] and 100 * f["frac_of_ceiling"], ".1f"),
                    num(f and f["error"], ".1e"), clip(note, width)])
    return head, out


def _against(ok: list[dict], win: dict, key: str) -> dict | None:
    """What ``win`` is compared with: :data:`BASELINE` if it ran and is not ``win``, else the runner-up on ``key``."""
    base = next((c for c in ok if c["name"] == BASELINE), None)
    if base is not None and base is not win:
        return base
    rest = [c for c in ok if c is not win and c.get(key) is not None]
    return min(rest, key=lambda c: c[key]) if rest else None


def _backend_groups(cases: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for c in cases:  # a case timed as another (chunked running native) is not a second measurement
        if c["kind"] == "backend" and c["name"] not in ("auto", "reference") and not c.get("timed_as"):
            groups.setdefault((c["mask"], c["N"], c["mode"]), []).append(c)
    return dict(sorted(groups.items()))


def verdicts(cases: list[dict]) -> list[dict]:
    """One verdict per (mask, N, mode): the fastest exact backend and the leanest, each against sdpa."""
    out = []
    for (mask, n, mode), cs in _backend_groups(cases).items():
        ok = [c for c in cs if is_ok(c)]
        head = {"suite": SUITE, "N": n, "mask": mask, "mode": mode}
        if not ok:
            why = "; ".join(f"{c['name']}: {c['status']}" for c in cs)
            out.append({**head, "fastest": None, "frugal": None,
                        "text": f"at N={n} {mask}, {MODE_WORDS[mode]}: no backend completed ({why})."})
            continue
        fastest = min(ok, key=lambda c: c["time_s"])
        with_mem = [c for c in ok if c["peak_bytes"] is not None]
        frugal = min(with_mem, key=lambda c: c["peak_bytes"]) if with_mem else None
        text = f"at N={n} {mask}, {MODE_WORDS[mode]}: {fastest['name']} is fastest ({ms_text(fastest['time_s'])}"
        base = _against(ok, fastest, "time_s")
        if base is not None:
            text += f", {times_phrase(fastest['time_s'], base['time_s'])} {base['name']}"
        text += ")"
        if frugal is not None:
            text += f"; {frugal['name']} needs the least memory ({mb_text(frugal['peak_bytes'])}"
            mbase = _against(with_mem, frugal, "peak_bytes")
            if mbase is not None:
                vs = mem_phrase(frugal["peak_bytes"], mbase["peak_bytes"], mbase["name"])
                text += ", " + vs
            text += ")"
        failed = [c for c in cs if c["status"] in ("oom", "timeout", "error")]
        if failed:
            text += "; " + ", ".join(f"{c['name']} {c['status']}" for c in failed)
        out.append({**head, "fastest": fastest["name"], "frugal": frugal["name"] if frugal else None,
                    "text": text + "."})
    return out


def decision_rows(cases: list[dict]) -> list[list[str]]:
    """Per mask kind and mode: the fastest exact backend against sdpa, in one row when one backend wins at every N
    (its figures at the longest), else at the shortest and the longest N."""
    out: list[list[str]] = []
    by: dict[tuple, list[dict]] = {}
    for (mask, _n, mode), cs in _backend_groups(cases).items():
        by.setdefault((mode, mask), []).extend(c for c in cs if is_ok(c))
    for (mode, mask), cs in sorted(by.items(), key=lambda kv: (kv[0][0] != "fwd", kv[0][1])):
        ns = sorted({c["N"] for c in cs})
        if not ns:
            continue
        winners = {min((c for c in cs if c["N"] == n), key=lambda c: c["time_s"])["name"] for n in ns}
        if len(ns) > 1 and len(winners) > 1:
            picks = [("short", ns[0], f"N={ns[0]}"), ("long", ns[-1], f"N={ns[-1]}")]
        else:  # one winner at every length: one row, its gain at the longest
            picks = [("", ns[-1], f"N={ns[0]}" if len(ns) == 1 else f"N={ns[0]} to {ns[-1]}, figures at {ns[-1]}")]
        for label, n, where in picks:
            at = sorted((c for c in cs if c["N"] == n), key=lambda c: c["time_s"])
            win, base = at[0], _against(at, at[0], "time_s")
            gain = ""
            if base is not None:
                gain = f"{times_phrase(win['time_s'], base['time_s'])} {base['name']}"
                if win.get("peak_bytes") is not None and base.get("peak_bytes") is not None:
                    gain += "; memory " + mem_phrase(win["peak_bytes"], base["peak_bytes"], base["name"])
            situation = (f"{label + ' ' if label else ''}({where}), {'inference' if mode == 'fwd' else 'training'}, "
                         f"{MASK_WORDS.get(mask, mask)}")
            out.append([situation, f"exact, {win['name']} backend", gain, base["name"] if base else ""])
    return out


def auto_vs_sdpa(cases: list[dict]) -> list[dict]:
    """Time of ``auto`` over time of ``sdpa`` for every (mask, N, mode) where both ran."""
    idx = {(c["name"], c["mask"], c["N"], c["mode"]): c for c in cases if c["kind"] == "backend" and is_ok(c)}
    out = []
    for (name, mask, n, mode), a in sorted(idx.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        s = idx.get(("sdpa", mask, n, mode))
        if name == "auto" and s is not None:
            out.append({"mask": mask, "N": n, "mode": mode, "auto_s": a["time_s"], "sdpa_s": s["time_s"],
                        "ratio": a["time_s"] / s["time_s"], "chosen": a.get("chosen")})
    return out


def auto_vs_fastest(cases: list[dict]) -> list[dict]:
    """For every (mask, N, mode): the backend auto chose, the fastest backend measured, and auto's time over it."""
    out = []
    for (mask, n, mode), cs in _backend_groups(cases).items():
        ok = [c for c in cs if is_ok(c)]
        auto = next((c for c in cases if c["kind"] == "backend" and c["name"] == "auto" and c["mask"] == mask
                     and c["N"] == n and c["mode"] == mode and is_ok(c)), None)
        if not ok or auto is None:
            continue
        best = min(ok, key=lambda c: c["time_s"])
        picked = next((c for c in ok if c["name"] in (auto.get("ran"), auto.get("chosen"))), None)
        out.append({"mask": mask, "N": n, "mode": mode, "chosen": auto.get("chosen"), "fastest": best["name"],
                    "auto_over_fastest": auto["time_s"] / best["time_s"],
                    "chosen_over_fastest": picked["time_s"] / best["time_s"] if picked else None})
    return out


# -- the suite object ----------------------------------------------------------------------------

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_STR_OR_NULL = {"type": ["string", "null"]}


def _rows_of(properties: dict, required: tuple[str, ...]) -> dict:
    """The schema of a list of per-(mask, N, mode) rows with ``properties`` besides those three."""
    return {"type": "array", "items": {
        "type": "object", "required": ["mask", "N", "mode", *required],
        "properties": {"mask": {"type": "string"}, "N": {"type": "integer"}, "mode": {"type": "string"}, **properties}}}


@register_suite
class KernelsSuite(Suite):
    """Every exact backend (and ``auto``) x mask kind x N x mode, plus the layer comparison."""

    name = SUITE
    summary = "exact attention backends x masks x N (time, memory, GFLOP/s, error), and the layer comparison"
    order = 10
    Options = KernelsOptions
    profile_lengths = LENGTHS
    kinds = ("backend", "layer")
    modes = MODES
    result_keys = ("chosen", "ran", "timed_as", "weights_copied")
    case_properties = {
        "chosen": {"type": ["string", "null"], "description": "the backend auto chose"},
        "ran": {"type": "string", "description": "kernels: the kernel the backend ran (chunked's and auto's choice)"},
        "timed_as": {"type": "string", "description": "kernels: the case that timed this same kernel (its figures "
                                                      "are this case's)"},
        "weights_copied": {"type": "boolean"},
    }
    settings_properties = {"mask_kinds": {"type": "array", "items": {"type": "string"}}}
    results_properties = {
        "auto_vs_sdpa": _rows_of({"auto_s": _NUM, "sdpa_s": _NUM, "ratio": _NUM, "chosen": _STR_OR_NULL},
                                 required=("auto_s", "sdpa_s", "ratio")),
        "auto_vs_fastest": _rows_of({"chosen": _STR_OR_NULL, "fastest": {"type": "string"}, "auto_over_fastest": _NUM,
                                     "chosen_over_fastest": _NUM_OR_NULL},
                                    required=("chosen", "fastest", "auto_over_fastest")),
    }
    results_required = ("auto_vs_sdpa", "auto_vs_fastest")

    def add_arguments(self, group) -> None:
        group.add_argument("--masks", default=None, help=f"kernels: mask kinds (default {','.join(MASK_KINDS)})")

    def options_from_args(self, args) -> dict:
        return {"mask_kinds": args.masks} if args.masks else {}

    def cases(self, opts: RunOptions) -> list[Job]:
        own = opts.of(self)
        layer_n = (4096 if opts.lengths is None else max(opts.lengths)) if own.layer_n == "auto" else own.layer_n
        return cases(self.run_lengths(opts), opts.device, opts.dtype, opts.profile, own.mask_kinds, layer_n=layer_n,
                     names=list(opts.names) if opts.names is not None else None)

    run_case = staticmethod(run_case)  # the module's: the suite adds nothing

    def known_names(self) -> set[str]:
        return set(timed_backends())

    def settings(self, opts: RunOptions) -> dict:
        return {"mask_kinds": list(opts.of(self).mask_kinds)}

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return verdicts(records)

    def extra_results(self, records: list[dict]) -> dict:
        return {"auto_vs_sdpa": auto_vs_sdpa(records), "auto_vs_fastest": auto_vs_fastest(records)}

    def decision_rows(self, records: list[dict]) -> list[list[str]]:
        return decision_rows(records)

    def summary_lines(self, results: dict) -> list[str]:
        out: list[str] = []
        cs = self.own(results["cases"])
        if any(c["kind"] == "backend" for c in cs):
            out += ["", "kernels (time ms, peak MB beyond inputs):", text_table(*rows(cs, width=60))]
        if any(c["kind"] == "layer" for c in cs):
            out += ["", "layers:", text_table(*rows(cs, "layer", width=60))]
        if results.get("auto_vs_sdpa"):
            out += ["", "auto / sdpa time: " + ", ".join(
                f"{r['mask']} N={r['N']} {r['mode']}: {r['ratio']:.2f}" for r in results["auto_vs_sdpa"])]
        return out

    def report_sections(self, results: dict) -> list[tuple]:
        b: list[tuple] = [("h2", "Exact attention: backends")]
        cs = self.own(results["cases"])
        if any(c["kind"] == "backend" for c in cs):
            b.append(("p", "Time is the median per call; memory is the peak allocated beyond the inputs; FLOPs count "
                           "only allowed score elements; error is max|out−ref| / max|ref| against a float64 oracle."))
            b.append(("table", *rows(cs)))
        if results.get("auto_vs_fastest"):
            b.append(("p", "auto against the fastest backend measured: the backend it chose, and its time over the "
                           "fastest's (where auto runs a kernel another backend runs, that kernel is timed once and both rows "
                           "show its figures)."))
            b.append(("table", ["mask", "N", "mode", "auto chose", "fastest", "auto / fastest", "chosen / fastest"],
                      [[r["mask"], str(r["N"]), r["mode"], r.get("chosen") or "", r["fastest"],
                        f"{r['auto_over_fastest']:.2f}", num(r.get("chosen_over_fastest"), ".2f")]
                       for r in results["auto_vs_fastest"]]))
        if any(c["kind"] == "layer" for c in cs):
            b.append(("p", "attnlab MultiHeadAttention vs torch.nn.MultiheadAttention, same weights; error of "
                           "attnlab's output against torch's."))
            b.append(("table", *rows(cs, "layer")))
        return b if len(b) > 1 else []

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt) -> list[str]:
        kern = [c for c in cases if c["kind"] == "backend" and c["name"] != "reference"]
        masks = list(dict.fromkeys(c["mask"] for c in kern))
        overview = [[(f"{MASK_WORDS.get(m, m)}: time, fwd+bwd", [c for c in kern if c["mask"] == m and
                                                                 c["mode"] == "fwd_bwd"], "time_s", "ms per call", 1e3)
                     for m in masks],
                    [(f"{MASK_WORDS.get(m, m)}: peak memory, fwd+bwd", [c for c in kern if c["mask"] == m and
                                                                         c["mode"] == "fwd_bwd"], "peak_bytes",
                      "MB beyond inputs", 1 / 2**20) for m in masks]]
        files = line_plot(plt, out_dir, "kernels_overview.png", "exact attention backends, training step "
                                                                "(forward + backward)", overview)
        for m in masks:
            for what, key, ylabel, scale in (("time", "time_s", "ms per call", 1e3),
                                             ("memory", "peak_bytes", "MB beyond inputs", 1 / 2**20)):
                panels = [(MODE_WORDS[mode], [c for c in kern if c["mask"] == m and c["mode"] == mode], key, ylabel,
                           scale) for mode in MODES]
                files += line_plot(plt, out_dir, f"kernels_{what}_{m}.png", f"kernels, mask {m}: {what}", panels)
        return files

    def key_plots(self, files: list[str]) -> list[str]:
        return [f for f in files if f == "kernels_overview.png"]

    def tiny_options(self) -> dict | None:
        return {"lengths": [64], "names": ["math", "sdpa"],
                "suite_options": {SUITE: {"mask_kinds": ["causal"], "layer_n": None}}}


__all__ = ["BASELINE", "LENGTHS", "SUITE", "KernelCase", "KernelsOptions", "KernelsSuite", "auto_vs_fastest", "auto_vs_sdpa",
           "cases", "decision_rows", "rows", "run_case", "timed_backends", "verdicts"]
