"""A training run's configuration: settings, what to train, and what comes back.

:class:`TrainConfig` holds the trainer settings, :class:`RunSpec` what to train and
:class:`TrainResult` what :func:`~attnlab.train.trainer.train` returns.

A :class:`RunSpec` names a task and overrides of the task's model and trainer defaults;
:func:`resolve_train_config` merges those overrides into the task's
``train_defaults`` and validates them as a :class:`TrainConfig`. Both configs
round-trip through JSON (``run.json``, ``--config`` files, checkpoints).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from ..models.init import INIT_SCHEMES
from ..utils import int_at_least, positive_int
from .precision import PRECISIONS
from .schedule import SCHEDULES

if TYPE_CHECKING:
    from ..tasks import Task

__all__ = ["INITS", "OPTIMIZERS", "PRECISIONS", "Phase", "TrainConfig", "RunSpec", "TrainResult", "parse_curriculum",
           "parse_duration", "resolve_train_config"]

#: accepted ``TrainConfig.init`` values (the schemes of :func:`attnlab.models.init.init_weights`)
INITS = tuple(INIT_SCHEMES)
#: accepted ``TrainConfig.optimizer`` values
OPTIMIZERS = ("adamw", "adam")


def parse_duration(text: str | float | int | None) -> float | None:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"1h30m"``; None passes through."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    s, total, num = text.strip().lower(), 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    try:
        for ch in s:
            if ch.isdigit() or ch == ".":
                num += ch
            elif ch in units and num:
                total += float(num) * units[ch]
                num = ""
            else:
                raise ValueError
        if num:
            total += float(num)
    except ValueError:
        raise ValueError(f"time budget must look like 300, 90s, 15m or 1h30m, got {text!r}") from None
    if total <= 0:
        raise ValueError(f"time budget must be positive, got {text!r}")
    return total


@dataclass(frozen=True)
class Phase:
    """One phase of a length curriculum: ``steps`` optimizer steps at sequence length ``length``.

    ``batch_size`` None keeps the run's :attr:`TrainConfig.batch_size`.
    """

    length: int
    steps: int
    batch_size: int | None = None

    def to_list(self) -> list[int | None]:
        """``[length, steps, batch_size]`` (JSON)."""
        return [self.length, self.steps, self.batch_size]


_CURRICULUM_SYNTAX = "LENGTH:STEPS[:BATCH] phases separated by commas, like 64:200,512:100:16"


def _phase(item: Any) -> Phase:
    """One phase from ``"LENGTH:STEPS[:BATCH]"``, ``[length, steps(, batch)]`` or a :class:`Phase` (ValueError else)."""
    if isinstance(item, Phase):
        return item
    if isinstance(item, str):
        parts: list = item.split(":")
    elif isinstance(item, (list, tuple)):
        parts = list(item)
    else:
        raise ValueError
    if not 2 <= len(parts) <= 3 or any(isinstance(p, (bool, float)) for p in parts):
        raise ValueError
    if len(parts) == 3 and parts[2] is None:
        parts = parts[:2]
    return Phase(*(int(p) for p in parts))


def parse_curriculum(value: str | list | tuple | None) -> tuple[Phase, ...] | None:
    """A length curriculum from ``"64:200,512:100:16"`` (or a list of ``[length, steps, batch]``), validated.

    Raises:
        ValueError: naming the syntax, when a phase does not parse, a length, step count or batch
            is not positive, or the lengths do not increase from phase to phase.
    """
    if value is None:
        return None
    items = [x for x in value.replace(" ", "").split(",") if x] if isinstance(value, str) else list(value)
    try:
        phases = tuple(_phase(x) for x in items)
    except ValueError:
        raise ValueError(f"curriculum must be {_CURRICULUM_SYNTAX}, got {value!r}") from None
    if not phases:
        raise ValueError(f"curriculum must be {_CURRICULUM_SYNTAX}, got {value!r}")
    for p in phases:
        if p.length < 1 or p.steps < 1 or (p.batch_size is not None and p.batch_size < 1):
            raise ValueError(f"curriculum lengths, steps and batch sizes must be positive, got phase "
                             f"{p.length}:{p.steps}" + (f":{p.batch_size}" if p.batch_size is not None else ""))
    lengths = [p.length for p in phases]
    if any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"curriculum lengths must increase from phase to phase, got {lengths}")
    return phases


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Trainer settings (each task overrides some defaults; see ``Task.train_defaults``).

    Attributes:
        steps: optimizer steps (also the length of the cosine schedule).
        time_budget: stop after this many seconds of training (None: no limit).
        batch_size: global batch (divided among data-parallel ranks).
        lr, min_lr, schedule, warmup: see :func:`attnlab.train.schedule.lr_at`.
        decay_steps: ``wsd``: the last steps over which the rate falls to ``min_lr`` (its ``decay``);
            must be 0 with another schedule.
        weight_decay, beta1, beta2, eps: the optimizer's (decay on parameters with >= 2 dims).
        optimizer: ``adamw`` (decoupled weight decay, Loshchilov and Hutter 2019) or ``adam``
            (the decay is an L2 penalty added to the gradient, ``torch.optim.Adam``'s
            ``weight_decay``: what the GAT paper's 5e-4 means).
        grad_clip: clip the global gradient norm to this (0 disables).
        label_smoothing: epsilon of label smoothing in the cross-entropy.
        init, embed_std: the weight initialisation of a new run (a resumed one loads its
            weights): ``init`` is a scheme of :func:`attnlab.models.init.init_weights`
            (``default`` keeps the models' own, ``xavier``, ``gpt2``), and ``embed_std > 0``
            then redraws the embeddings ``N(0, embed_std)``. The synthetic tasks set
            ``embed_std=1`` (see ``tasks.synthetic``); translation, ListOps and sentiment use
            the model configs' ``scale_embeddings`` instead.
        attn_penalty, attn_penalty_weight: ``none``, ``entropy`` or ``l2`` on attention
            weights, added to the loss times the weight.
        precision: one of ``auto``, ``fp32``, ``bf16``, ``fp16``.
        device: ``auto``, ``cpu``, ``cuda``.
        dist_timeout: seconds a data-parallel rank waits in a collective (None: 2 h or
            ``ATTNLAB_DIST_TIMEOUT``); rank 0's final evaluation holds the others at a barrier.
        eval_every: evaluate on the validation split every N steps (0: only at the end). With a
            curriculum, an evaluation during training runs at the length of the phase that step
            trained (its record says ``length``), never at a length training has not reached.
        eval_steps: further steps to evaluate at (e.g. the end of each phase), besides every
            ``eval_every``-th; each in ``1 .. steps - 1`` (the last step has the final evaluation).
        early_stopping_patience: stop when the validation loss has not improved for this many
            evaluations and restore the weights of the best one before the final evaluation
            and checkpoint (0: off; needs ``eval_every`` > 0, else it never triggers). A resumed
            run starts counting afresh.
        eval_batches: batches per evaluation during training (0: the whole split).
        eval_batch_size: batch size of evaluation.
        save_every: checkpoint every N steps (0: only at the end).
        save_steps: further steps to checkpoint at (e.g. the end of a curriculum phase that another
            run continues from, see ``continue_from``), besides every ``save_every``-th.
        keep_checkpoints: newest checkpoints kept on disk (0 keeps all).
        log_every: write a train record to ``metrics.jsonl`` every N steps.
        curriculum: a length curriculum (:func:`parse_curriculum`): phases of ``steps`` at increasing
            sequence lengths, each with its own batch size; ``steps`` is then their total, and the
            learning-rate schedule, checkpoints and ``resume`` run over all phases. None: one length,
            the task's own.
        init_from: a checkpoint (or run directory) whose model weights start this run instead of a fresh
            initialisation: the swap-in of another attention into a trained model. Parameters the
            checkpoint lacks (a mechanism's own, e.g. Linformer's projections) keep the initialisation
            the mechanism gives them when it is created; a weight of another shape is an error.
        continue_from: a checkpoint (or run directory) of another run of the same task, seed and
            schedule that this run continues from: its step, weights, optimizer state and RNGs, with
            this run's own model (built from this spec; its parameters must be the checkpoint's).
            Where the two models compute the same function up to that step (a window that covers
            the short phases' lengths is exact attention there), the result is the run from scratch,
            without training those steps again.
        seed: seeds model init, dropout and the data.
        threads: ``torch.set_num_threads`` (0 leaves torch's default).
        context_parallel: ranks that share each sequence (sequence parallelism, see
            :mod:`attnlab.distributed`); the world is then a mesh of ``world / P`` data-parallel
            groups of ``P`` context ranks. 1: none.
        context_strategy: ``ring`` or ``ulysses`` (the attention of a sharded sequence).
        tensorboard: also write TensorBoard events to ``OUT/tensorboard``.
        progress: show the progress line.
        final_eval: evaluate val and test (with the slow metrics, e.g. beam BLEU) at the end.
        final_splits: the splits the final evaluation runs on (None: every split the task
            evaluates, e.g. ``("val", "test")``); each must be one of the task's.
    """

    steps: int = 1000
    time_budget: float | None = None
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 0.0
    schedule: str = "cosine"
    warmup: int = 100
    decay_steps: int = 0
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    optimizer: str = "adamw"
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    init: str = "default"
    embed_std: float = 0.0
    attn_penalty: str = "none"
    attn_penalty_weight: float = 0.0
    precision: str = "auto"
    device: str = "auto"
    dist_timeout: float | None = None
    eval_every: int = 0
    eval_steps: tuple[int, ...] | None = None
    early_stopping_patience: int = 0
    eval_batches: int = 20
    eval_batch_size: int = 64
    save_every: int = 0
    save_steps: tuple[int, ...] | None = None
    keep_checkpoints: int = 2
    log_every: int = 10
    curriculum: tuple[Phase, ...] | None = None
    init_from: str | None = None
    continue_from: str | None = None
    seed: int = 0
    threads: int = 0
    context_parallel: int = 1
    context_strategy: str = "ring"
    tensorboard: bool = False
    progress: bool = True
    final_eval: bool = True
    final_splits: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every", "eval_batch_size", "context_parallel"):
            positive_int(getattr(self, name), name)
        for name in ("warmup", "eval_every", "eval_batches", "save_every", "keep_checkpoints", "threads", "seed",
                     "early_stopping_patience"):
            int_at_least(getattr(self, name), name, 0)
        if not self.lr > 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr} min_lr={self.min_lr}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        int_at_least(self.decay_steps, "decay_steps", 0)
        if self.schedule == "wsd" and not 0 < self.decay_steps <= self.steps:
            raise ValueError(f"decay_steps must be in [1, steps={self.steps}] with schedule 'wsd', got {self.decay_steps}")
        if self.schedule != "wsd" and self.decay_steps:
            raise ValueError(f"decay_steps applies to schedule 'wsd' only, got {self.decay_steps} with {self.schedule!r}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1) or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0, got beta1={self.beta1} "
                             f"beta2={self.beta2} eps={self.eps} weight_decay={self.weight_decay}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.embed_std < 0:
            raise ValueError(f"embed_std must be >= 0 (0 keeps the model's init), got {self.embed_std}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {list(INITS)}, got {self.init!r}")
        if self.attn_penalty not in ("none", "entropy", "l2"):
            raise ValueError(f"attn_penalty must be 'none', 'entropy' or 'l2', got {self.attn_penalty!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be positive seconds, got {self.time_budget}")
        if self.dist_timeout is not None and not self.dist_timeout > 0:
            raise ValueError(f"dist_timeout must be positive seconds, got {self.dist_timeout}")
        if self.context_strategy not in ("ring", "ulysses"):
            raise ValueError(f"context_strategy must be 'ring' or 'ulysses', got {self.context_strategy!r}")
        object.__setattr__(self, "curriculum", parse_curriculum(self.curriculum))
        if self.curriculum is not None and sum(p.steps for p in self.curriculum) != self.steps:
            total = sum(p.steps for p in self.curriculum)
            raise ValueError(f"steps ({self.steps}) must equal the curriculum's total ({total}); leave steps out "
                             "and the curriculum sets it")
        object.__setattr__(self, "eval_steps", self._checked_steps("eval_steps", "the final evaluation"))
        object.__setattr__(self, "save_steps", self._checked_steps("save_steps", "the final checkpoint"))
        if self.init_from is not None and self.continue_from is not None:
            raise ValueError("pass init_from (weights only) or continue_from (weights, optimizer, step), not both")
        if self.final_splits is not None:
            if isinstance(self.final_splits, str) or not all(isinstance(x, str) for x in self.final_splits):
                raise ValueError(f"final_splits must be a list of split names (e.g. ['test']), got "
                                 f"{self.final_splits!r}")
            object.__setattr__(self, "final_splits", tuple(self.final_splits))

    def _checked_steps(self, name: str, last: str) -> tuple[int, ...] | None:
        value = getattr(self, name)
        if value is None:
            return None
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise ValueError(f"{name} must be a list of step numbers, got {value!r}")
        steps = tuple(sorted({int_at_least(s, name, 1) for s in value}))
        bad = [s for s in steps if s >= self.steps]
        if bad:
            raise ValueError(f"{name} must be below steps ({self.steps}; the last step has {last}), got {bad}")
        return steps

    def saves_at(self, step: int) -> bool:
        """Whether a checkpoint follows step ``step`` (1-based count of steps done) during training."""
        if step >= self.steps:
            return False
        return bool(self.save_every and step % self.save_every == 0) or step in (self.save_steps or ())

    def evaluates_at(self, step: int) -> bool:
        """Whether a validation evaluation follows step ``step`` (1-based count of steps done) during training."""
        if step >= self.steps:
            return False
        return bool(self.eval_every and step % self.eval_every == 0) or step in (self.eval_steps or ())

    def phase_at(self, step: int) -> tuple[int, Phase | None]:
        """``(index, phase)`` of the curriculum phase that step ``step`` (0-based) belongs to; ``(0, None)`` without one."""
        if self.curriculum is None:
            return 0, None
        end = 0
        for i, p in enumerate(self.curriculum):
            end += p.steps
            if step < end:
                return i, p
        return len(self.curriculum) - 1, self.curriculum[-1]

    def batch_at(self, step: int) -> int:
        """The batch size of step ``step``: its phase's, else :attr:`batch_size`."""
        _, p = self.phase_at(step)
        return self.batch_size if p is None or p.batch_size is None else p.batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the curriculum as ``[[length, steps, batch], ...]``)."""
        out = asdict(self)
        out["curriculum"] = None if self.curriculum is None else [p.to_list() for p in self.curriculum]
        for name in ("eval_steps", "save_steps", "final_splits"):
            out[name] = None if out[name] is None else list(out[name])
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """From :meth:`to_dict` output; unknown keys raise ValueError naming them."""
        return _from_known(cls, data, "train settings")


def _from_known(cls, data: dict[str, Any], what: str):
    """``cls(**data)`` for a dataclass ``cls``; keys it has no field for raise ValueError naming them."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known {what.split()[-1]} are {sorted(known)}")
    return cls(**data)


@dataclass
class RunSpec:
    """What to train: the task, its data and options, model overrides, trainer settings.

    Attributes:
        task: task name (``attnlab.tasks.tasks()``).
        data: data path for tasks that read files.
        task_options: the task's options (``--task-opt``).
        model: model config fields overriding the task's defaults (``--model``,
            ``--attention``, ``--positional``, ``--dropout``, ``--checkpointing``).
        train: trainer settings overriding the task's defaults.
    """

    task: str
    data: str | None = None
    task_options: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """From :meth:`to_dict` output (a ``--config`` file)."""
        return _from_known(cls, data, "run config keys")


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        step: steps completed.
        losses: per-step training loss of this process's steps, ``{step: loss}`` (global mean).
        metrics: final metrics by split (``val``, ``test``).
        checkpoint: the last checkpoint written (None on ranks other than 0).
        out: the run directory.
        seconds: wall time of this process's training loop.
        precision: the precision used and why.
        items: tokens (or examples, the task's unit) trained on by this process's steps, all ranks.
        phases: per curriculum phase (one without a curriculum): its length, batch size, steps
            done, items and seconds in this process.
        best_step: with early stopping, the step whose weights the model holds (the best
            validation loss); None otherwise.
    """

    step: int
    losses: dict[int, float]
    metrics: dict[str, dict[str, float]]
    checkpoint: Path | None
    out: Path
    seconds: float
    precision: str
    model: nn.Module | None = None
    items: int = 0
    phases: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None




def resolve_train_config(task: Task, spec: RunSpec) -> TrainConfig:
    """The task's ``train_defaults`` (an instance's own, where its options set them) overridden by
    ``spec.train`` (durations parsed), validated."""
    merged = {**task.train_defaults, **spec.train}
    if merged.get("curriculum") is not None and "steps" not in spec.train:
        merged["steps"] = sum(p.steps for p in parse_curriculum(merged["curriculum"]))
    if "time_budget" in merged:
        merged["time_budget"] = parse_duration(merged["time_budget"])
    if "dist_timeout" in merged:
        merged["dist_timeout"] = parse_duration(merged["dist_timeout"])
    return TrainConfig.from_dict(merged)
