"""Attention layers: multi-head (self/cross, grouped-query, KV cache), classic
encoder-decoder attention (Bahdanau, Luong), 2-D spatial self-attention, and graph
attention with PyTorch Geometric's signatures (GATConv, GATv2Conv, TransformerConv).

Layers receive their parts (a :class:`attnlab.mechanisms.Mechanism`, a positional
q/k transform) rather than growing a flag per feature.
"""

from .classic import AdditiveAttention, LuongAttention
from .graph import GATConv, GATv2Conv, TransformerConv
from .kv_cache import KVCache
from .multihead import MultiHeadAttention, QKTransform
from .spatial import SpatialSelfAttention

__all__ = [
    "AdditiveAttention",
    "GATConv",
    "GATv2Conv",
    "KVCache",
    "LuongAttention",
    "MultiHeadAttention",
    "QKTransform",
    "SpatialSelfAttention",
    "TransformerConv",
]
