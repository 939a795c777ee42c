"""The training loop: AdamW, warm-up schedules, clipping, mixed precision, checkpoints, resume.

One function, :func:`train`, runs a :class:`RunSpec` (task, model overrides, trainer
settings) and returns a :class:`TrainResult`. Each step it sets the learning rate from
the schedule (:mod:`~attnlab.train.schedule`), draws the batch of that step from the
task (a pure function of seed and step), computes the loss under autocast (plus an
optional attention-entropy or L2 penalty), backpropagates (through a gradient scaler
for fp16), clips the global gradient norm and steps AdamW (Loshchilov and Hutter, 2019;
weight decay on matrices only). Every ``eval_every`` steps it evaluates on the
validation split; every ``save_every`` steps and at the end it writes an atomic
checkpoint (:mod:`~attnlab.train.checkpoint`). ``resume=True`` continues from the run
directory's latest checkpoint so that the continuation equals the uninterrupted run:
model, optimizer moments, grad-scaler state, every RNG and the step (hence the data
position and learning rate) are restored. A latest checkpoint whose files no longer
read (truncated, emptied) is skipped with one warning line on stderr, and the run
continues from the newest one that loads: at most one save interval is redone.

Under ``torchrun`` the model is wrapped in DistributedDataParallel and each rank takes
its slice of every global batch (:mod:`~attnlab.train.distributed`).

Mixed precision: ``fp16`` (CUDA, with loss scaling, Micikevicius et al., 2018),
``bf16`` (autocast), ``fp32``, or ``auto``: on CUDA bf16 where the GPU computes it
natively (compute capability 8.0 or newer) else fp16; on
the CPU bf16 only if a measured bf16 matrix product (forward and backward) beats fp32
on this machine, since CPUs without native bf16 run it several times slower.

Each rank saves and restores its own RNG states (torch CPU and its CUDA device,
Python, NumPy), so dropout continues on every rank as if uninterrupted.

On a GPU the loop reads the loss back (a host-device sync) only every ``log_every``
steps: the non-finite-loss check accumulates on the device in between. On the CPU,
where reading costs nothing, it checks every step.

Cost per step: one forward and backward of the model on ``B`` examples, plus an
O(parameters) optimizer update (and all-reduce under DDP).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.blocks import eval_mode
from ..tasks import Task, create_task
from . import distributed as dist_utils
from .checkpoint import (
    capture_rng,
    load_checkpoint,
    load_resumable,
    restore_rng,
    save_checkpoint,
    unflatten_optimizer,
)
from .metrics import MetricsWriter
from .progress import Progress, format_duration
from .schedule import SCHEDULES, lr_at

__all__ = ["TrainConfig", "RunSpec", "TrainResult", "train", "resolve_precision", "build_model", "load_run",
           "xavier_init", "gpt2_init", "parse_duration"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
#: accepted ``TrainConfig.init`` values
INITS = ("default", "xavier", "gpt2")


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


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Trainer settings (each task overrides some defaults; see ``Task.train_defaults``).

    Attributes:
        steps: optimizer steps (also the length of the cosine schedule).
        time_budget: stop after this many seconds of training (None: no limit).
        batch_size: global batch (divided among data-parallel ranks).
        lr, min_lr, schedule, warmup: see :func:`attnlab.train.schedule.lr_at`.
        weight_decay, beta1, beta2, eps: AdamW (decay on parameters with >= 2 dims).
        grad_clip: clip the global gradient norm to this (0 disables).
        label_smoothing: epsilon of label smoothing in the cross-entropy.
        init: ``default`` (the models' own), ``xavier`` (Glorot uniform on linear weights) or
            ``gpt2`` (:func:`gpt2_init`).
        embed_std: re-initialize the token embeddings ``N(0, embed_std)`` (0 keeps the model's
            own init). The models' default linear init writes O(1) into the residual stream,
            so GPT-2's 0.02-scale embeddings are drowned after one layer; the model-level fix
            is the configs' ``scale_embeddings`` (which translation, ListOps and sentiment
            use); the synthetic tasks set ``embed_std=1`` instead (see ``tasks.synthetic``).
        attn_penalty, attn_penalty_weight: ``none``, ``entropy`` or ``l2`` on attention
            weights, added to the loss times the weight.
        precision: one of ``auto``, ``fp32``, ``bf16``, ``fp16``.
        device: ``auto``, ``cpu``, ``cuda``.
        dist_timeout: seconds a data-parallel rank waits in a collective (None: 2 h or
            ``ATTNLAB_DIST_TIMEOUT``); rank 0's final evaluation holds the others at a barrier.
        eval_every: evaluate on the validation split every N steps (0: only at the end).
        eval_batches: batches per evaluation during training (0: the whole split).
        eval_batch_size: batch size of evaluation.
        save_every: checkpoint every N steps (0: only at the end).
        keep_checkpoints: newest checkpoints kept on disk (0 keeps all).
        log_every: write a train record to ``metrics.jsonl`` every N steps.
        seed: seeds model init, dropout and the data.
        threads: ``torch.set_num_threads`` (0 leaves torch's default).
        tensorboard: also write TensorBoard events to ``OUT/tensorboard``.
        progress: show the progress line.
        final_eval: evaluate val and test (with the slow metrics, e.g. beam BLEU) at the end.
    """

    steps: int = 1000
    time_budget: float | None = None
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 0.0
    schedule: str = "cosine"
    warmup: int = 100
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
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
    eval_batches: int = 20
    eval_batch_size: int = 64
    save_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    threads: int = 0
    tensorboard: bool = False
    progress: bool = True
    final_eval: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("warmup", "eval_every", "eval_batches", "save_every", "keep_checkpoints", "threads", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        for name in ("log_every", "eval_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not self.lr > 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr} min_lr={self.min_lr}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1) or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0, got beta1={self.beta1} "
                             f"beta2={self.beta2} eps={self.eps} weight_decay={self.weight_decay}")
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """From :meth:`to_dict` output; unknown keys raise ValueError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown train settings {unknown}; known settings are {sorted(known)}")
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
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown run config keys {unknown}; known keys are {sorted(known)}")
        return cls(**data)


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
    """

    step: int
    losses: dict[int, float]
    metrics: dict[str, dict[str, float]]
    checkpoint: Path | None
    out: Path
    seconds: float
    precision: str
    model: nn.Module | None = None


# -- precision ------------------------------------------------------------------------
def measure_cpu_bf16(step: Callable[[], torch.Tensor], repeats: int = 3) -> tuple[bool, str]:
    """Time ``step()`` (a forward returning a loss; backward is run here) in fp32 and in bf16 autocast.

    Returns ``(bf16 is at least 10% faster, a sentence with the measurement)``. Tiny
    models often lose in bf16 even on CPUs with native bf16 (casts cost more than the
    products save), so the real training step is measured rather than a large product.
    """

    def run(bf16: bool) -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = step()
            loss.backward()
            best = min(best, time.perf_counter() - t0)
        return best

    run(False), run(True)  # warm up both paths
    t32, t16 = run(False), run(True)
    cap = torch.backends.cpu.get_cpu_capability()
    faster = t16 < 0.9 * t32
    why = (f"measured a training step: fp32 {t32 * 1e3:.1f} ms, bf16 autocast {t16 * 1e3:.1f} ms "
           f"on this CPU (capability {cap})")
    return faster, why


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether the CUDA ``device`` computes bf16 natively, and the sentence saying so.

    ``torch.cuda.is_bf16_supported()`` also counts emulation: a pre-Ampere GPU runs bf16
    through float32 several times slower than fp16, so ``auto`` asks for native support
    (compute capability 8.0 or newer).
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    try:
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.5 counts no emulation and takes no argument
        supported = torch.cuda.is_bf16_supported()
    if supported and (major, minor) >= (8, 0):
        return True, f"cuda:{index} (compute capability {major}.{minor}) computes bf16 natively"
    return False, (f"cuda:{index} (compute capability {major}.{minor}) has no native bf16 (it would be emulated); "
                   "fp16 with loss scaling")


def resolve_precision(requested: str, device: torch.device,
                      probe: Callable[[], tuple[bool, str]] | None = None) -> tuple[str, str]:
    """``(precision, reason)``: what ``auto`` becomes on ``device``, and why.

    Args:
        requested: one of ``auto``, ``fp32``, ``bf16``, ``fp16``.
        device: the training device.
        probe: on the CPU, ``auto`` calls it (e.g. :func:`measure_cpu_bf16` on the real
            step) and takes bf16 only if it says bf16 is faster; without one, fp32.

    Raises:
        ValueError: for fp16 on the CPU (no loss-scaled fp16 training there).
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {requested!r}")
    if device.type == "cuda":
        if requested == "auto":
            native, why = native_bf16(device)
            return ("bf16", why) if native else ("fp16", why)
        return requested, "requested"
    if requested == "fp16":
        raise ValueError("precision fp16 needs CUDA (loss-scaled fp16 training); use bf16 or fp32 on the CPU")
    if requested != "auto":
        return requested, "requested"
    if probe is None:
        return "fp32", "no measurement of bf16 on this CPU"
    faster, why = probe()
    return ("bf16", why + " -> bf16") if faster else ("fp32", why + " -> fp32")


def _autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


# -- model ----------------------------------------------------------------------------
def xavier_init(model: nn.Module) -> None:
    """Glorot-uniform weights and zero biases for every ``nn.Linear`` (Glorot and Bengio, 2010)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def gpt2_init(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialization (Radford et al., 2019): every linear and embedding weight
    ``N(0, std)``, biases zero, and the projections that write into the residual stream
    (attention ``out_proj``, feed-forward ``fc2``) scaled by ``1/sqrt(2 * layers)``.

    It keeps the embeddings on the scale of what each layer adds to the residual stream;
    with PyTorch's default linear init (about 4x larger at width 64) the token identity is
    drowned after the first layer, which stalls content-based tasks such as associative recall.
    """
    layers = sum(1 for name, _ in model.named_modules() if name.endswith("out_proj")) or 1
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            scale = 1.0 / math.sqrt(2 * layers) if name.endswith(("out_proj", "fc2")) else 1.0
            nn.init.normal_(m.weight, std=std * scale)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def build_model(task: Task, overrides: dict[str, Any]) -> nn.Module:
    """The task's model: its defaults, the data-dependent fields, then ``overrides``."""
    from ..models import model_types

    cls = model_types()[task.model_type]
    fields_ = {**task.model_defaults, **task.model_config(), **overrides}
    return cls(cls.config_class.from_dict(fields_))


def _optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def _resolve_train(task: Task, spec: RunSpec) -> TrainConfig:
    merged = {**type(task).train_defaults, **spec.train}
    if "time_budget" in merged:
        merged["time_budget"] = parse_duration(merged["time_budget"])
    if "dist_timeout" in merged:
        merged["dist_timeout"] = parse_duration(merged["dist_timeout"])
    return TrainConfig.from_dict(merged)


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


def _load_for_resume(out: Path, task: Task, info: dist_utils.DistInfo
                     ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """State, tensors and weights of the newest checkpoint of ``out`` that loads; one warning line per fallback."""
    state, tensors, weights, skipped = load_resumable(out)
    if skipped and info.is_main:  # a warning, not a log message: shown even when quiet
        print(f"attnlab train: warning: {'; '.join(skipped)}; resuming from {state['path']} at step {state['step']}",
              file=sys.stderr)
    if state["run"]["task"] != task.name:
        raise ValueError(f"--resume found a checkpoint of task {state['run']['task']!r} in {str(out)!r}, "
                         f"not of {task.name!r}; pass another --out")
    task.load_assets(Path(state["path"]))
    return state, tensors, weights


def _nonfinite_message(total: torch.Tensor, step: int, sync_every: int) -> str:
    if sync_every == 1:
        return f"loss became {float(total)} at step {step}; lower --lr or use fp32"
    return (f"loss became non-finite between steps {step - sync_every + 1} and {step} (a GPU run checks every "
            f"{sync_every} steps, --log-every); lower --lr or use fp32")


# -- per-rank RNG ----------------------------------------------------------------------
def capture_rank_rng(info: dist_utils.DistInfo) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every rank's RNG states, gathered on every rank (rank 0 writes them).

    Tensors: ``rng.torch.<rank>`` (CPU) and ``rng.rank.<rank>.cuda`` (the rank's own CUDA
    device; ``rng.cuda.<i>`` from :func:`capture_rng` is rank 0's view of every device).
    JSON: rank 0's Python and NumPy states, and every rank's under ``ranks``.
    """
    rng_t, rng_j = capture_rng()
    per_rank = dist_utils.gather_tensors(rng_t["rng.torch.0"], info)
    rng_t.update({f"rng.torch.{r}": s for r, s in enumerate(per_rank)})
    if info.device.type == "cuda":
        own = torch.cuda.get_rng_state(info.device)
        rng_t.update({f"rng.rank.{r}.cuda": s for r, s in enumerate(dist_utils.gather_tensors(own, info))})
    if info.distributed:
        rng_j = {**rng_j, "ranks": dist_utils.gather_objects({"python": rng_j["python"], "numpy": rng_j["numpy"]}, info)}
    return rng_t, rng_j


def restore_rank_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any], info: dist_utils.DistInfo) -> None:
    """Set this rank's RNGs from :func:`capture_rank_rng` output (rank 0's where this rank has none)."""
    ranks = meta.get("ranks") or []
    restore_rng(tensors, ranks[info.rank] if info.rank < len(ranks) else meta, info.rank)
    own = tensors.get(f"rng.rank.{info.rank}.cuda")
    if own is not None and info.device.type == "cuda":
        torch.cuda.set_rng_state(own.to("cpu", torch.uint8), info.device)


# -- the loop -------------------------------------------------------------------------
def train(spec: RunSpec, out: str | Path, *, resume: bool = False, stop_at: int | None = None,
          quiet: bool = False) -> TrainResult:
    """Train ``spec`` into the run directory ``out``.

    Args:
        spec: task, data, options, model overrides and trainer settings.
        out: run directory (``run.json``, ``metrics.jsonl``, ``checkpoints/``, ``latest``).
        resume: continue from ``out``'s latest checkpoint (ValueError if there is none).
        stop_at: stop (with a checkpoint, without final evaluation) once this many
            steps are done - what a run killed right after that checkpoint leaves.
        quiet: no progress line or log messages.

    Returns:
        A :class:`TrainResult`.
    """
    out = Path(out)
    info = dist_utils.setup(spec.train.get("device", "auto"), parse_duration(spec.train.get("dist_timeout")))
    try:
        return _train(spec, out, info, resume=resume, stop_at=stop_at, quiet=quiet)
    finally:
        dist_utils.cleanup(info)


def _train(spec: RunSpec, out: Path, info: dist_utils.DistInfo, *, resume: bool, stop_at: int | None, quiet: bool) -> TrainResult:
    seed = int(spec.train.get("seed", 0))
    task = create_task(spec.task, data=spec.data, seed=seed, **spec.task_options)
    cfg = _resolve_train(task, spec)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.batch_size % info.world:
        raise ValueError(f"batch_size must be divisible by the {info.world} processes, got {cfg.batch_size}")
    state: dict[str, Any] | None = None
    tensors: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    if resume:
        state, tensors, weights = _load_for_resume(out, task, info)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    task.ensure_setup()
    if state is not None:
        from ..models.io import read_config

        mcls, mconfig = read_config(state["path"])
        model = mcls(mconfig)
    else:
        model = build_model(task, spec.model)
        if cfg.init == "xavier":
            xavier_init(model)
        elif cfg.init == "gpt2":
            gpt2_init(model)
        if cfg.embed_std > 0:
            for m in model.modules():
                if isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, std=cfg.embed_std)
    model.to(info.device)
    optimizer = _optimizer(model, cfg)
    def probe() -> tuple[bool, str]:
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
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    start = 0
    if state is not None:
        model.load_state_dict(weights, strict=True)
        optimizer.load_state_dict(unflatten_optimizer(tensors, state["optimizer"]))
        if "scaler" in state and precision == "fp16":
            scaler.load_state_dict(state["scaler"])
        restore_rank_rng(tensors, state["rng"], info)
        start = int(state["step"])
    run_record = {"task": task.name, "data": task.data, "seed": seed, "task_options": task.options,
                  "model": model.config.to_dict(), "model_type": type(model).__name__, "train": cfg.to_dict(),
                  "world_size": info.world}
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps(run_record, indent=2, sort_keys=True))
    ddp = model
    if info.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    show = cfg.progress and not quiet and info.is_main
    progress = Progress(cfg.steps, start, enabled=show, every=max(cfg.log_every, 1), unit=task.item_unit,
                        time_budget=cfg.time_budget)

    def log(text: str) -> None:
        if info.is_main and not quiet:
            progress.message(text)

    n_params = sum(p.numel() for p in model.parameters())
    log(f"attnlab train {task.name}: {type(model).__name__} {n_params:,} parameters, "
        f"{info.world} process(es) on {info.device}, precision {precision} ({why})")
    if start:
        log(f"resumed from {state['path']} at step {start}")
    writer = MetricsWriter(out / "metrics.jsonl", out / "tensorboard" if cfg.tensorboard else None,
                           enabled=info.is_main, truncate_after=start if resume else -1)
    penalty = cfg.attn_penalty != "none" and cfg.attn_penalty_weight != 0.0
    losses: dict[int, float] = {}
    last_ckpt: Path | None = None
    t0 = time.perf_counter()
    step = start

    def checkpoint(at: int) -> Path | None:
        rng_t, rng_j = capture_rank_rng(info)
        path = None
        if info.is_main:
            st = {"run": run_record, "schedule": {"lr": cfg.lr, "min_lr": cfg.min_lr, "schedule": cfg.schedule,
                                                  "warmup": cfg.warmup, "total": cfg.steps},
                  "data_position": task.data_position(at, cfg.batch_size), "precision": precision,
                  "world_size": info.world}
            if precision == "fp16":
                st["scaler"] = scaler.state_dict()
            path = save_checkpoint(out, at, model, optimizer, st, rng=(rng_t, rng_j), assets=task.save_assets,
                                   keep=cfg.keep_checkpoints)
        dist_utils.barrier(info)
        return path

    def evaluate(split: str, final: bool) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if info.is_main:
            with eval_mode(model), _autocast(precision, info.device):
                metrics = task.evaluate(model, split, batch_size=cfg.eval_batch_size,
                                        max_batches=None if final or not cfg.eval_batches else cfg.eval_batches,
                                        final=final)
        dist_utils.barrier(info)
        return metrics

    model.train()
    sync_every = 1 if info.device.type == "cpu" else cfg.log_every  # reading a GPU value waits for the GPU
    nonfinite: torch.Tensor | None = None  # a non-finite loss since the last read, kept on the device
    local = float("nan")
    while step < cfg.steps:
        lr = lr_at(step, lr=cfg.lr, schedule=cfg.schedule, warmup=cfg.warmup, total=cfg.steps, min_lr=cfg.min_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        host_batch = task.train_batch(step, cfg.batch_size, info.rank, info.world)
        items = task.items_per_batch(host_batch) * info.world  # counted before the copy: no device read
        batch = {k: v.to(info.device) for k, v in host_batch.items()}
        with _autocast(precision, info.device):
            loss, attns = task.loss(ddp, batch, label_smoothing=cfg.label_smoothing, output_attentions=penalty)
            total = loss
            if penalty:
                from ..tasks.base import attention_penalty

                total = loss + cfg.attn_penalty_weight * attention_penalty(attns, cfg.attn_penalty)
        bad = ~torch.isfinite(total.detach())
        nonfinite = bad if nonfinite is None else nonfinite | bad
        read = (step + 1) % sync_every == 0 or step + 1 == cfg.steps
        if read:
            if bool(nonfinite):
                raise FloatingPointError(_nonfinite_message(total, step, sync_every))
            nonfinite = None
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(total).backward()
        if cfg.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        step += 1
        if read:
            local = float(loss.detach())
        if step % cfg.log_every == 0 or step == cfg.steps:
            value = dist_utils.all_reduce_mean(local, info)
            losses[step] = value
            writer.write(step, "train", loss=value, lr=lr, elapsed=time.perf_counter() - t0)
        progress.update(step - 1, local, lr, items=items)
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            m = evaluate("val", final=False)
            if info.is_main:
                writer.write(step, "val", **m, elapsed=time.perf_counter() - t0)
                log(f"step {step}: val " + " ".join(f"{k} {v:.4f}" for k, v in m.items()))
        if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
            last_ckpt = checkpoint(step)
        if stop_at is not None and step >= stop_at:
            break
        if cfg.time_budget is not None and (read or not info.distributed):
            over = float(time.perf_counter() - t0 > cfg.time_budget)
            if dist_utils.all_reduce_mean(over, info) > 0:
                log(f"time budget {format_duration(cfg.time_budget)} reached at step {step}")
                break
    seconds = time.perf_counter() - t0
    if last_ckpt is None or not last_ckpt.name.endswith(f"{step:08d}"):
        last_ckpt = checkpoint(step)
    metrics: dict[str, dict[str, float]] = {}
    if cfg.final_eval and stop_at is None:
        for split in task.eval_splits:
            m = evaluate(split, final=split == "test")
            if info.is_main:
                metrics[split] = m
                writer.write(step, split, **m, elapsed=seconds, final=True)
                log(f"final {split}: " + " ".join(f"{k} {v:.4f}" for k, v in m.items()))
    if info.is_main:
        summary = {"step": step, "seconds": round(seconds, 2), "precision": precision, "metrics": metrics,
                   "checkpoint": str(last_ckpt) if last_ckpt else None}
        (out / "result.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        log(f"done: {step} steps in {format_duration(seconds)}, checkpoint {last_ckpt}")
    writer.close()
    return TrainResult(step=step, losses=losses, metrics=metrics, checkpoint=last_ckpt if info.is_main else None,
                       out=out, seconds=seconds, precision=f"{precision} ({why})", model=model)


