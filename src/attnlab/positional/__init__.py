"""Position encodings: absolute codes added to embeddings, and encodings inside attention.

Added to embeddings (``forward(x (B, N, dim), offset=0) -> x + pe``):

* :class:`SinusoidalPositional` - fixed sin/cos codes, any length (Vaswani et al., 2017).
* :class:`LearnedPositional` - one trained vector per position up to ``max_len``.
* :class:`SinusoidalND` - per-axis sin/cos codes for 2-D image and 3-D video grids.

Acting inside attention, usable with every exact backend:

* :class:`RotaryEmbedding` - rotates q and k (RoPE, Su et al., 2021), with position
  interpolation (Chen et al., 2023); ``apply(q, k, q_positions, k_positions)``.
* :class:`ALiBi` - per-head linear distance bias (Press et al., 2022).
* :class:`T5RelativeBias` - learned log-bucketed relative bias (Raffel et al., 2020).

The two biases give ``bias_fn(n_q, n_k)``, a function of index tensors that tiled
backends evaluate per tile (no N x M tensor), and ``dense(n_q, n_k)`` ``(1, H, N, M)``.
Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys, ``D`` head dim.
"""

from .absolute import LearnedPositional, SinusoidalPositional, sinusoidal_table
from .alibi import ALiBi, alibi_slopes
from .grid import SinusoidalND
from .rotary import RotaryEmbedding, rotate_half
from .t5 import T5RelativeBias, relative_position_bucket

__all__ = [
    "ALiBi",
    "LearnedPositional",
    "RotaryEmbedding",
    "SinusoidalND",
    "SinusoidalPositional",
    "T5RelativeBias",
    "alibi_slopes",
    "relative_position_bucket",
    "rotate_half",
    "sinusoidal_table",
]
