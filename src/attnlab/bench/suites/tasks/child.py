"""What an arena case's child process does: train a contender, or swap a mechanism into exact's model.

Every case builds its task once (at the target length) and hands it to the trainer, which
builds the shorter phases from it (:meth:`attnlab.tasks.Task.at_length`). The record holds:

* ``score`` on the task's held-out split (``score_name`` its metric: accuracy, sequence
  accuracy or bits per character), ``baseline_score`` (the task's trivial predictor on the
  same split, :meth:`attnlab.tasks.Task.baseline`), the validation ``curve``;
* ``peak_bytes`` of the whole training call, ``time_s`` its seconds, ``tokens_per_s`` at the
  target length (the last phase's tokens over its seconds) and ``phases`` (each phase's length,
  batch, steps, tokens and seconds, counted by the trainer);
* ``activation_error``: ``max|out - exact| / max|exact|`` of each attention layer on the trained
  model's own q, k, v over a held-out batch, the largest over layers;
* a swap-in also ``score_0`` (exact's trained model with the mechanism in place, no training)
  and, after ``swap_steps`` fine-tuning steps at the target length, ``score`` and its cost;
* a video run also ``accuracy_frames_shuffled`` (the test videos with their frames shuffled);
* a ``cost`` case only ``peak_bytes`` (one training step, forward, backward and AdamW, beyond what
  was held before it, after one that builds the optimizer's state) and ``time_s`` (the median of
  up to :data:`~.plan.COST_STEPS` more such steps; ``times_s`` all of them).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from .... import masks
from ....mechanisms import create
from ...measure import TRAINING_MMAP_BYTES, Unsupported, measure_op, peak_memory
from ...suite import Context
from .plan import COST_STEPS, ArenaCase

#: seconds of timed steps after which a cost case stops adding more (at least one is timed)
COST_BUDGET_S = 60.0

#: trainer precision for each bench dtype
PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def check_mask_support(name: str, settings: dict[str, Any], mask_kind: str, n: int, head_dim: int) -> None:
    """Raise :class:`Unsupported` when mechanism ``name`` cannot apply the task's mask.

    Calls the mechanism once on random ``(1, 2, n, head_dim)`` inputs with ``causal()``
    (causal tasks) or a key-padding mask (padded tasks).
    """
    torch.manual_seed(0)
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
    from ....exact import attention
    from ....mechanisms import Mechanism
    from ....utils import eval_mode

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


def _model_overrides(case: ArenaCase, task) -> dict[str, Any]:
    if case.attention is not None:  # a video variant: exact attention under its structure
        return {**case.model_fields, "positional": case.positional, "attention": case.attention}
    model = {**case.model_fields, "positional": case.positional, "mechanism": case.mechanism,
             "mechanism_settings": dict(case.mechanism_settings)}
    if task.model_type == "SequenceClassifier":
        model["pooling"] = "mean"
    return model


def _run_spec(case: ArenaCase, task, ctx: Context, **train: Any):
    from ....train import RunSpec

    size, batches = case.eval_batches
    settings = {"curriculum": [list(p) for p in case.curriculum], "batch_size": case.batch_size, "seed": case.seed,
                "device": case.device, "precision": PRECISION[case.dtype], "progress": False, "eval_every": 0,
                "eval_steps": case.eval_steps, "eval_batch_size": size, "eval_batches": batches,
                "final_splits": [_split(task)], "save_every": 0, "save_steps": list(case.save_steps),
                "keep_checkpoints": 0 if case.save_steps else 1, "threads": ctx.threads or 0,
                **case.train, **train}
    return RunSpec(task=case.task, data=_data_file(case, ctx), task_options=dict(case.task_options),
                   model=_model_overrides(case, task), train=settings)


def _data_file(case: ArenaCase, ctx: Context) -> str | None:
    """The file of the case's data set (None: the task makes its own data)."""
    if case.data is None:
        return None
    if case.data not in ctx.data_files:
        raise ValueError(f"arena case {case.contender} on {case.task} reads {case.data}, which its job does not carry")
    return ctx.data_files[case.data]


def _path(ctx: Context, relative: str | None) -> str | None:
    """A run folder of the case, under the bench run's ``out_dir``."""
    if relative is None:
        return None
    if ctx.out_dir is None:
        raise ValueError(f"an arena case reads and writes {relative!r} under its run's folder, but its job has no out_dir")
    return os.path.join(ctx.out_dir, relative)


def _split(task) -> str:
    return "test" if "test" in task.eval_splits else "val"


def _curve(out: str, metric: str, n: int) -> list[list[float]]:
    """``[[step, score], ...]`` of the periodic validation records at the target length ``n`` in ``out/metrics.jsonl``."""
    from ....train.metrics import read_metrics

    return [[int(r["step"]), float(r[metric])] for r in read_metrics(Path(out) / "metrics.jsonl")
            if r.get("split") == "val" and not r.get("final") and metric in r and r.get("length", n) == n]


def _task(case: ArenaCase, ctx: Context):
    from ....tasks import create_task

    if case.dtype not in PRECISION:
        raise ValueError(f"dtype must be one of {sorted(PRECISION)}, got {case.dtype!r}")
    task = create_task(case.task, data=_data_file(case, ctx), seed=case.seed, **case.task_options)
    check_mask_support(case.mechanism, case.mechanism_settings, task.attention_mask, case.n, case.header()["D"])
    return task


def _figures(res, task, out: str, peak, method: str, n: int) -> dict[str, Any]:
    """The record's figures of a finished training call ``res`` (target length ``n``)."""
    split, metric = _split(task), task.score_metric
    final = res.metrics.get(split, {})
    if metric not in final:
        raise ValueError(f"task {task.name!r} reported no {metric} on {split} (got {sorted(final)})")
    last = res.phases[-1] if res.phases else {"items": res.items, "seconds": res.seconds}
    seconds = float(res.seconds)
    batch = task.example_batch(split, 8)
    return {"time_s": seconds, "times_s": [seconds], "peak_bytes": peak,
            "peak_method": method + " (whole training call)", "steps": int(res.step),
            "score": float(final[metric]), "score_name": metric, "score_split": split,
            "accuracy": float(final["accuracy"]) if "accuracy" in final else None,
            "eval_loss": float(final["loss"]) if "loss" in final else None,
            "tokens_per_s": last["items"] / last["seconds"] if last["seconds"] > 0 else None,
            "phases": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in p.items()} for p in res.phases],
            "curve": _curve(out, metric, n), "activation_error": activation_error(res.model, task, batch),
            "baseline_score": task.baseline(split),
            **({"accuracy_frames_shuffled": float(final["accuracy_frames_shuffled"])}
               if "accuracy_frames_shuffled" in final else {})}


def run_train(case: ArenaCase, ctx: Context) -> dict:
    """Train the case's contender with the curriculum (``train``), or a few steps at N (``naive``).

    A case with ``continue_step`` continues from exact's checkpoint of that step; its record
    counts exact's seconds and phases up to there (read from exact's record, ``ctx.needed``)
    as its own, since it would have trained them identically.
    """
    from ....train import train
    from ....train.checkpoint import checkpoint_at

    task = _task(case, ctx)
    more = {}
    if case.continue_step:
        more["continue_from"] = str(checkpoint_at(_path(ctx, case.source_dir), case.continue_step))
    run_spec = _run_spec(case, task, ctx, **more)
    with tempfile.TemporaryDirectory(prefix="attnlab-arena-") as tmp:
        out = _path(ctx, case.run_dir) or tmp
        res, peak, method = peak_memory(lambda: train(run_spec, out, quiet=True, task=task), case.device,
                                         TRAINING_MMAP_BYTES)
        rec = _figures(res, task, out, peak, method, case.n)
    if case.kind == "naive":
        rec["note"] = "cost only: the math backend computes exact's function; trained a few steps at N"
    if case.continue_step:
        _count_continued_phases(rec, case, ctx)
    return rec


def _count_continued_phases(rec: dict, case: ArenaCase, ctx: Context) -> None:
    """Add the phases up to ``case.continue_step`` of the run it continues (exact's, or a video variant's shorter
    run: its record in ``ctx.needed``) to a continuing case's record."""
    exact = next(iter(ctx.needed.values()), None)
    if exact is None:
        raise ValueError(f"{case.contender} continues from {case.source_dir}, but its job carries no record of that run")
    done, step = [], 0
    for p in exact.get("phases") or []:
        if step + p["steps"] > case.continue_step:
            break
        done.append(p)
        step += p["steps"]
    seconds = sum(p["seconds"] for p in done)
    rec["phases"] = done + rec["phases"]
    rec["time_s"] += seconds
    rec["times_s"] = [rec["time_s"]]
    rec["continued_from"] = {"step": case.continue_step, "seconds": seconds}


def swapped_model(case: ArenaCase, task, source: str):
    """Exact's trained model (the checkpoint in ``source``) with ``case``'s mechanism in every layer.

    Parameters the mechanism adds keep the initialisation it gives them when it is created
    (seeded by the case's seed); everything else is the trained model's.
    """
    from ....train import build_model
    from ....train.trainer import load_initial_weights

    torch.manual_seed(case.seed)
    model = build_model(task, _model_overrides(case, task))
    load_initial_weights(model, source)
    return model.eval()


def run_swap_in(case: ArenaCase, ctx: Context) -> dict:
    """Score exact's model with the mechanism swapped in: untouched, then after ``swap_steps`` steps at N."""
    from ....train import train

    source = _path(ctx, case.source_dir)
    if not source or not Path(source).is_dir():
        raise ValueError(f"the swap-in needs exact's trained run at {source!r}")
    task = _task(case, ctx)
    task.ensure_setup()
    split, metric = _split(task), task.score_metric
    model = swapped_model(case, task, source)
    score_0 = task.evaluate(model, split, batch_size=case.batch_size, final=True)[metric]
    lr = float(case.train.get("lr", type(task).train_defaults.get("lr", 1e-3)))
    fine = _run_spec(case, task, ctx, curriculum=None, steps=case.swap_steps, batch_size=case.batch_size,
                     init_from=source, lr=0.3 * lr, min_lr=0.03 * lr, warmup=min(5, case.swap_steps),
                     decay_steps=min(int(case.train.get("decay_steps", 0)), case.swap_steps), eval_steps=None)
    with tempfile.TemporaryDirectory(prefix="attnlab-swap-") as out:
        res, peak, method = peak_memory(lambda: train(fine, out, quiet=True, task=task), case.device,
                                         TRAINING_MMAP_BYTES)
        rec = _figures(res, task, out, peak, method, case.n)
    rec["score_0"] = float(score_0)
    rec["peak_method"] = method + " (the fine-tuning call)"
    if not math.isfinite(rec["score_0"]):
        rec["score_0"] = None
    return rec


def run_cost(case: ArenaCase, ctx: Context) -> dict:
    """Time a training step of the case's model (forward, backward, AdamW) at its task options, and its memory.

    :func:`~attnlab.bench.measure.measure_op` on the step: a first one (the optimizer's state), one whose
    peak memory is measured, then :data:`~.plan.COST_STEPS` timed ones (fewer past :data:`COST_BUDGET_S`).
    """
    from ....train import build_model

    if case.dtype != "float32":
        raise Unsupported(f"a cost case times float32 training steps, not {case.dtype}")
    if ctx.threads:
        torch.set_num_threads(ctx.threads)
    task = _task(case, ctx)
    task.ensure_setup()
    batch = {k: v.to(case.device) for k, v in task.train_batch(0, case.batch_size).items()}
    torch.manual_seed(case.seed)
    model = build_model(task, _model_overrides(case, task)).to(case.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=float(case.train.get("lr", 1e-3)))

    def step() -> None:
        loss, _ = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()

    rec = measure_op(step, case.device, COST_STEPS, COST_BUDGET_S)
    rec["peak_method"] += " (one training step)"
    patch = task.options["patch_size"]
    return {**rec, "steps": 2 + len(rec["times_s"]),
            "note": f"cost only: a training step at {patch}x{patch} patches, batch {case.batch_size}"}


def run_case(case: ArenaCase, ctx: Context) -> dict:
    """Measure one arena case in this process (see the module docstring)."""
    if case.kind == "cost":
        return run_cost(case, ctx)
    return run_swap_in(case, ctx) if case.kind == "swap_in" else run_train(case, ctx)
