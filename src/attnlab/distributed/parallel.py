"""Sequence parallelism for whole models: the setting layers receive, and the wrapper that shards a model's input.

* :class:`SequenceParallel` is the part a layer receives (a process group, a strategy,
  a layout): :class:`attnlab.layers.MultiHeadAttention` calls :meth:`SequenceParallel.attend`
  instead of its mechanism, and asks :meth:`SequenceParallel.positions` for the global
  positions of its shard (rotary); decoder stacks add absolute position codes at the
  global positions of :meth:`SequenceParallel.ranges`.
* :func:`sequence_parallel` hands the setting to every module of a model that declares a
  ``sequence_parallel`` attribute, for the duration of a ``with`` block.
* :class:`ContextParallel` wraps a token model: it cuts the ``(B, N)`` input to this
  rank's shard, runs the model under :func:`sequence_parallel`, and all-gathers the logits
  (differentiably: each rank's backward keeps the gradient of its own positions), so a
  task's loss code runs unchanged on the full ``(B, N, V)`` logits.

Shape legend: ``B`` batch, ``N`` global positions, ``n`` this rank's positions, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .comm import agree_shapes, group_info
from .layout import LAYOUTS, SequenceLayout, make_layout, shard_sequence
from .ring import ring_attention
from .ulysses import ulysses_attention

__all__ = ["STRATEGIES", "ContextParallel", "SequenceParallel", "sequence_parallel"]

STRATEGIES = ("ring", "ulysses")


@dataclass(frozen=True)
class SequenceParallel:
    """How a layer's sequence is sharded: over ``group``, attended by ``strategy``, cut by ``layout``.

    Attributes:
        group: the process group of the ranks sharing one sequence (None: the default group).
        strategy: ``"ring"`` (:func:`~attnlab.distributed.ring_attention`) or ``"ulysses"``
            (:func:`~attnlab.distributed.ulysses_attention`, needs heads divisible by the group size).
        layout: ``"zigzag"`` or ``"contiguous"`` (see :mod:`attnlab.distributed.layout`).
    """

    group: object = None
    strategy: str = "ring"
    layout: str = "zigzag"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return dist.get_rank(self.group)

    @property
    def world(self) -> int:
        """Number of ranks sharing a sequence."""
        return dist.get_world_size(self.group)

    def layout_for(self, n: int, device: torch.device) -> SequenceLayout:
        """The layout of the sequence whose shard here has ``n`` positions (a collective: one small all-gather)."""
        info = group_info(self.group, device, "sequence_parallel")
        total = sum(r[0] for r in agree_shapes(info, [n], device))
        return make_layout(self.layout, info.world, total)

    def positions(self, n: int, device: torch.device) -> Tensor:
        """Global positions ``(n,)`` of this rank's shard of ``n`` positions (a collective)."""
        return self.layout_for(n, device).positions(self.rank, device=device)

    def ranges(self, n: int, device: torch.device) -> list[tuple[int, int, int]]:
        """``(global start, local start, length)`` of each run of consecutive positions of this rank's shard."""
        out, local = [], 0
        for a, b in self.layout_for(n, device).ranges(self.rank):
            out.append((a, local, b - a))
            local += b - a
        return out

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask=None, bias=None, *, backend: str = "auto") -> Tensor:
        """Exact attention of this rank's shards over the whole sequence (``(B, H, n, D)`` in and out)."""
        if self.strategy == "ring":
            return ring_attention(q, k, v, mask=mask, bias=bias, group=self.group, layout=self.layout)
        return ulysses_attention(q, k, v, mask=mask, bias=bias, group=self.group, layout=self.layout,
                                 backend=backend)


@contextlib.contextmanager
def sequence_parallel(model: nn.Module, setting: SequenceParallel | None):
    """Within the block, every submodule of ``model`` with a ``sequence_parallel`` attribute holds ``setting``."""
    touched = [(m, m.sequence_parallel) for m in model.modules() if hasattr(m, "sequence_parallel")]
    if setting is not None and not touched:
        raise ValueError(f"model ({type(model).__name__}) has no module that supports sequence parallelism "
                         "(a decoder stack or a MultiHeadAttention with a sequence_parallel attribute)")
    for m, _ in touched:
        m.sequence_parallel = setting
    try:
        yield model
    finally:
        for m, old in touched:
            m.sequence_parallel = old


class _GatherSequence(torch.autograd.Function):
    """All-gather of shards along dim 1 into global order; the backward keeps this rank's positions."""

    @staticmethod
    def forward(ctx, x, setting: SequenceParallel, lay: SequenceLayout):
        ctx.setting, ctx.lay = setting, lay
        world = lay.world
        width = max(lay.shard_length(r) for r in range(world))
        padded = x.new_zeros((x.shape[0], width, *x.shape[2:]))  # all_gather needs equal sizes
        padded[:, : x.shape[1]] = x
        outs = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(outs, padded.contiguous(), group=setting.group)
        full = x.new_empty((x.shape[0], lay.length, *x.shape[2:]))
        for r, o in enumerate(outs):
            local = 0
            for a, b in lay.ranges(r):
                full[:, a:b] = o[:, local: local + b - a]
                local += b - a
        return full

    @staticmethod
    def backward(ctx, g):
        return shard_sequence(g, ctx.setting.rank, ctx.lay.world, layout=ctx.lay, dim=1), None, None


class ContextParallel(nn.Module):
    """Run a token model with its sequence sharded over ``setting.group``; outputs are gathered back.

    Args:
        module: a model taking ``tokens (B, N)`` first and returning a tensor ``(B, N, ...)``
            or an output with ``logits (B, N, V)`` (a :class:`~attnlab.models.CausalLM`).
        setting: the :class:`SequenceParallel` setting.

    Every rank of the group calls it with the same full ``tokens``; each computes its own
    shard and the logits are all-gathered, so every rank returns the full logits. The
    gradient each rank's backward gives the parameters is its share: sum it over the group
    (data-parallel training does, when the loss is multiplied by the group size and the
    gradients averaged over all ranks).
    """

    def __init__(self, module: nn.Module, setting: SequenceParallel):
        super().__init__()
        self.module, self.setting = module, setting

    def forward(self, tokens: Tensor, *args, **kwargs):
        s = self.setting
        lay = make_layout(s.layout, s.world, tokens.shape[1])
        local = shard_sequence(tokens, s.rank, s.world, layout=lay, dim=1)  # (B, n)
        with sequence_parallel(self.module, s):
            out = self.module(local, *args, **kwargs)
        if isinstance(out, Tensor):
            return _GatherSequence.apply(out, s, lay)  # (B, N, ...)
        if not hasattr(out, "logits"):
            raise ValueError(f"ContextParallel: the model must return a tensor or an output with logits, got "
                             f"{type(out).__name__}")
        return dataclasses.replace(out, logits=_GatherSequence.apply(out.logits, s, lay))  # logits (B, N, V)
