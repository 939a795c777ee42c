"""Training: the loop, schedules, checkpoints, data parallelism, metrics and progress.

* :func:`train` runs a :class:`RunSpec` (a task from :mod:`attnlab.tasks`, model
  overrides, :class:`TrainConfig` settings) into a run directory and returns a
  :class:`TrainResult`; ``resume=True`` continues a killed run exactly. The loop is in
  :mod:`~attnlab.train.trainer`, the settings in :mod:`~attnlab.train.config`.
* :func:`resolve_precision` - what ``--precision auto`` becomes (:mod:`~attnlab.train.precision`).
* :func:`load_run` rebuilds the task and model of a checkpoint for generation,
  translation and evaluation.
* :mod:`~attnlab.train.checkpoint` - atomic safetensors + JSON checkpoints (no pickle).
* :mod:`~attnlab.train.distributed` - ``torchrun`` / DistributedDataParallel.
* :func:`lr_at` - warm-up + cosine / inverse-square-root schedules.
* :func:`train_seeds` - one run spec over several seeds, with the mean and std of its metrics.
"""

from .checkpoint import latest_checkpoint, load_checkpoint, resolve_checkpoint, save_checkpoint
from .config import Phase, RunSpec, TrainConfig, TrainResult, parse_curriculum, parse_duration
from .metrics import MetricsWriter, read_metrics
from .precision import measure_cpu_bf16, resolve_precision
from .progress import Progress
from .schedule import SCHEDULES, lr_at
from .seeds import SeedsResult, train_seeds
from .trainer import build_model, load_run, train

__all__ = [
    "MetricsWriter",
    "Phase",
    "Progress",
    "RunSpec",
    "SCHEDULES",
    "SeedsResult",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "latest_checkpoint",
    "load_checkpoint",
    "load_run",
    "lr_at",
    "measure_cpu_bf16",
    "parse_curriculum",
    "parse_duration",
    "read_metrics",
    "resolve_checkpoint",
    "resolve_precision",
    "save_checkpoint",
    "train",
    "train_seeds",
]
