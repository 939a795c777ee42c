"""Exact attention: one entry point over a registry of backends.

Import order registers the backends; ``auto`` picks among them by cost estimate.
"""

from . import chunked, edges, flash, flex, native, reference, regroup, sdpa, torch_math  # noqa: F401  (registration)
from .call import AttentionCall, make_call
from .chunked import TileWalker, chunked_attention, plan_tiles, tiled_forward
from .edges import edge_attention, segment_softmax
from .op import Verdict, attention, choose_backend, explain
from .registry import Backend, backends, get_backend, register_backend

__all__ = [
    "AttentionCall",
    "Backend",
    "TileWalker",
    "Verdict",
    "attention",
    "backends",
    "choose_backend",
    "chunked_attention",
    "edge_attention",
    "explain",
    "get_backend",
    "make_call",
    "plan_tiles",
    "register_backend",
    "segment_softmax",
    "tiled_forward",
]
