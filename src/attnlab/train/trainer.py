"""The training loop: AdamW, warm-up schedules, clipping, mixed precision, checkpoints, resume.

One function, :func:`train`, runs a :class:`~attnlab.train.config.RunSpec` (task, model
overrides, trainer settings) and returns a :class:`~attnlab.train.config.TrainResult`.
Each step it sets the learning rate from the schedule (:mod:`~attnlab.train.schedule`),
draws the batch of that step from the task (a pure function of seed and step), computes
the loss under autocast (plus an optional attention-entropy or L2 penalty, and the
penalties mechanisms put on their own parameters: :func:`attnlab.mechanisms.extra_loss`),
backpropagates (through a gradient scaler for fp16), clips the global gradient norm and
steps AdamW (Loshchilov and Hutter, 2019; weight decay on matrices only), or Adam with the
decay as an L2 penalty (``optimizer="adam"``). Every ``eval_every`` steps it evaluates on the
validation split (with ``early_stopping_patience``, it stops once the validation loss has not
improved for that many evaluations and restores the best weights); every ``save_every`` steps
and at the end it writes an atomic checkpoint (:mod:`~attnlab.train.checkpoint`).
``resume=True`` continues from the run directory's latest checkpoint so that the
continuation equals the uninterrupted run: model, optimizer moments, grad-scaler state,
every RNG and the step (hence the data position and learning rate) are restored.

A length curriculum (``TrainConfig.curriculum``, e.g. ``64:200,512:100:16``) trains phases
of the same task at increasing sequence lengths (:meth:`attnlab.tasks.Task.at_length`),
each with its batch size: the model is built once for the last (longest) phase, so its
positions (learned tables, rotary caches) cover every phase; the optimizer and the
learning-rate schedule run over all steps; the phase of a step is a function of the step,
so checkpoints and ``resume`` cross phase boundaries like any other step. Evaluation is on
the last phase's task (the target length). ``init_from`` starts from another run's weights
(the swap-in of another attention into a trained model). A
latest checkpoint whose files no longer read (truncated, emptied) is skipped with one
warning line on stderr, and the run continues from the newest one that loads: at most
one save interval is redone.

Under ``torchrun`` the model is wrapped in DistributedDataParallel and each rank takes
its slice of every global batch (:mod:`~attnlab.train.distributed`). Each rank saves and
restores its own RNG states (torch CPU and its CUDA device, Python, NumPy), so dropout
continues on every rank as if uninterrupted.

On a GPU the loop reads the loss back (a host-device sync) only every ``log_every``
steps: the non-finite-loss check accumulates on the device in between. On the CPU,
where reading costs nothing, it checks every step.

How the pieces fit, in the order a run meets them:

* :mod:`~attnlab.train.config` - the settings; :mod:`~attnlab.train.precision` - what
  ``auto`` precision becomes; :mod:`attnlab.models.init` - the weight init schemes.
* :func:`_setup` builds a :class:`_Run` (task, model, optimizer, precision, outputs),
  new or from a checkpoint; :func:`_loop` calls :func:`_train_step` until done, with
  :func:`_evaluate` and :func:`_checkpoint` on their schedules; :func:`_finish` writes
  the last checkpoint, the final evaluation and ``result.json``.

Cost per step: one forward and backward of the model on ``B`` examples, plus an
O(parameters) optimizer update (and all-reduce under DDP).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..distributed import ContextParallel, SequenceParallel
from ..mechanisms import extra_loss as mechanism_loss
from ..mechanisms import log_values as mechanism_logs
from ..models.blocks import eval_mode
from ..models.init import init_weights
from ..models.io import read_config
from ..tasks import Task, create_task
from ..tasks.base import attention_penalty
from . import distributed as dist_utils
from .checkpoint import (
    capture_rank_rng,
    load_checkpoint,
    load_resumable,
    restore_rank_rng,
    save_checkpoint,
    unflatten_optimizer,
)
from .config import RunSpec, TrainConfig, TrainResult, parse_duration, resolve_train_config
from .metrics import MetricsWriter
from .precision import autocast, measure_cpu_bf16, resolve_precision
from .progress import Progress, format_duration
from .schedule import lr_at

__all__ = ["build_model", "load_initial_weights", "load_run", "train"]


def train(spec: RunSpec, out: str | Path, *, resume: bool = False, stop_at: int | None = None,
          quiet: bool = False, task: Task | None = None) -> TrainResult:
    """Train ``spec`` into the run directory ``out``.

    Args:
        spec: task, data, options, model overrides and trainer settings.
        out: run directory (``run.json``, ``metrics.jsonl``, ``checkpoints/``, ``latest``).
        resume: continue from ``out``'s latest checkpoint (ValueError if there is none).
        stop_at: stop (with a checkpoint, without final evaluation) once this many
            steps are done - what a run killed right after that checkpoint leaves.
        quiet: no progress line or log messages.
        task: the task of ``spec`` when the caller has built it already (its name, data, seed and
            options must be ``spec``'s): it is used instead of a new one, and set up here.

    Returns:
        A :class:`~attnlab.train.config.TrainResult`.
    """
    out = Path(out)
    info = dist_utils.setup(spec.train.get("device", "auto"), parse_duration(spec.train.get("dist_timeout")))
    try:
        run = _setup(spec, out, info, resume=resume, quiet=quiet, task=task)
        loop = _loop(run, stop_at)
        run.progress.close()  # a run stopped early (time budget, stop_at) leaves no bar open
        return _finish(run, loop, final_eval=run.cfg.final_eval and stop_at is None)
    finally:
        dist_utils.cleanup(info)


def build_model(task: Task, overrides: dict[str, Any]) -> nn.Module:
    """The task's model: its defaults, the data-dependent fields, then ``overrides``."""
    from ..models import model_types

    cls = model_types()[task.model_type]
    fields_ = {**task.model_defaults, **task.model_config(), **overrides}
    return cls(cls.config_class.from_dict(fields_))


def load_run(checkpoint: str | Path, *, data: str | None = None, map_location: str = "cpu",
             need_data: bool = False) -> tuple[Task, nn.Module, dict[str, Any]]:
    """The task, model (eval mode) and trainer state of a checkpoint (or run directory).

    Args:
        checkpoint: a checkpoint directory or the run directory (its latest checkpoint).
        data: replaces the data path the run was trained with.
        need_data: also read the task's data (evaluation), not just its vocabulary.
    """
    from ..models import from_pretrained

    state, _ = load_checkpoint(checkpoint, map_location)
    run = state["run"]
    task = create_task(run["task"], data=data if data is not None else run["data"], seed=run["seed"],
                       **run["task_options"])
    has_assets = task.load_assets(Path(state["path"]))
    if need_data or not has_assets:
        task.ensure_setup()
    model = from_pretrained(state["path"], map_location=map_location)
    return task, model, state


# -- setup ----------------------------------------------------------------------------
@dataclass
class _Run:
    """What the step, evaluation and checkpoint functions of one run share (built by :func:`_setup`)."""

    task: Task
    cfg: TrainConfig
    info: dist_utils.DistInfo
    out: Path
    model: nn.Module  # the bare model: initialised, clipped, evaluated and saved
    ddp: nn.Module  # what the training step calls: the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: str
    why: str  # the reason for the precision, shown in the first log line and the result
    record: dict[str, Any]  # run.json, stored again in every checkpoint
    start: int  # the step this process starts at (0, or a resumed checkpoint's)
    phase_tasks: list[Task]  # the task of each curriculum phase ([task] without a curriculum)
    progress: Progress
    writer: MetricsWriter
    quiet: bool
    context: int = 1  # ranks sharing each sequence (--context-parallel)
    data_rank: int = 0  # this rank's data-parallel index, of data_world = world / context
    data_world: int = 1

    @property
    def penalty(self) -> bool:
        return self.cfg.attn_penalty != "none" and self.cfg.attn_penalty_weight != 0.0

    def log(self, text: str) -> None:
        _log(self.info, self.quiet, self.progress, text)


def _log(info: dist_utils.DistInfo, quiet: bool, progress: Progress, text: str) -> None:
    if info.is_main and not quiet:
        progress.message(text)


def _setup(spec: RunSpec, out: Path, info: dist_utils.DistInfo, *, resume: bool, quiet: bool,
           task: Task | None = None) -> _Run:
    """Task, settings, model, optimizer, precision and outputs of a new or resumed run; writes ``run.json``.

    The order matters for reproducibility: the global RNGs are seeded after the task is
    created and before the model is built, so the same seed gives the same weights.
    """
    seed = int(spec.train.get("seed", 0))
    task = _given_task(task, spec, seed) if task is not None else create_task(
        spec.task, data=spec.data, seed=seed, **spec.task_options)
    cfg = resolve_train_config(task, spec)
    phase_tasks = [task.at_length(p.length) for p in cfg.curriculum] if cfg.curriculum else [task]
    task = phase_tasks[-1]  # the target length: the model, the evaluation and the checkpoints' assets
    _final_splits(task, cfg)  # a bad name fails now, not after the training
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cp = cfg.context_parallel
    if info.world % cp or (cp > 1 and task.model_type != "CausalLM"):
        raise ValueError(f"context_parallel={cp} needs a CausalLM task run by a multiple of {cp} torchrun processes, "
                         f"got task {task.name} ({task.model_type}) on {info.world} process(es)")
    for batch in {cfg.batch_size, *(p.batch_size for p in cfg.curriculum or () if p.batch_size)}:
        if batch % (info.world // cp):
            raise ValueError(f"batch sizes must be divisible by the {info.world // cp} data-parallel groups "
                             f"({info.world} processes / context_parallel {cp}), got {batch}")
    state, tensors, weights = _load_for_resume(out, task, info) if resume else (None, {}, {})
    if not resume and cfg.continue_from is not None:
        state, tensors, weights = _load_to_continue(cfg.continue_from, task)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    task.ensure_setup()
    model = _new_model(task, spec, cfg, state if resume else None).to(info.device)
    optimizer = _optimizer(model, cfg)
    precision, why = _pick_precision(task, model, cfg, info, state)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    start = 0 if state is None else _restore(state, tensors, weights, model, optimizer, scaler, precision, info)
    record = {"task": task.name, "data": task.data, "seed": seed, "task_options": task.options,
              "model": model.config.to_dict(), "model_type": type(model).__name__, "train": cfg.to_dict(),
              "world_size": info.world}
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    ddp = model
    if cp > 1 and getattr(model.config, "checkpointing", False):
        # the recomputation in backward would run outside the sharding context, on the shard alone
        raise ValueError("context_parallel > 1 needs the model's checkpointing off (--model checkpointing=false)")
    if cp > 1:  # every sequence sharded over this rank's block of cp consecutive ranks
        ddp = ContextParallel(model, SequenceParallel(_context_group(info, cp), cfg.context_strategy))
    if info.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(ddp, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    progress = Progress(cfg.steps, start, enabled=cfg.progress and not quiet and info.is_main,
                        every=max(cfg.log_every, 1), unit=task.item_unit, time_budget=cfg.time_budget)
    n_params = sum(p.numel() for p in model.parameters())
    _log(info, quiet, progress, f"attnlab train {task.name}: {type(model).__name__} {n_params:,} parameters, "
         f"{info.world} process(es) on {info.device}, precision {precision} ({why})")
    if start:
        how = "resumed" if resume else "continued"
        _log(info, quiet, progress, f"{how} from {state['path']} at step {start}")
    writer = MetricsWriter(out / "metrics.jsonl", out / "tensorboard" if cfg.tensorboard else None,
                           enabled=info.is_main, truncate_after=start if resume else -1)
    return _Run(task=task, cfg=cfg, info=info, out=out, model=model, ddp=ddp, optimizer=optimizer, scaler=scaler,
                precision=precision, why=why, record=record, start=start, phase_tasks=phase_tasks,
                progress=progress, writer=writer, quiet=quiet, context=cp, data_rank=info.rank // cp,
                data_world=info.world // cp)


def _given_task(task: Task, spec: RunSpec, seed: int) -> Task:
    """``task`` when it is the task ``spec`` describes (ValueError naming what differs otherwise)."""
    want = create_task(spec.task, data=spec.data, seed=seed, **spec.task_options)  # options only: reads no data
    if (task.name, task.data, task.seed, task.options) != (want.name, want.data, want.seed, want.options):
        raise ValueError(f"the task given to train() is not the run's: {task.describe()} vs {want.describe()}")
    return task


def _context_group(info: dist_utils.DistInfo, cp: int):
    """The process group of this rank's block of ``cp`` consecutive ranks (every rank creates every block's group).

    A group of its own, even when ``cp`` is the whole world: its point-to-point traffic
    then never interleaves with DDP's gradient all-reduce on the default group.
    """
    import torch.distributed as dist

    mine = None
    for d in range(info.world // cp):
        ranks = list(range(d * cp, (d + 1) * cp))
        group = dist.new_group(ranks)
        if info.rank in ranks:
            mine = group
    return mine


def _load_for_resume(out: Path, task: Task, info: dist_utils.DistInfo
                     ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """State, tensors and weights of the newest checkpoint of ``out`` that loads; one warning line per fallback."""
    state, tensors, weights, skipped = load_resumable(out)
    if skipped and info.is_main:  # a warning, not a log message: shown even when quiet
        print(f"attnlab train: warning: {'; '.join(skipped)}; resuming from {state['path']} at step {state['step']}",
              file=sys.stderr)
    _check_task(state, task, f"--resume found a checkpoint of task {state['run']['task']!r} in {str(out)!r}, "
                             f"not of {task.name!r}; pass another --out")
    return state, tensors, weights


def _check_task(state: dict[str, Any], task: Task, wrong: str) -> None:
    """A checkpoint's ``state`` is of ``task`` (else ValueError ``wrong``); its assets (a vocabulary) are loaded."""
    if state["run"]["task"] != task.name:
        raise ValueError(wrong)
    task.load_assets(Path(state["path"]))


def _load_to_continue(path: str | Path, task: Task
                      ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """State, tensors and weights of the checkpoint ``continue_from`` names (ValueError naming what does not fit)."""
    from ..models.io import WEIGHTS_NAME, load_safetensors
    from .checkpoint import load_checkpoint, resolve_checkpoint

    ckpt = resolve_checkpoint(path)
    state, tensors = load_checkpoint(ckpt)
    _check_task(state, task, f"continue_from {str(path)!r} is a checkpoint of task {state['run']['task']!r}, "
                             f"not of {task.name!r}")
    return state, tensors, load_safetensors(ckpt / WEIGHTS_NAME)


def _new_model(task: Task, spec: RunSpec, cfg: TrainConfig, state: dict[str, Any] | None) -> nn.Module:
    """A resumed run's model from its checkpoint's config (weights load in :func:`_restore`), else built and
    initialised, or built and given ``init_from``'s weights."""
    if state is not None:
        mcls, mconfig = read_config(state["path"])
        return mcls(mconfig)
    model = build_model(task, spec.model)
    if cfg.init_from is None:
        init_weights(model, cfg.init, cfg.embed_std)
    else:
        load_initial_weights(model, cfg.init_from)
    return model


def load_initial_weights(model: nn.Module, path: str | Path) -> list[str]:
    """Load the weights of the checkpoint (or run directory) at ``path`` into ``model``; returns the names it lacked.

    The names it lacks keep ``model``'s own initialisation (an attention mechanism's parameters
    that the trained model had no use for).

    Raises:
        ValueError: naming them, for weights of the checkpoint that ``model`` has no place for, or
            weights of another shape.
    """
    from ..models.io import WEIGHTS_NAME, load_safetensors
    from .checkpoint import resolve_checkpoint

    weights = load_safetensors(resolve_checkpoint(path) / WEIGHTS_NAME)
    own = model.state_dict()
    extra = sorted(set(weights) - set(own))
    if extra:
        raise ValueError(f"init_from {str(path)!r} holds weights this model has no place for: {extra[:5]}"
                         + (f" and {len(extra) - 5} more" if len(extra) > 5 else ""))
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in weights.items() if v.shape != own[k].shape]
    if wrong:
        raise ValueError(f"init_from {str(path)!r} has weights of other shapes than this model: {wrong[:3]}")
    missing = sorted(set(own) - set(weights))
    model.load_state_dict(weights, strict=False)
    return missing


def _optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW  # Adam: the decay is an L2 penalty
    return cls(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def _pick_precision(task: Task, model: nn.Module, cfg: TrainConfig, info: dist_utils.DistInfo,
                    state: dict[str, Any] | None) -> tuple[str, str]:
    """``(precision, why)`` of the run: a resumed ``auto`` run keeps its own; data-parallel CPU ranks agree on one."""

    def probe() -> tuple[bool, str]:  # times this run's real training step (see measure_cpu_bf16)
        b = {k: v.to(info.device) for k, v in task.train_batch(0, cfg.batch_size, info.rank, info.world).items()}
        with eval_mode(model):  # no dropout: the probe draws nothing from the RNG
            try:
                return measure_cpu_bf16(lambda: task.loss(model, b)[0])
            finally:
                model.zero_grad(set_to_none=True)

    if state is not None and cfg.precision == "auto" and "precision" in state:
        precision, why = state["precision"], "as the run being resumed"
    else:
        precision, why = resolve_precision(cfg.precision, info.device, probe)
    if info.distributed and cfg.precision == "auto" and info.device.type == "cpu":
        agreed = dist_utils.all_reduce_mean(1.0 if precision == "bf16" else 0.0, info) == 1.0
        if (precision == "bf16") != agreed:  # every rank must compute in the same precision
            precision, why = ("bf16" if agreed else "fp32"), why + " (ranks disagreed; all use fp32)"
    return precision, why


def _restore(state: dict[str, Any], tensors: dict[str, torch.Tensor], weights: dict[str, torch.Tensor],
             model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, precision: str,
             info: dist_utils.DistInfo) -> int:
    """Load a checkpoint's weights, optimizer, scaler and this rank's RNGs; returns its step."""
    own = set(model.state_dict())
    if own != set(weights):
        raise ValueError(f"the checkpoint at {state.get('path')!r} holds other weights than this model (only in the "
                         f"checkpoint: {sorted(set(weights) - own)[:3]}, only in the model: "
                         f"{sorted(own - set(weights))[:3]}); continue_from needs the same parameters")
    model.load_state_dict(weights, strict=True)
    optimizer.load_state_dict(unflatten_optimizer(tensors, state["optimizer"]))
    if "scaler" in state and precision == "fp16":
        scaler.load_state_dict(state["scaler"])
    restore_rank_rng(tensors, state["rng"], info)
    return int(state["step"])


# -- the loop -------------------------------------------------------------------------
@dataclass
class _Loop:
    """Where the loop stands."""

    step: int
    t0: float  # perf_counter at the start of this process's loop (time budget, elapsed)
    losses: dict[int, float] = field(default_factory=dict)  # {step: global mean loss} at each log step
    items: int = 0  # tokens (or examples) trained on by this process's steps, all ranks
    phases: dict[int, dict[str, Any]] = field(default_factory=dict)  # per phase: length, batch, steps, items, seconds
    last_ckpt: Path | None = None
    nonfinite: torch.Tensor | None = None  # a non-finite loss since the last read, kept on the device
    local: float = math.nan  # this rank's loss as last read back
    seconds: float = 0.0  # wall time of the loop, once it has ended
    best_loss: float = math.inf  # early stopping: the best validation loss so far (rank 0's)
    best_step: int | None = None  # ... the step it was reached at
    best_state: dict[str, torch.Tensor] | None = None  # ... and a copy of the weights then
    stale: int = 0  # ... evaluations since it last improved
    eval_phase: int = 0  # ... the curriculum phase those evaluations were in


def _loop(run: _Run, stop_at: int | None) -> _Loop:
    """Steps until ``cfg.steps``, ``stop_at`` or the time budget, logging, evaluating and saving on schedule."""
    cfg, info = run.cfg, run.info
    loop = _Loop(step=run.start, t0=time.perf_counter())
    run.model.train()
    sync_every = 1 if info.device.type == "cpu" else cfg.log_every  # reading a GPU value waits for the GPU
    while loop.step < cfg.steps:
        t_step = time.perf_counter()
        index = _enter_phase(run, loop)
        lr, items, read = _train_step(run, loop, sync_every)
        stats = loop.phases[index]
        stats["steps"] += 1
        stats["items"] += items
        stats["seconds"] += time.perf_counter() - t_step
        loop.items += items
        step = loop.step
        if step % cfg.log_every == 0 or step == cfg.steps:
            value = dist_utils.all_reduce_mean(loop.local, info)
            loop.losses[step] = value
            run.writer.write(step, "train", loss=value, lr=lr, elapsed=time.perf_counter() - loop.t0,
                             **mechanism_logs(run.model))
        run.progress.update(step - 1, loop.local, lr, items=items)
        if cfg.evaluates_at(step):
            # at the length this step trained: never at a length training has not reached yet
            m = _evaluate(run, "val", final=False, task=run.phase_tasks[index])
            if info.is_main:
                at = {"length": stats["length"]} if stats["length"] is not None else {}
                run.writer.write(step, "val", **m, **at, elapsed=time.perf_counter() - loop.t0)
                if cfg.eval_every >= cfg.log_every or step % cfg.log_every == 0:  # eval_every=1: every log_every
                    run.log(f"step {step}: val " + " ".join(f"{k} {v:.4f}" for k, v in m.items()))
            if cfg.early_stopping_patience and _no_longer_improving(run, loop, m, index):
                run.log(f"early stopping at step {step}: the val loss has not improved for "
                        f"{cfg.early_stopping_patience} evaluations (best {loop.best_loss:.4f} at step {loop.best_step})")
                break
        if cfg.saves_at(step):
            loop.last_ckpt = _checkpoint(run, step)
        if stop_at is not None and step >= stop_at:
            break
        # every rank must leave at the same step: they vote, at read steps only under DDP (a vote is a sync)
        if cfg.time_budget is not None and (read or not info.distributed):
            over = float(time.perf_counter() - loop.t0 > cfg.time_budget)
            if dist_utils.all_reduce_mean(over, info) > 0:
                run.log(f"time budget {format_duration(cfg.time_budget)} reached at step {step}")
                break
    loop.seconds = time.perf_counter() - loop.t0
    if loop.best_state is not None and loop.best_step != loop.step and (stop_at is None or loop.step < stop_at):
        run.model.load_state_dict(loop.best_state)
        run.log(f"restored the weights of step {loop.best_step} (val loss {loop.best_loss:.4f})")
    return loop


def _enter_phase(run: _Run, loop: _Loop) -> int:
    """The curriculum phase of the coming step; logs (and records in the metrics) a phase that starts here."""
    cfg = run.cfg
    index, phase = cfg.phase_at(loop.step)
    if index not in loop.phases:
        length = phase.length if phase is not None else None
        loop.phases[index] = {"length": length, "batch_size": cfg.batch_at(loop.step), "steps": 0, "items": 0,
                              "seconds": 0.0}
        if phase is not None:
            run.writer.write(loop.step, "phase", phase=index, length=phase.length, batch_size=cfg.batch_at(loop.step))
            run.log(f"phase {index + 1}/{len(cfg.curriculum)}: length {phase.length}, batch {cfg.batch_at(loop.step)}, "
                    f"from step {loop.step}")
    return index


def _no_longer_improving(run: _Run, loop: _Loop, metrics: dict[str, float], phase: int) -> bool:
    """Early stopping's bookkeeping after a validation evaluation: True when the patience has run out.

    Rank 0 holds the metrics and decides whether the loss improved; every rank copies its own
    weights then (under DDP they are equal), so each can restore them. A new curriculum phase
    starts the count afresh: its evaluations are at another length, so their losses compare
    only with each other.
    """
    info = run.info
    if phase != loop.eval_phase:
        loop.eval_phase, loop.best_loss, loop.stale = phase, math.inf, 0
    if info.is_main and "loss" not in metrics:
        raise ValueError(f"early stopping needs the task's evaluation to report a loss; {run.task.name} reports "
                         f"{sorted(metrics)}")
    better = float(info.is_main and metrics["loss"] < loop.best_loss)
    if dist_utils.all_reduce_mean(better, info) > 0:
        loop.best_loss = metrics.get("loss", math.nan)
        loop.best_step, loop.stale = loop.step, 0
        loop.best_state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    else:
        loop.stale += 1
    return loop.stale >= run.cfg.early_stopping_patience


def _train_step(run: _Run, loop: _Loop, sync_every: int) -> tuple[float, int, bool]:
    """One optimizer step at ``loop.step`` (advanced by one); returns ``(lr, items in the global batch, read)``.

    ``read``: whether this step read the loss back into ``loop.local`` (and checked that
    every loss since the last read was finite).
    """
    cfg, info, step = run.cfg, run.info, loop.step
    lr = lr_at(step, lr=cfg.lr, schedule=cfg.schedule, warmup=cfg.warmup, total=cfg.steps, min_lr=cfg.min_lr,
               decay=cfg.decay_steps)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    index, _ = cfg.phase_at(step)
    task = run.phase_tasks[index]
    host_batch = task.train_batch(step, cfg.batch_at(step), run.data_rank, run.data_world)
    items = task.items_per_batch(host_batch) * run.data_world  # counted before the copy: no device read
    batch = {k: v.to(info.device) for k, v in host_batch.items()}
    with autocast(run.precision, info.device):
        loss, attns = task.loss(run.ddp, batch, label_smoothing=cfg.label_smoothing, return_weights=run.penalty)
        total = loss
        if run.penalty:
            total = loss + cfg.attn_penalty_weight * attention_penalty(attns, cfg.attn_penalty)
        own = mechanism_loss(run.model)  # the mechanisms' penalties on their own parameters (adaptive spans)
        if own is not None:
            total = total + own
        if run.context > 1:
            # each context rank's backward gives its share of the gradient and DDP averages over all
            # world = data groups x context ranks, so the shares must be scaled to add up
            total = total * run.context
    bad = ~torch.isfinite(total.detach())
    loop.nonfinite = bad if loop.nonfinite is None else loop.nonfinite | bad
    read = (step + 1) % sync_every == 0 or step + 1 == cfg.steps
    if read:
        if bool(loop.nonfinite):
            raise FloatingPointError(_nonfinite_message(total, step, sync_every))
        loop.nonfinite = None
    run.optimizer.zero_grad(set_to_none=True)
    run.scaler.scale(total).backward()
    if cfg.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    loop.step += 1
    if read:
        loop.local = float(loss.detach())
    return lr, items, read


def _nonfinite_message(total: torch.Tensor, step: int, sync_every: int) -> str:
    if sync_every == 1:
        return f"loss became {float(total)} at step {step}; lower --lr or use fp32"
    return (f"loss became non-finite between steps {step - sync_every + 1} and {step} (a GPU run checks every "
            f"{sync_every} steps, --log-every); lower --lr or use fp32")


# -- evaluation, checkpoints, the end ---------------------------------------------------
def _evaluate(run: _Run, split: str, final: bool, task: Task | None = None) -> dict[str, float]:
    """Rank 0 evaluates ``split`` of ``task`` (default the run's, at the target length; every batch when
    ``final``) while the other ranks wait; their result is ``{}``."""
    cfg, info = run.cfg, run.info
    metrics: dict[str, float] = {}
    if info.is_main:
        with eval_mode(run.model), autocast(run.precision, info.device):
            metrics = (task or run.task).evaluate(run.model, split, batch_size=cfg.eval_batch_size,
                                        max_batches=None if final or not cfg.eval_batches else cfg.eval_batches,
                                        final=final)
    dist_utils.barrier(info)
    return metrics


def _checkpoint(run: _Run, at: int) -> Path | None:
    """Rank 0 saves the checkpoint of step ``at`` with every rank's RNGs; the path on rank 0, None elsewhere."""
    cfg, info = run.cfg, run.info
    rng_t, rng_j = capture_rank_rng(info)  # a collective: every rank takes part
    path = None
    if info.is_main:
        st = {"run": run.record, "schedule": {"lr": cfg.lr, "min_lr": cfg.min_lr, "schedule": cfg.schedule,
                                              "warmup": cfg.warmup, "total": cfg.steps,
                                              "decay": cfg.decay_steps},
              "data_position": run.task.data_position(at, cfg.batch_size), "precision": run.precision,
              "world_size": info.world}
        if run.precision == "fp16":
            st["scaler"] = run.scaler.state_dict()
        path = save_checkpoint(run.out, at, run.model, run.optimizer, st, rng=(rng_t, rng_j),
                               assets=run.task.save_assets, keep=cfg.keep_checkpoints)
    dist_utils.barrier(info)
    return path


def _final_splits(task: Task, cfg: TrainConfig) -> tuple[str, ...]:
    """The splits of the final evaluation: ``cfg.final_splits`` (each checked against the task's), else the task's."""
    have = tuple(task.eval_splits)
    want = cfg.final_splits
    if want is None:
        return have
    bad = [s for s in want if s not in have]
    if bad:
        raise ValueError(f"final_splits must be among the splits task {task.name!r} evaluates {list(have)}, "
                         f"got {bad}")
    return want


def _finish(run: _Run, loop: _Loop, *, final_eval: bool) -> TrainResult:
    """The last checkpoint (unless the loop just wrote it), the final evaluation and ``result.json``."""
    info, step = run.info, loop.step
    if loop.last_ckpt is None or not loop.last_ckpt.name.endswith(f"{step:08d}"):
        loop.last_ckpt = _checkpoint(run, step)
    metrics: dict[str, dict[str, float]] = {}
    if final_eval:
        for split in _final_splits(run.task, run.cfg):
            m = _evaluate(run, split, final=split == "test")
            if info.is_main:
                metrics[split] = m
                run.writer.write(step, split, **m, elapsed=loop.seconds, final=True)
                run.log(f"final {split}: " + " ".join(f"{k} {v:.4f}" for k, v in m.items()))
    if info.is_main:
        summary = {"step": step, "seconds": round(loop.seconds, 2), "precision": run.precision, "metrics": metrics,
                   "checkpoint": str(loop.last_ckpt) if loop.last_ckpt else None, "best_step": loop.best_step}
        (run.out / "result.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        run.log(f"done: {step} steps in {format_duration(loop.seconds)}, checkpoint {loop.last_ckpt}")
    run.writer.close()
    return TrainResult(step=step, losses=loop.losses, metrics=metrics,
                       checkpoint=loop.last_ckpt if info.is_main else None, out=run.out, seconds=loop.seconds,
                       precision=f"{run.precision} ({run.why})", model=run.model, items=loop.items,
                       phases=[loop.phases[i] for i in sorted(loop.phases)], best_step=loop.best_step)
