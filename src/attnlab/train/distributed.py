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

Communication per step O(parameters) (the gradient all-reduce).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "setup", "cleanup", "all_reduce_mean", "barrier", "gather_tensors", "broadcast_tensor"]


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


def _device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device must be cpu when CUDA is not available, got {name!r}")
        return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)
    if name != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {name!r}")
    return torch.device("cpu")


def setup(device: str = "auto") -> DistInfo:
    """Join the process group when launched by ``torchrun``; otherwise a single-process info.

    Args:
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``; under torchrun each
            rank takes CUDA device ``LOCAL_RANK``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _device(device, local_rank)
    if world <= 1:
        return DistInfo(device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, world=world, local_rank=local_rank, device=dev, backend=backend)


def cleanup(info: DistInfo) -> None:
    """Leave the process group (no-op for a single process)."""
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    """Wait for every rank."""
    if info.distributed:
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


def broadcast_tensor(t: torch.Tensor, info: DistInfo, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s tensor on every rank (same shape and dtype everywhere)."""
    if not info.distributed:
        return t
    local = t.to(info.device).clone()
    dist.broadcast(local, src=src)
    return local.to(t.device)
