"""Attention layers: multi-head (self/cross, grouped-query, KV cache), classic
encoder-decoder attention (Bahdanau, Luong), 2-D spatial self-attention, and attention over
grids and videos (axial, MaxViT block/grid, TimeSformer's divided space-time).

Layers receive their parts (a :class:`attnlab.mechanisms.Mechanism`, a positional
q/k transform) rather than growing a flag per feature.
"""

from .axial import AxialAttention
from .classic import AdditiveAttention, LuongAttention
from .kv_cache import KVCache
from .maxvit import MaxViTAttention
from .multihead import MultiHeadAttention, QKTransform
from .spacetime import DividedSpaceTimeAttention
from .spatial import SpatialSelfAttention

__all__ = [
    "AdditiveAttention",
    "AxialAttention",
    "DividedSpaceTimeAttention",
    "KVCache",
    "LuongAttention",
    "MaxViTAttention",
    "MultiHeadAttention",
    "QKTransform",
    "SpatialSelfAttention",
]
