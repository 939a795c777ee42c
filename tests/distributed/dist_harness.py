"""Run a function on P gloo ranks (torch.multiprocessing spawn) and the single-process oracle it checks against.

Tests here start one spawn per test and run many sub-cases inside it (starting processes
costs about a second; each sub-case a few milliseconds). A rank that raises fails the
test with its traceback, and ``spawn`` then stops the others; a rank stuck in a collective
gives up after :data:`TIMEOUT` (the process group's timeout), so a hang fails instead of
blocking the suite.
"""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attnlab
from attnlab.distributed import shard_sequence

TIMEOUT = datetime.timedelta(seconds=60)


def _entry(rank: int, world: int, init_file: str, backend: str, fn, args) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world: int, *args, backend: str = "gloo") -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` spawned ranks of ``backend``; re-raise the first failure.

    NCCL ranks take CUDA device ``rank``.
    """
    with tempfile.TemporaryDirectory(prefix="attnlab-dist-") as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_entry, args=(world, init_file, backend, fn, args), nprocs=world, join=True)


def reference(q, k, v, dout, *, mask=None, bias=None, scale=None):
    """The single-process op on the full inputs: ``out``, ``lse`` and ``(dq, dk, dv)``, float32.

    ``lse`` is the row log-sum-exp of the masked, biased scores (``-inf`` on empty rows),
    from the dense scores (the shapes here are tiny).
    """
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attnlab.attention(q, k, v, mask=mask, bias=bias, scale=scale, backend="math")
    grads = torch.autograd.grad(out, (q, k, v), dout)
    g = q.shape[1] // k.shape[1]
    kr = k.detach().repeat_interleave(g, dim=1)  # (B, H, N, D)
    s = q.detach() @ kr.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)  # (B, H, N, N)
    with torch.no_grad():
        if bias is not None:
            B, H, N, _ = s.shape
            idx = (torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1),
                   torch.arange(N).view(1, 1, -1, 1), torch.arange(N).view(1, 1, 1, -1))
            s = s + bias(*idx)
        if mask is not None:
            s = s.masked_fill(~mask.dense(s.shape[2], s.shape[3], batch=s.shape[0], heads=s.shape[1]), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, H, N)
    return out.detach(), lse, grads


def shard(x, rank: int, world: int, layout, dim: int = 2):
    """This rank's shard of a full tensor (``shard_sequence`` with the test's layout)."""
    return shard_sequence(x, rank, world, layout=layout, dim=dim)
