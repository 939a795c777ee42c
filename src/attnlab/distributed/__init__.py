"""Sequence parallelism: one sequence sharded over the ranks of a torch.distributed group.

* :func:`ring_attention`: key/value shards travel around a ring of ranks (point-to-point),
  partial results merge by log-sum-exp; any attnlab mask or bias function at global positions.
* :func:`ulysses_attention`: all-to-all turns sequence shards into head shards, any
  attnlab exact backend runs on full sequences over ``H / P`` heads, and back.
* :class:`SequenceParallel` (the setting layers receive), :func:`sequence_parallel` and
  :class:`ContextParallel` (a token model run with its sequence sharded).
* :class:`SequenceLayout`, :func:`shard_sequence`, :func:`unshard_sequence`,
  :func:`gather_sequence`: which positions each rank holds (``zigzag`` or ``contiguous``).

Works over gloo (CPU tensors) and NCCL (CUDA tensors). See docs/DISTRIBUTED.md.
"""

from .comm import gather_sequence
from .layout import LAYOUTS, SequenceLayout, make_layout, shard_sequence, unshard_sequence
from .parallel import STRATEGIES, ContextParallel, SequenceParallel, sequence_parallel
from .ring import ring_attention
from .ulysses import heads_to_sequence, sequence_to_heads, ulysses_attention

__all__ = [
    "LAYOUTS",
    "STRATEGIES",
    "ContextParallel",
    "SequenceLayout",
    "SequenceParallel",
    "gather_sequence",
    "heads_to_sequence",
    "make_layout",
    "ring_attention",
    "sequence_parallel",
    "sequence_to_heads",
    "shard_sequence",
    "ulysses_attention",
    "unshard_sequence",
]
