"""The ``tasks`` suite, the arena: which attention keeps its accuracy at length, at what cost.

Speed and memory say what a mechanism costs; this suite says what it is worth. Each case
trains one model from scratch with :func:`attnlab.train.train` with the case's mechanism
in every attention layer (same seed, data, model and number of steps for every
mechanism: only the attention differs), then records

* the test score (accuracy; for the character LM also bits per character);
* the score as a fraction of exact attention's (computed when the report is made);
* the peak memory of the whole training run, as a ratio to naive and to lean exact;
* training tokens per second;
* the training time to reach 90 % of exact's final score (from the validation curve);
* the error of the mechanism's output against exact attention on the trained model's
  own q, k, v (captured on a test batch), ``max|out - exact| / max|exact|`` per layer,
  the largest over layers.

Tasks (:data:`TASKS`) at length ``N``:

* ``mqar``: multi-query associative recall (Zoology), ``N`` tokens with ``N / 16`` key-value
  pairs (16 to 128), causal;
* ``listops``: Long Range Arena's ListOps, expressions of ``N / 4`` to ``N - 1`` tokens
  (``N = 2000``: LRA's 500-1999), bidirectional with padding;
* ``chars``: tinyshakespeare (shared/data) at context ``N``, causal, scored in bits per
  character.

The arena model is the one of the PyTorch reruns of LRA (Nystromformer's and xFormers'):
2 layers, width 64, feed-forward 128, 2 heads, mean pooling for classification. Every
mechanism runs at its LRA settings (:data:`LRA_SETTINGS`: Nystrom 128 landmarks,
Performer 256 features, Linformer k = 256, windows of 256, BigBird blocks of 64, Reformer
2 hashes), each budget capped at ``N / 4`` so that none becomes exact attention at short
lengths. Two exact baselines: ``exact`` (the op's ``auto`` choice, memory-lean) and
``exact-naive`` (the ``math`` backend: the N x N formula, so the memory ratio is honest
against both). ``exact-naive`` computes the same function as ``exact``; it trains only
the first :data:`NAIVE_STEPS` steps, enough for its memory and speed.

A mechanism that cannot serve a task (Linformer and Nystrom under a causal mask) is a row
with the reason, found by calling it once on that mask before training.

Profiles (:data:`PROFILES`): ``quick`` (minutes: MQAR at N=64, ListOps at 128),
``standard`` (ListOps 2K, chars 1024, MQAR 256: about 1 h 30 min on two one-thread lanes
of a 2-core CPU), ``full`` (the tasks and lengths the user names).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import masks
from ..mechanisms import create, mechanisms
from .measure import Unsupported, peak_memory
from .report import arena_plots, task_rows, text_table
from .suite import RunOptions, Suite, register_suite
from .verdict import task_decision_rows, task_verdicts

SUITE = "tasks"

#: a case's hard time limit in seconds (a training run takes far longer than one kernel call)
TIMEOUT_S = 3600.0

#: the seed of every run
SEED = 0

#: trainer precision for each bench dtype
PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

#: the arena model: the LRA configuration of the PyTorch reruns (Nystromformer, xFormers)
ARENA_MODEL: dict[str, Any] = {"dim": 64, "heads": 2, "layers": 2, "ff_dim": 128}

#: each mechanism's settings in the LRA reruns (budgets are capped at N / 4, see :func:`mechanism_settings`)
LRA_SETTINGS: dict[str, dict[str, Any]] = {
    "nystrom": {"num_landmarks": 128},
    "performer": {"features": 256, "seed": SEED},
    "linformer": {"k": 256},
    "local": {"block_size": 256},
    "longformer": {"window": 256},
    "bigbird": {"block_size": 64, "seed": SEED},
    "reformer": {"bucket_size": 64, "n_hashes": 2, "seed": SEED},
}

#: the budget of each mechanism that the N / 4 cap applies to
_BUDGET_KEYS = {"nystrom": "num_landmarks", "linformer": "k", "local": "block_size", "longformer": "window",
                "bigbird": "block_size", "reformer": "bucket_size"}

#: steps ``exact-naive`` trains (it computes exact's function: only its memory and speed are new)
NAIVE_STEPS = 20

#: the score that must be reached, as a fraction of exact's final score, for "time to 90 %"
REACH_FRACTION = 0.9


@dataclass(frozen=True)
class Contender:
    """One row of the arena: a label, the registered mechanism and its fixed settings."""

    label: str
    mechanism: str
    settings: dict[str, Any] = field(default_factory=dict)


def contenders() -> list[Contender]:
    """``exact``, ``exact-naive``, then every other registered mechanism (sorted)."""
    out = [Contender("exact", "exact"), Contender("exact-naive", "exact", {"backend": "math"})]
    out += [Contender(name, name) for name in sorted(mechanisms()) if name != "exact"]
    return out


@dataclass(frozen=True)
class TaskAtLength:
    """How to build one arena task at length ``N``.

    Attributes:
        name: the task's registry name.
        min_n, max_n: the lengths the task's generator (or data) supports.
        lower_is_better: the score is a loss (bits per char) rather than an accuracy.
    """

    name: str
    min_n: int
    max_n: int
    lower_is_better: bool = False

    def options(self, n: int) -> dict[str, Any]:
        """Task options at length ``n``."""
        if self.name == "mqar":
            pairs = min(128, max(8, n // 128))  # 8 at N = 1024: see MQAR_NOTE
            return {"length": n, "pairs": pairs, "keys": 2 * pairs, "values": 16, "fillers": 1, "val_size": 256}
        if self.name == "listops":
            return {"min_length": max(8, n // 4), "max_length": n - 1, "train_size": 6000, "val_size": 500,
                    "test_size": 500}
        if self.name == "chars":
            return {"context": n}
        raise ValueError(f"no arena recipe for task {self.name!r}")

    def check(self, n: int) -> None:
        """Raise ValueError naming the range when ``n`` is outside what the task supports."""
        if not self.min_n <= n <= self.max_n:
            raise ValueError(f"length {n} is beyond what task {self.name!r} supports: "
                             f"N must be in [{self.min_n}, {self.max_n}]")


#: why MQAR has few pairs here: measured with ``attnlab train mqar`` on the arena model, 2-core CPU
MQAR_NOTE = ("exact attention learns MQAR only after a plateau that grows with the number of pairs: with 8 pairs "
             "it left it after ~250 steps at N=128 and ~350 at N=512 (batch 32); with 32 pairs at N=512 and 64 "
             "at N=1024 it was still at 14-15 % after 500 steps (batch 16), and with 8 pairs at N=1024 at 26 % after "
             "600 steps (batch 16); in the arena itself, 8 pairs at N=512 reached 31.5 % after 600 steps (batch 32). "
             "Zoology's 16-128 pairs need far more training than a 2-hour CPU profile allows, so the arena asks N/128 "
             "pairs (at least 8), and the standard profile runs MQAR at N=256 for 1,000 steps")

#: the arena's tasks
TASKS: dict[str, TaskAtLength] = {
    "mqar": TaskAtLength("mqar", 64, 16384),
    "listops": TaskAtLength("listops", 64, 8192),
    "chars": TaskAtLength("chars", 16, 65536, lower_is_better=True),
}


@dataclass(frozen=True)
class Run:
    """One training run of every contender: a task at a length, with its training budget."""

    task: str
    n: int
    steps: int
    batch_size: int
    eval_every: int
    train: dict[str, Any] = field(default_factory=dict)


#: the runs of each profile; ``full`` takes the user's tasks and lengths (:func:`full_runs`)
PROFILES: dict[str, list[Run]] = {
    "quick": [
        Run("mqar", 64, steps=250, batch_size=32, eval_every=50),
        Run("listops", 128, steps=100, batch_size=32, eval_every=50, train={"lr": 1e-3, "warmup": 20}),
    ],
    "standard": [
        Run("listops", 2000, steps=400, batch_size=16, eval_every=100, train={"lr": 1e-3, "warmup": 40}),
        Run("chars", 1024, steps=300, batch_size=8, eval_every=100, train={"warmup": 30}),
        Run("mqar", 256, steps=1000, batch_size=32, eval_every=100),  # 512 and 1K do not learn here: MQAR_NOTE
    ],
}


def full_runs(task_names: list[str] | None, lengths: list[int] | None) -> list[Run]:
    """The ``full`` profile: every named task (default all) at every length (default 1024, 2048)."""
    names = task_names or list(TASKS)
    out = []
    for name in names:
        if name not in TASKS:
            raise ValueError(f"arena task must be one of {sorted(TASKS)}, got {name!r}")
        for n in lengths or [1024, 2048]:
            TASKS[name].check(n)
            batch = max(4, min(32, 16384 // n))
            out.append(Run(name, n, steps=600, batch_size=batch, eval_every=100))
    return out


def runs_of(profile: str, task_names: list[str] | None = None, lengths: list[int] | None = None) -> list[Run]:
    """The runs of ``profile`` (``quick``, ``standard`` or ``full``), filtered to ``task_names``.

    For ``full``, ``lengths`` are the lengths to run; for the other profiles they keep only
    the profile's runs at those lengths.
    """
    if profile == "full":
        return full_runs(task_names, lengths)
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted([*PROFILES, 'full'])}, got {profile!r}")
    for name in task_names or []:
        if name not in TASKS:
            raise ValueError(f"arena task must be one of {sorted(TASKS)}, got {name!r}")
    runs = [r for r in PROFILES[profile] if (not task_names or r.task in task_names) and (not lengths or r.n in lengths)]
    if not runs:
        have = sorted({(r.task, r.n) for r in PROFILES[profile]})
        raise ValueError(f"profile {profile!r} has no run of tasks {task_names} at lengths {lengths}; it has {have}")
    return runs


def mechanism_settings(name: str, n: int, max_len: int) -> dict[str, Any]:
    """Settings of mechanism ``name`` for sequences of ``n`` tokens (model ``max_len``).

    The LRA settings (:data:`LRA_SETTINGS`), each budget of keys, buckets, projections or
    landmarks capped at ``n / 4`` so that no approximation becomes exact attention.
    """
    st = dict(LRA_SETTINGS.get(name, {}))
    key = _BUDGET_KEYS.get(name)
    if key is not None:
        st[key] = max(2, min(st[key], n // 4))
    if name == "linformer":
        st["max_len"] = max_len
    return st


def default_data_dir() -> str | None:
    """Where the shared data sets are: ``$ATTNLAB_DATA``, else ``../shared/data`` or ``shared/data``."""
    env = os.environ.get("ATTNLAB_DATA")
    if env:
        return env
    for cand in ("../shared/data", "shared/data"):
        if os.path.isdir(cand):
            return os.path.abspath(cand)
    return None


def _data_for(task: str, data_dir: str | None) -> str | None:
    if task != "chars":
        return None
    if data_dir is None:
        return None
    return str(Path(data_dir) / "tinyshakespeare" / "input.txt")


def cases(profile: str, device: str, dtype: str, names=None, *, task_names=None, lengths=None,
          data_dir: str | None = None, threads: int | None = None, overrides: dict | None = None) -> list[dict]:
    """The case specs: every contender (or those in ``names``) x run of ``profile``.

    Args:
        profile: ``quick``, ``standard`` or ``full``.
        names: contender labels to keep (``exact``, ``exact-naive`` or mechanism names).
        task_names: arena tasks to keep (default all of the profile).
        lengths: the lengths of the ``full`` profile.
        data_dir: the shared data folder (chars reads ``tinyshakespeare/input.txt`` there).
        threads: torch threads of each training run (None: torch's default).
        overrides: fields of every :class:`Run` to replace (``steps``, ``batch_size``, ``eval_every``):
            a tiny run for tests.
    """
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    from ..tasks import create_task

    runs = runs_of(profile, task_names, lengths)
    if overrides:
        bad = sorted(set(overrides) - {"steps", "batch_size", "eval_every"})
        if bad:
            raise ValueError(f"tasks overrides must be among ['batch_size', 'eval_every', 'steps'], got {bad}")
        runs = [dataclasses.replace(r, **overrides) for r in runs]
    known = {c.label for c in contenders()}
    if names is not None:
        unknown = [x for x in names if x not in known]
        if unknown:
            raise ValueError(f"arena contenders must be among {sorted(known)}, got {unknown}")
    data_dir = data_dir if data_dir is not None else default_data_dir()
    specs = []
    for run in runs:
        recipe = TASKS[run.task]
        recipe.check(run.n)
        options = recipe.options(run.n)
        data = _data_for(run.task, data_dir)
        task = create_task(run.task, data=data, seed=SEED, **options)
        skip = None
        if run.task == "chars" and (data is None or not os.path.isfile(data)):
            skip = {"status": "unsupported",
                    "reason": f"chars needs tinyshakespeare: set ATTNLAB_DATA to the shared data folder (looked for {data})"}
            vocab_model: dict[str, Any] = {"max_len": run.n}
        else:
            vocab_model = task.model_config()
        model = {**task.model_defaults, **vocab_model, **ARENA_MODEL}
        if task.model_type == "SequenceClassifier":
            model["pooling"] = "mean"
        mask = "causal" if task.model_type == "CausalLM" else "padding"
        max_len = int(model.get("max_len", run.n))
        for c in contenders():
            if names is not None and c.label not in names:
                continue
            mst = {**mechanism_settings(c.mechanism, run.n, max_len), **c.settings}
            steps = min(run.steps, NAIVE_STEPS) if c.label == "exact-naive" else run.steps
            specs.append({"suite": SUITE, "kind": "training", "name": c.label, "mask": mask, "N": run.n,
                          "B": run.batch_size, "H": ARENA_MODEL["heads"],
                          "D": ARENA_MODEL["dim"] // ARENA_MODEL["heads"], "dtype": dtype, "device": device,
                          "mode": "train",
                          "settings": {"task": run.task, "task_options": options, "data": data,
                                       "model": {k: v for k, v in ARENA_MODEL.items()} | (
                                           {"pooling": "mean"} if mask == "padding" else {}),
                                       "mechanism": c.mechanism, "mechanism_settings": mst, "steps": steps,
                                       "run_steps": run.steps, "batch_size": run.batch_size,
                                       "eval_every": min(run.eval_every, steps),
                                       "train": {**run.train, **({"threads": threads} if threads else {})},
                                       "seed": SEED, "lower_is_better": recipe.lower_is_better},
                          "skip": skip})
    return specs


def check_mask_support(name: str, settings: dict[str, Any], mask_kind: str, n: int, head_dim: int) -> None:
    """Raise :class:`Unsupported` when mechanism ``name`` cannot apply the task's mask.

    Calls the mechanism once on random ``(1, 2, n, head_dim)`` inputs with ``causal()``
    (causal tasks) or a key-padding mask (padded tasks).
    """
    torch.manual_seed(SEED)
    mech = create(name, **settings)
    q, k, v = (torch.randn(1, 2, n, head_dim) for _ in range(3))
    mask = masks.causal() if mask_kind == "causal" else masks.padding([n - n // 4])  # last quarter padding
    try:
        with torch.no_grad():
            mech(q, k, v, mask)
    except ValueError as e:
        raise Unsupported(f"{name} cannot serve this task's {mask_kind} mask: {e}") from e


@torch.no_grad()
def activation_error(model: torch.nn.Module, task, batch: dict[str, torch.Tensor]) -> float | None:
    """Largest, over attention layers, of ``max|mech - exact| / max|exact|`` on the model's own q, k, v.

    Runs the task's loss on ``batch`` in eval mode with a hook on every mechanism that
    records its inputs and output, then computes exact attention on the same inputs.
    Returns None when the model has no mechanism (nothing to compare).
    """
    from ..exact import attention
    from ..mechanisms import Mechanism
    from ..models.blocks import eval_mode

    seen: list[tuple] = []

    def hook(module, args, kwargs, out):
        q, k, v = args[:3]
        mask = args[3] if len(args) > 3 else kwargs.get("mask")
        seen.append((q.detach(), k.detach(), v.detach(), mask, kwargs.get("bias"),
                     out[0] if isinstance(out, tuple) else out))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, Mechanism)]
    try:
        with eval_mode(model):
            task.loss(model, batch)
    finally:
        for h in handles:
            h.remove()
    errors = []
    for q, k, v, mask, bias, out in seen:
        ref = attention(q.float(), k.float(), v.float(), mask=mask, bias=bias, backend="math")
        scale = float(ref.abs().max())
        errors.append(float((out.float() - ref).abs().max()) / scale if scale > 0 else 0.0)
    return max(errors) if errors else None


def _val_curve(out: str, lower: bool) -> list[list[float]]:
    """``[[step, score], ...]`` of the periodic validation records in ``out/metrics.jsonl``."""
    from ..train.metrics import read_metrics

    key = "bits_per_char" if lower else "accuracy"
    return [[int(r["step"]), float(r[key])] for r in read_metrics(Path(out) / "metrics.jsonl")
            if r.get("split") == "val" and not r.get("final") and key in r]


def run_case(spec: dict) -> dict:
    """Train the case's model and measure it (see the module docstring)."""
    from ..tasks import create_task
    from ..train import RunSpec, train

    st = spec["settings"]
    check_mask_support(st["mechanism"], st["mechanism_settings"], spec["mask"], spec["N"], spec["D"])
    if spec["dtype"] not in PRECISION:
        raise ValueError(f"dtype must be one of {sorted(PRECISION)}, got {spec['dtype']!r}")
    run = RunSpec(task=st["task"], data=st["data"], task_options=st["task_options"],
                  model={**st["model"], "mechanism": st["mechanism"], "mechanism_settings": st["mechanism_settings"]},
                  train={"steps": st["steps"], "batch_size": st["batch_size"], "seed": st["seed"],
                         "device": spec["device"], "precision": PRECISION[spec["dtype"]], "progress": False,
                         "eval_every": st["eval_every"], "eval_batch_size": st["batch_size"], "eval_batches": 8,
                         "save_every": 0, "keep_checkpoints": 1, **st["train"]})
    lower = bool(st["lower_is_better"])
    with tempfile.TemporaryDirectory(prefix="attnlab-arena-") as out:
        res, peak, method = peak_memory(lambda: train(run, out, quiet=True), spec["device"])
        curve = _val_curve(out, lower)
    split = "test" if "test" in res.metrics else "val"
    final = res.metrics.get(split, {})
    key = "bits_per_char" if lower else "accuracy"
    if key not in final:
        raise ValueError(f"task {st['task']!r} reported no {key} (got {sorted(final)})")
    task = create_task(st["task"], data=st["data"], seed=st["seed"], **st["task_options"])
    task.ensure_setup()
    tokens = sum(task.items_per_batch(task.train_batch(s, st["batch_size"])) for s in range(int(res.step)))
    eval_batch = {k: v.to(spec["device"]) for k, v in task.train_batch(10**6, st["batch_size"]).items()}
    act_err = activation_error(res.model, task, eval_batch)
    seconds = float(res.seconds)
    out_rec = {"time_s": seconds, "times_s": [seconds], "peak_bytes": peak,
               "peak_method": method + " (whole training run)", "accuracy": float(final.get("accuracy", math.nan)),
               "eval_loss": float(final["loss"]) if "loss" in final else None, "steps": int(res.step),
               "steps_per_s": res.step / seconds if seconds > 0 else None,
               "tokens_per_s": tokens / seconds if seconds > 0 else None, "score": float(final[key]),
               "score_name": key, "score_split": split, "curve": curve, "activation_error": act_err}
    if "accuracy" not in final:
        out_rec["accuracy"] = None
    return out_rec


# -- what the report derives from the finished cases -----------------------------------------------

#: exact attention "learned" a task when its score beats the trivial baseline by this much
#: (accuracy points; for bits per char, this fraction of the baseline); the verdict uses the same
from .verdict import LEARNED_MARGIN  # noqa: E402

_baselines: dict[str, float | None] = {}


def baseline_score(task_name: str, options: dict[str, Any], data: str | None) -> float | None:
    """The score of a predictor that ignores the input, on the split the arena scores.

    Classification (ListOps): the most frequent test label's share. Recall (MQAR): the
    most frequent answer token's share among the test answers. Character LM: the
    unigram model's bits per character on the validation text (fitted on the training
    text). None when the task's data is missing.
    """
    import collections
    import json

    from ..tasks import create_task

    key = json.dumps([task_name, options, data], sort_keys=True, default=str)
    if key in _baselines:
        return _baselines[key]
    try:
        task = create_task(task_name, data=data, seed=SEED, **options)
        task.ensure_setup()
    except (ValueError, OSError):
        _baselines[key] = None
        return None
    if task_name == "listops":
        labels = collections.Counter(y for _, y in task.ids["test"])
        value = labels.most_common(1)[0][1] / sum(labels.values())
    elif task_name == "chars":
        counts = torch.bincount(task.train_ids, minlength=len(task.vocab)).double() + 1.0  # add-one smoothing
        logp = torch.log2(counts / counts.sum())
        value = float(-logp[task.val_ids].mean())
    else:  # a causal LM task scored on its masked answers
        tokens, mask = task._test
        answers = tokens[:, 1:][mask]
        value = float(torch.bincount(answers).max()) / max(1, answers.numel())
    _baselines[key] = value
    return value


def _learned(exact: dict) -> bool | None:
    """Whether exact attention beat the trivial baseline (None: no baseline to compare)."""
    st = exact["settings"]
    base = baseline_score(st["task"], st["task_options"], st.get("data"))
    exact["baseline_score"] = base
    if base is None:
        return None
    if st["lower_is_better"]:
        return exact["score"] <= base * (1 - LEARNED_MARGIN)
    return exact["score"] >= base + LEARNED_MARGIN


def _ok(c: dict) -> bool:
    return c["status"] == "ok" and c.get("score") is not None


def arena_groups(cases_: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """Arena cases grouped by ``(task, N)``, in run order."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for c in cases_:
        if c["suite"] == SUITE:
            groups.setdefault((c["settings"]["task"], c["N"]), []).append(c)
    return groups


def derive(cases_: list[dict]) -> None:
    """Fill in each arena case's figures relative to exact (in place).

    ``score_ratio``: score / exact's (accuracy), exact's / score (bits per char);
    ``mem_vs_naive`` / ``mem_vs_lean``: peak memory over ``exact-naive``'s / ``exact``'s;
    ``time_to_reach_s``: training seconds until the validation score first reached
    :data:`REACH_FRACTION` of exact's final score (None: never within the run);
    ``exact_learned``: whether exact attention beat the trivial baseline
    (:func:`baseline_score`, stored on exact's case as ``baseline_score``) by
    :data:`LEARNED_MARGIN`; when it did not, the ratios say nothing about accuracy.
    """
    for group in arena_groups(cases_).values():
        exact = next((c for c in group if c["name"] == "exact" and _ok(c)), None)
        naive = next((c for c in group if c["name"] == "exact-naive" and c["status"] == "ok"), None)
        learned = _learned(exact) if exact is not None else None
        for c in group:
            c["score_ratio"] = c["mem_vs_naive"] = c["mem_vs_lean"] = c["time_to_reach_s"] = None
            c["exact_learned"] = learned
            if c["status"] != "ok":
                continue
            lower = c["settings"]["lower_is_better"]
            peak = c.get("peak_bytes")
            if peak and naive is not None and naive.get("peak_bytes"):
                c["mem_vs_naive"] = peak / naive["peak_bytes"]
            if peak and exact is not None and exact.get("peak_bytes"):
                c["mem_vs_lean"] = peak / exact["peak_bytes"]
            if exact is None or c["name"] == "exact-naive" or not _ok(c):
                continue
            e, s = exact["score"], c["score"]
            c["score_ratio"] = (e / s if s > 0 else None) if lower else (s / e if e > 0 else None)
            goal = e / REACH_FRACTION if lower else e * REACH_FRACTION
            per_step = c["time_s"] / c["steps"] if c.get("steps") else None
            for step, val in c.get("curve") or []:
                if (val <= goal) if lower else (val >= goal):
                    c["time_to_reach_s"] = step * per_step if per_step else None
                    break
            else:
                if (s <= goal) if lower else (s >= goal):
                    c["time_to_reach_s"] = c["time_s"]


# -- the suite object ----------------------------------------------------------------------------

_NUM_OR_NULL = {"type": ["number", "null"]}
_POS_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}


class TasksSuite(Suite):
    """The arena: every mechanism trained on the same tasks; run only when asked for (it takes minutes)."""

    name = SUITE
    summary = "the arena: every mechanism trained from scratch on the same tasks (accuracy at length, cost)"
    default = False
    order = 40
    headline = True
    kinds = ("training",)
    modes = ("train",)
    result_keys = ("accuracy", "eval_loss", "steps", "steps_per_s", "score", "score_name", "score_split", "curve",
                   "activation_error", "tokens_per_s")
    record_defaults = {"accuracy": None}
    case_properties = {
        "accuracy": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                     "description": "tasks: accuracy on the task's test split after training"},
        "eval_loss": {**_NUM_OR_NULL, "description": "tasks: loss on the test split"},
        "steps": {"type": "integer", "minimum": 0, "description": "tasks: optimizer steps taken"},
        "steps_per_s": {**_POS_OR_NULL, "description": "tasks: training steps per second"},
        "score": {**_NUM_OR_NULL, "description": "tasks: the task's score (accuracy, or bits per char for chars)"},
        "score_name": {"type": "string", "enum": ["accuracy", "bits_per_char"]},
        "score_split": {"type": "string", "description": "tasks: the split the score is measured on"},
        "curve": {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                  "description": "tasks: [step, validation score] during training"},
        "activation_error": {"type": ["number", "null"], "minimum": 0,
                             "description": "tasks: max|out-exact|/max|exact| on the trained model's own q, k, v "
                                            "(largest over layers)"},
        "score_ratio": {**_NUM_OR_NULL, "description": "tasks: score as a fraction of exact's (bits per char: "
                                                       "exact's / this)"},
        "mem_vs_naive": {**_POS_OR_NULL, "description": "tasks: peak memory / exact-naive's"},
        "mem_vs_lean": {**_POS_OR_NULL, "description": "tasks: peak memory / exact's (memory-lean)"},
        "exact_learned": {"type": ["boolean", "null"],
                          "description": "tasks: exact attention beat the trivial baseline (else the ratios say "
                                         "nothing about accuracy; null: no baseline)"},
        "baseline_score": {**_NUM_OR_NULL, "description": "tasks (exact's case): the score of a predictor that "
                                                          "ignores the input"},
        "time_to_reach_s": {**_POS_OR_NULL, "description": "tasks: training seconds until the validation score "
                                                           "reached 90 % of exact's final score"},
    }
    settings_properties = {"tasks": {"type": "array", "items": {"type": "string"},
                                     "description": "arena tasks asked for"}}
    verdict_properties = {"task": {"type": "string"},
                          "close_to_exact": {"type": "array", "items": {"type": "string"},
                                             "description": "tasks: mechanisms that hold 90 % of exact's score"}}

    def check(self, opts: RunOptions) -> None:
        bad = sorted(set(opts.options_for(self.name)) - {"overrides"})
        if bad:
            raise ValueError(f"suite_options of tasks must be among ['overrides'], got {bad}")

    def cases(self, opts: RunOptions) -> list[dict]:
        specs = cases(opts.profile, opts.device, opts.dtype, names=opts.names, task_names=opts.task_names,
                      lengths=opts.lengths, data_dir=opts.data_dir, threads=opts.threads,
                      overrides=opts.options_for(self.name).get("overrides"))
        timeout = float(opts.user_timeout or TIMEOUT_S)  # a whole training run: far longer than a kernel call
        return [{**s, "timeout_s": timeout} for s in specs]

    def run_case(self, spec: dict) -> dict:
        return run_case(spec)

    def known_names(self) -> set[str]:
        return {c.label for c in contenders()}

    def settings(self, opts: RunOptions) -> dict:
        return {"tasks": list(opts.task_names)} if opts.task_names else {}

    def label(self, spec: dict) -> str:
        return f"tasks {spec['name']} on {spec['settings']['task']} ({spec['settings']['steps']} steps)"

    def finish(self, records: list[dict]) -> None:
        derive(records)

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return task_verdicts(records)

    def decision_rows(self, records: list[dict]) -> list[list[str]]:
        return task_decision_rows(records)

    def summary_lines(self, results: dict) -> list[str]:
        if not self.own(results["cases"]):
            return []
        return ["", "tasks (each mechanism trained from scratch, same seed, data and steps):",
                text_table(*task_rows(results, width=60))]

    def report_blocks(self, results: dict) -> list[tuple]:
        if not self.own(results["cases"]):
            return []
        return [("h2", "Arena: accuracy at length"),
                ("p", "Each mechanism trains the same model (2 layers, width 64, 2 heads: the LRA reruns' "
                      "configuration) from scratch on each task, with the same seed, data and steps; only the "
                      "attention differs. Score: test accuracy (chars: validation bits per character). 'vs exact': "
                      "score as a fraction of exact attention's. Memory: peak of the whole training run beyond what "
                      "the process held before, as a ratio to exact through the naive N×N formula (exact-naive, "
                      "which trains a few steps only: it computes the same function) and to memory-lean exact. "
                      "'to 90 %': training seconds until the validation score first reached 90 % of exact's final "
                      "score. 'act. error': max|out−exact| / max|exact| on the trained model's own q, k, v "
                      "(largest over layers). Settings: each mechanism's LRA settings, capped at N/4."),
                ("table", *task_rows(results))]

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt) -> list[str]:
        return arena_plots(self.own(cases), out_dir, plt)

    def tiny_options(self) -> dict | None:
        return {"profile": "full", "task_names": ["mqar"], "lengths": [64], "names": ["exact"],
                "suite_options": {SUITE: {"overrides": {"steps": 2, "batch_size": 2, "eval_every": 2}}}}


register_suite(TasksSuite())

__all__ = ["ARENA_MODEL", "LRA_SETTINGS", "NAIVE_STEPS", "PROFILES", "SUITE", "TASKS", "TIMEOUT_S", "Contender",
           "Run", "TaskAtLength", "TasksSuite", "activation_error", "arena_groups", "cases", "check_mask_support",
           "contenders", "derive", "mechanism_settings", "run_case", "runs_of"]
