"""attnlab: self-attention and Transformers, exact and efficient, measured.

Tensors are ``(batch, heads, seq, head_dim)``; masks say where attention is *allowed*.
"""

from . import masks
from .exact import attention, backends, choose_backend, explain

__version__ = "0.1.0"

__all__ = ["__version__", "attention", "backends", "choose_backend", "explain", "masks"]
