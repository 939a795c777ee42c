"""Data-parallel training: one process per device, launched by ``torchrun``.

Under ``torchrun --nproc_per_node=K`` every process reads ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` from its environment, joins a process group (``gloo`` on the CPU,
``nccl`` on CUDA) and wraps the model in ``DistributedDataParallel``, which averages
gradients across processes after every backward. Each rank trains on its own slice of
the global batch, so K ranks with ``batch/K`` examples each take the same step as one
process with the whole batch (the mean of equal-sized per-rank means is the global mean).
Only rank 0 writes checkpoints, metrics and progress. Without ``torchrun`` (no
``WORLD_SIZE`` or ``WORLD_SIZE=1``) nothing is initialized and training runs in one
process.

``--device auto`` gives rank ``LOCAL_RANK`` CUDA device ``LOCAL_RANK`` only when this
machine has a GPU for each of its ``LOCAL_WORLD_SIZE`` ranks; otherwise every rank
trains on the CPU with gloo (two ranks on a one-GPU machine neither share ``cuda:0``
nor ask for a ``cuda:1`` that does not exist, and all ranks agree on one backend). The process group waits :data:`DEFAULT_TIMEOUT` (2 h) for a collective,
not NCCL's 10 minutes: the final evaluation (beam-search BLEU on a test split) runs on
rank 0 alone while the other ranks wait at a barrier. ``ATTNLAB_DIST_TIMEOUT`` (or the
``timeout`` argument, or ``--dist-timeout``) changes it.

Communication per step O(parameters) (the gradient all-reduce).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_TIMEOUT", "DistInfo", "setup", "cleanup", "all_reduce_mean", "barrier", "gather_tensors",
           "gather_objects", "broadcast_tensor", "resolve_timeout"]

#: how long a rank waits in a collective (rank 0's final evaluation holds the others at a barrier)
DEFAULT_TIMEOUT = datetime.timedelta(hours=2)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands.

    Attributes:
        rank: global rank (0 for a single process).
        world: number of processes.
        local_rank: rank on this machine (selects the CUDA device).
        device: the device this process trains on.
        backend: ``gloo``/``nccl``, or None for a single process.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """True on the process that writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group is running."""
        return self.backend is not None


def resolve_device(name: str, local_rank: int = 0, local_world: int = 1) -> torch.device:
    """The device of the rank with ``local_rank`` (of ``local_world`` on this machine) for ``--device name``.

    ``auto`` is ``cuda:LOCAL_RANK`` when CUDA is available with a device for every local
    rank, else the CPU for all of them (so all ranks agree on gloo); ``cuda`` is
    ``cuda:LOCAL_RANK`` and must exist.
    """
    if name == "auto":
        ranks = max(local_rank + 1, local_world)
        name = "cuda" if torch.cuda.is_available() and ranks <= torch.cuda.device_count() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device must be cpu when CUDA is not available, got {name!r}")
        dev = torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device {str(dev)!r} does not exist: this machine has {count} CUDA device(s) "
                             f"(LOCAL_RANK={local_rank}); start at most {count} processes per machine or use --device cpu")
        return dev
    if name != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {name!r}")
    return torch.device("cpu")


def resolve_timeout(timeout: float | datetime.timedelta | None = None) -> datetime.timedelta:
    """The collective timeout: ``timeout`` (seconds), else ``ATTNLAB_DIST_TIMEOUT`` (seconds), else 2 h."""
    if timeout is None:
        env = os.environ.get("ATTNLAB_DIST_TIMEOUT")
        if not env:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(env)
        except ValueError:
            raise ValueError(f"ATTNLAB_DIST_TIMEOUT must be seconds, got {env!r}") from None
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        raise ValueError(f"the process-group timeout must be positive, got {timeout}")
    return timeout


def setup(device: str = "auto", timeout: float | datetime.timedelta | None = None) -> DistInfo:
    """Join the process group when launched by ``torchrun``; otherwise a single-process info.

    Args:
        device: ``auto`` (CUDA when every local rank has a GPU, else CPU with gloo), ``cpu`` or
            ``cuda``; under torchrun each rank takes CUDA device ``LOCAL_RANK``.
        timeout: seconds (or a timedelta) a collective may wait; see :func:`resolve_timeout`.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if world > 1 else 1
    dev = resolve_device(device, local_rank, local_world)
    if world <= 1:
        return DistInfo(device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=resolve_timeout(timeout))
    return DistInfo(rank=rank, world=world, local_rank=local_rank, device=dev, backend=backend)


def cleanup(info: DistInfo) -> None:
    """Leave the process group (no-op for a single process)."""
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    """Wait for every rank."""
    if info.distributed:
        if info.backend == "nccl":
            dist.barrier(device_ids=[info.device.index])  # else NCCL guesses the device from the rank
        else:
            dist.barrier()


def all_reduce_mean(value: float, info: DistInfo) -> float:
    """The mean of a Python number over ranks (the number itself for one process)."""
    if not info.distributed:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / info.world


def gather_tensors(t: torch.Tensor, info: DistInfo) -> list[torch.Tensor]:
    """Every rank's copy of a same-shaped tensor, in rank order (on the CPU)."""
    if not info.distributed:
        return [t.cpu()]
    local = t.to(info.device)
    out = [torch.empty_like(local) for _ in range(info.world)]
    dist.all_gather(out, local)
    return [o.cpu() for o in out]


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's picklable ``obj`` (small JSON-like values), in rank order; sent between processes, never stored."""
    if not info.distributed:
        return [obj]
    out = [None] * info.world
    dist.all_gather_object(out, obj)
    return out


def broadcast_tensor(t: torch.Tensor, info: DistInfo, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s tensor on every rank (same shape and dtype everywhere)."""
    if not info.distributed:
        return t
    local = t.to(info.device).clone()
    dist.broadcast(local, src=src)
    return local.to(t.device)
