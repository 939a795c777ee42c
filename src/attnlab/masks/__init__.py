"""Composable attention masks.

A mask says where attention is **allowed**: ``True`` means query ``i`` may attend to
key ``j`` (the convention of the boolean ``attn_mask`` of
``torch.nn.functional.scaled_dot_product_attention``). Masks are small value objects
that combine with ``&`` (both allow), ``|`` (either allows) and ``~`` (negation).

Position convention. When there are fewer queries than keys (``N < M``, as in
incremental decoding with a KV cache), the queries are the *last* ``N`` positions of
the key sequence: query ``i`` sits at position ``i + (M - N)``. Every position-based
mask (causal, sliding window, prefix-LM, document, global tokens) uses this
bottom-right alignment. For ``causal()`` with N=3 queries and M=5 keys::

            keys 0 1 2 3 4
    query 0 (pos 2)  x x x . .
    query 1 (pos 3)  x x x x .
    query 2 (pos 4)  x x x x x

(PyTorch's ``is_causal=True`` aligns top-left instead; attnlab never passes it when
N != M.) With ``N > M`` the first ``N - M`` query rows of a causal mask see no key;
such rows produce zeros in :func:`attnlab.attention`.

Every mask can

* answer "may query i see key j" vectorized on broadcastable index tensors
  (:meth:`Mask.allows`),
* materialize itself as a boolean tensor, compact in the dimensions it does not depend
  on (:meth:`Mask.dense`; ``padding`` gives ``(B, 1, 1, M)``, ``causal`` gives
  ``(1, 1, N, M)``),
* classify every (query-block, key-block) tile as EMPTY, PARTIAL or FULL without
  building the ``N x M`` matrix (:meth:`Mask.block_kinds`), so tiled kernels skip
  empty tiles and never evaluate the mask on full ones,
* check that it fits a call with ``N`` queries and ``M`` keys (:meth:`Mask.validate`;
  ``dense``, ``tile`` and ``block_kinds`` call it): a padding length above ``M`` or a
  global position at or beyond ``M`` is a ValueError naming the value and the range,
  not a silent no-op. The sizes it compares are host integers computed once when the
  mask is built, so validating never waits on a GPU.

Grids, videos and trees (:mod:`attnlab.masks.structured`, which documents the ``(H, W)`` /
``(T, H, W)`` layout): ``axial``, ``same_frame``, ``same_position``, ``block_2d``, ``grid_2d``,
``nested``, ``brackets``, ``tree``. :func:`kinds` lists an example of every enrolled mask kind
(the conformance grid runs each on every backend).

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from .base import EMPTY, FULL, PARTIAL, Mask, as_mask, conjuncts, dense, tile_kinds
from .graph import EdgeCSR, GraphMask, graph
from .keys import from_blocked, key_mask, padding, padding_from_tokens
from .kinds import kinds, mask_kind
from .position import causal, document, global_tokens, prefix_lm, sliding_window
from .structured import Regrouping, axial, block_2d, brackets, grid_2d, nested, same_frame, same_position, tree

__all__ = [
    "EMPTY",
    "PARTIAL",
    "FULL",
    "Mask",
    "causal",
    "padding",
    "key_mask",
    "sliding_window",
    "global_tokens",
    "document",
    "prefix_lm",
    "dense",
    "padding_from_tokens",
    "from_blocked",
    "as_mask",
    "conjuncts",
    "tile_kinds",
    "graph",
    "GraphMask",
    "EdgeCSR",
    # grids, videos and trees (layout: see attnlab.masks.structured)
    "axial",
    "same_frame",
    "same_position",
    "block_2d",
    "grid_2d",
    "nested",
    "brackets",
    "tree",
    "Regrouping",
    "kinds",
    "mask_kind",
]
