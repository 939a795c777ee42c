"""Attention layers: multi-head (self/cross, grouped-query, KV cache), classic
encoder-decoder attention (Bahdanau, Luong) and 2-D spatial self-attention.

Layers receive their parts (a :class:`attnlab.mechanisms.Mechanism`, a positional
q/k transform) rather than growing a flag per feature.
"""

from .classic import AdditiveAttention, LuongAttention
from .kv_cache import KVCache
from .multihead import MultiHeadAttention, QKTransform
from .spatial import SpatialSelfAttention

__all__ = [
    "AdditiveAttention",
    "KVCache",
    "LuongAttention",
    "MultiHeadAttention",
    "QKTransform",
    "SpatialSelfAttention",
]
