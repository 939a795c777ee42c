"""Attention layers: multi-head (self/cross, grouped-query, KV cache), classic
encoder-decoder attention (Bahdanau, Luong), 2-D spatial self-attention, attention over grids and
videos (axial, MaxViT block/grid, TimeSformer's divided space-time), and graph attention with
PyTorch Geometric's signatures (GATConv, GATv2Conv, TransformerConv).

Layers receive their parts (a :class:`attnlab.mechanisms.Mechanism`, a positional
q/k transform) rather than growing a flag per feature.
"""

from .axial import AxialAttention
from .classic import AdditiveAttention, LuongAttention
from .graph import GATConv, GATv2Conv, TransformerConv
from .kv_cache import KVCache
from .maxvit import MaxViTAttention
from .multihead import MultiHeadAttention, QKTransform
from .spacetime import DividedSpaceTimeAttention
from .spatial import SpatialSelfAttention

__all__ = [
    "AdditiveAttention",
    "AxialAttention",
    "DividedSpaceTimeAttention",
    "GATConv",
    "GATv2Conv",
    "KVCache",
    "LuongAttention",
    "MaxViTAttention",
    "MultiHeadAttention",
    "QKTransform",
    "SpatialSelfAttention",
    "TransformerConv",
]
