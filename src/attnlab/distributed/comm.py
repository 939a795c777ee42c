"""The few torch.distributed calls sequence parallelism makes, with the checks that make failures clear.

* :func:`group_info`: rank and size of a process group, after checking that one is running
  and that its backend can move tensors of the inputs' device (gloo moves CPU tensors,
  NCCL CUDA ones): a mismatch is a ValueError here, not a hang or a crash inside the backend.
* :func:`agree_shapes`: every rank's shapes gathered in one small collective, so that a
  bad shard raises the same ValueError on every rank instead of deadlocking the ring.
* :func:`exchange`: post point-to-point sends and receives (``batch_isend_irecv``) and
  return a handle to wait on, so the caller computes while the bytes travel.
* :func:`gather_sequence`: the full sequence from every rank's shard (tests, users' losses).
* :data:`STATS`: the seconds this process spent blocked on sequence-parallel communication
  and the bytes it sent (what ``attnlab bench distributed`` reports as the share of time
  communicating: time a transfer was *not* hidden behind compute).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from .layout import SequenceLayout, make_layout, unshard_sequence

__all__ = ["STATS", "CommStats", "GroupInfo", "agree_shapes", "exchange", "gather_sequence", "group_info"]

#: which device types each backend moves (multi-device backends say it themselves: "cpu:gloo,cuda:nccl")
_BACKEND_DEVICES = {"gloo": ("cpu",), "nccl": ("cuda",), "xccl": ("xpu",), "mpi": ("cpu", "cuda")}


@dataclass
class CommStats:
    """Counters of this process's sequence-parallel communication (reset with :meth:`reset`).

    Attributes:
        seconds: wall time spent blocked in a transfer (waiting for point-to-point messages,
            inside an all-to-all).
        bytes_sent: bytes handed to the backend to send.
    """

    seconds: float = 0.0
    bytes_sent: int = 0

    def reset(self) -> None:
        self.seconds, self.bytes_sent = 0.0, 0


#: this process's counters (ring waits and Ulysses all-to-alls add to them)
STATS = CommStats()


@dataclass(frozen=True)
class GroupInfo:
    """A process group as sequence parallelism sees it.

    Attributes:
        group: the group (None: the default group).
        rank: this process's rank in the group.
        world: number of ranks ``P``.
        backend: the group's backend name (``gloo``, ``nccl``, ...).
    """

    group: object
    rank: int
    world: int
    backend: str

    def global_rank(self, rank: int) -> int:
        """The default-group rank of group rank ``rank`` (what point-to-point ops address)."""
        if self.group is None:
            return rank
        return dist.get_global_rank(self.group, rank)


def _devices_of(backend: str) -> tuple[str, ...] | None:
    if ":" in backend:  # "cpu:gloo,cuda:nccl"
        return tuple(part.split(":", 1)[0] for part in backend.split(","))
    return _BACKEND_DEVICES.get(backend)


def group_info(group, device: torch.device, what: str = "ring_attention") -> GroupInfo:
    """Rank, size and backend of ``group`` after checking it can move tensors on ``device``.

    Raises:
        ValueError: no process group is initialized, or ``group``'s backend cannot move
            ``device`` tensors (CUDA tensors on a gloo group, CPU tensors on NCCL).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{what}: group needs an initialized torch.distributed process group "
                         "(torchrun, or dist.init_process_group) but none is running")
    backend = str(dist.get_backend(group))
    devices = _devices_of(backend)
    if devices is not None and device.type not in devices:
        want = " or ".join(devices)
        raise ValueError(f"{what}: group uses backend {backend!r}, which moves {want} tensors, but q is on "
                         f"{device}; move the tensors to {want} or pass a group of a backend for {device.type} "
                         f"(gloo for cpu, nccl for cuda)")
    return GroupInfo(group, dist.get_rank(group), dist.get_world_size(group), backend)


def agree_shapes(info: GroupInfo, local: list[int], device: torch.device) -> list[list[int]]:
    """Every rank's ``local`` integers (one all-gather of ``len(local)`` int64 per rank)."""
    mine = torch.tensor(local, dtype=torch.int64, device=device)
    if info.world == 1:
        return [local]
    out = [torch.empty_like(mine) for _ in range(info.world)]
    dist.all_gather(out, mine, group=info.group)
    return [t.tolist() for t in out]


class Pending:
    """Sends and receives in flight; :meth:`wait` blocks until all are done."""

    def __init__(self, works: list):
        self._works = works

    def wait(self) -> None:
        t0 = time.perf_counter()
        for w in self._works:
            w.wait()
        self._works = []
        STATS.seconds += time.perf_counter() - t0


def exchange(info: GroupInfo, sends: list[tuple[Tensor, int, int]], recvs: list[tuple[Tensor, int, int]]) -> Pending:
    """Post ``sends`` and ``recvs`` as one batch and return without waiting.

    Args:
        sends: ``(tensor, group rank of the peer, tag)``; the tensor must not change until
            :meth:`Pending.wait` returns.
        recvs: ``(buffer, group rank of the peer, tag)``, filled when :meth:`Pending.wait` returns.

    Messages to oneself are copied locally. Each (peer, tag) pair carries at most one
    message per batch, so the order in which the backend matches them does not matter.
    """
    ops = []
    own = {tag: t for t, peer, tag in sends if peer == info.rank}
    for buf, peer, tag in recvs:
        if peer == info.rank:
            buf.copy_(own[tag])
        else:
            ops.append(dist.P2POp(dist.irecv, buf, info.global_rank(peer), info.group, tag))
    for t, peer, tag in sends:
        if peer != info.rank:
            ops.append(dist.P2POp(dist.isend, t, info.global_rank(peer), info.group, tag))
            STATS.bytes_sent += t.numel() * t.element_size()
    return Pending(dist.batch_isend_irecv(ops) if ops else [])


def gather_sequence(x: Tensor, *, layout: str | SequenceLayout = "zigzag", group=None, dim: int = 2) -> Tensor:
    """The full sequence on every rank from each rank's shard ``x`` (a collective; not differentiable).

    Args:
        x: this rank's shard; dimension ``dim`` holds its positions, the others agree
            across ranks.
        layout: the layout the shards were cut with (see :func:`attnlab.distributed.shard_sequence`).
        group: the process group (default: the default group).

    Returns:
        The ``N``-position tensor :func:`attnlab.distributed.unshard_sequence` builds.
    """
    info = group_info(group, x.device, "gather_sequence")
    lengths = [row[0] for row in agree_shapes(info, [int(x.shape[dim])], x.device)]
    lay = make_layout(layout, info.world, sum(lengths))
    xs = x.movedim(dim, 0).contiguous()  # (n, ...)
    bufs = [torch.empty((n, *xs.shape[1:]), dtype=x.dtype, device=x.device) for n in lengths]
    if info.world == 1:
        bufs = [xs]
    else:
        width = max(lengths)
        # all_gather needs equal sizes: pad every shard to the longest
        padded = torch.zeros((width, *xs.shape[1:]), dtype=x.dtype, device=x.device)
        padded[: xs.shape[0]] = xs
        outs = [torch.empty_like(padded) for _ in range(info.world)]
        dist.all_gather(outs, padded, group=info.group)
        bufs = [o[:n] for o, n in zip(outs, lengths)]
    return unshard_sequence([b.movedim(0, dim) for b in bufs], layout=lay, dim=dim)
