"""Longformer attention: a sliding window plus global tokens, as exact attention under a mask.

Beltagy, Peters and Cohan, 2020, "Longformer: The Long-Document Transformer". Each
token attends a local window of neighbours; a few chosen positions (for example the
CLS token) are *global*: they attend every position and every position attends them.

Window semantics (``window = w``, the paper's "attention window size" - the number
of neighbours besides the token itself):

* bidirectional (default): position ``p`` sees keys ``p - w//2 .. p + w//2``
  (``sliding_window(w // 2, w // 2)``; an odd ``w`` rounds each side down);
* causal (``causal=True``, or when the user mask is exactly ``causal()``): keys
  ``p - w .. p`` (``sliding_window(w, 0) & causal()``); global positions then see
  every *earlier* key and are seen by every later query.

The pattern is an :mod:`attnlab.masks` mask (:meth:`Longformer.pattern`), combined
with the user's mask by ``&``; Longformer is exact attention under it. Two ways:

* ``backend="auto"``/``"gather"`` (self-attention without bias, dropout or weights):
  one batched call instead of ``chunked``'s Python loop over tiles (what accelerators
  want; on a busy CPU the tile loop's thousands of small ops also varied 0.7-20 s at
  N=8192 where this stayed within 10%):
  positions are cut into blocks of ``bs = clamp(w/2, 16, 128)`` (``w`` for causal);
  the query blocks are folded into the head dimension and one fused call attends
  each to the band of key blocks its window reaches (a strided view, not a copy),
  a second one to the global keys, merged by log-sum-exp
  (:func:`attnlab.mechanisms.local.block_attention`, checked against its
  gather-and-SDPA path, ``fused=False``); global
  query rows go through :func:`attnlab.attention` against all keys. Time
  O(B H N (w + bs + g) D), memory O(B H N D).
* an exact backend name (and ``auto`` for the other calls): :func:`attnlab.attention`
  with the mask; the ``chunked`` backend skips the tiles the mask classifies EMPTY,
  so time is O(B H N (w + g) D) and memory O(B H N D) (``g`` global tokens); a dense
  backend (``math``, ``sdpa``) computes the same numbers in O(B H N M D).

Supports every mask, additive biases, dropout and ``return_weights``
(served by ``math``). Grouped-query heads are broadcast by the exact op.

Shape legend: B batch, H heads, N queries, M keys, D head dim, w window, g globals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..exact import attention
from ..exact.call import check_qkv
from ..masks import Mask, as_mask, causal, global_tokens, sliding_window
from .base import Cost, Mechanism, register_mechanism
from .local import block_attention, block_mechanism_reason, block_route, check_block_settings


@register_mechanism
class Longformer(Mechanism):
    """Sliding-window + global-token attention (exact attention under that mask).

    Args:
        window: number of neighbours each token sees besides itself (``w``); see the
            module docstring for the bidirectional and causal meaning.
        global_indices: positions that attend and are attended globally (e.g. ``[0]``).
        causal: autoregressive variant (past window, causal globals).
        backend: ``"auto"`` (one call of attnlab's native CPU kernel under the window/global
            mask when it serves the call, else the block-gather kernel when the call allows it -
            self-attention, no bias, no dropout, no weights - else the exact op's choice), ``"gather"``
            (that kernel only) or an exact backend name
            for :func:`attnlab.attention` (``"chunked"``, ``"math"``, ``"sdpa"``, ...).
        dropout: attention-weight dropout in training mode.
    """

    name = "longformer"
    masks_supported = "any mask (combined with the window/global pattern by &) and additive bias"
    exact = False

    def __init__(
        self,
        window: int = 512,
        global_indices: Sequence[int] = (),
        causal: bool = False,
        backend: str = "auto",
        dropout: float = 0.0,
    ):
        super().__init__()
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ValueError(f"longformer: window must be a non-negative int, got {window!r}")
        check_block_settings("longformer", backend, dropout)
        self.window = window
        self.global_indices = [int(i) for i in global_indices]
        if any(i < 0 for i in self.global_indices):
            raise ValueError(f"longformer: global_indices must be >= 0, got {self.global_indices}")
        self.causal = bool(causal)
        self.backend = backend
        self.dropout = dropout

    def pattern(self, causal_: bool | None = None) -> Mask:
        """The window/global mask (``causal_`` overrides the constructor's ``causal``)."""
        is_causal = self.causal if causal_ is None else causal_
        w = self.window
        local = sliding_window(w, 0) if is_causal else sliding_window(w // 2, w // 2)
        m = local | global_tokens(self.global_indices) if self.global_indices else local
        return m & causal() if is_causal else m

    def _gather_plan(self, n: int, is_causal: bool, device) -> tuple[Tensor, int, Tensor]:
        """Key blocks ``(nb, K)`` reaching each query block's window, block size, global positions."""
        left = self.window if is_causal else self.window // 2
        right = 0 if is_causal else self.window // 2
        bs = min(128, max(16, left, right), n)
        nb = math.ceil(n / bs)
        lo, hi = -math.ceil(left / bs), math.ceil(right / bs)
        blocks = torch.arange(nb).view(-1, 1) + torch.arange(lo, hi + 1).view(1, -1)  # (nb, K)
        blocks = blocks.masked_fill((blocks < 0) | (blocks >= nb), -1)
        glob = torch.tensor(sorted({i for i in self.global_indices if i < n}), dtype=torch.long)
        return blocks.to(device), bs, glob.to(device)

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        check_qkv(q, k, v, who="longformer")
        user = as_mask(mask, "mask")
        if user is not None:
            user.validate(q.shape[2], k.shape[2])  # lengths and indices against this call (as supports() says)
        N, M = q.shape[2], k.shape[2]
        if self.global_indices and max(self.global_indices) >= min(N, M):
            # a global position past the sequence would be dropped by the gather path and
            # rejected by the exact path's mask: say so the same way on both
            raise ValueError(f"longformer: global_indices must be < the sequence length {min(N, M)}, "
                             f"got {self.global_indices}")
        is_causal = self.causal or (user is not None and user.is_causal(N, M))
        full = self.pattern(is_causal)
        if user is not None:
            full = full & user
        route = block_route(self, "longformer", q, k, v, full, bias=bias, return_weights=return_weights)
        if route == "native":
            return attention(q, k, v, mask=full, bias=bias, backend="native")
        if route == "gather":
            key_blocks, bs, glob = self._gather_plan(N, is_causal, q.device)
            return block_attention(q, k, v, key_blocks, bs, full, extra_keys=glob, dense_rows=glob)
        backend = "math" if return_weights and self.backend == "auto" else self.backend
        return attention(
            q, k, v, mask=full, bias=bias, dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights, backend=backend,
        )

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for any valid mask and bias (backend ``gather``: self-attention only); else the reason."""
        why = block_mechanism_reason(self, "longformer", q, k, v, mask, bias=bias, return_weights=return_weights)
        if why is None and self.global_indices and max(self.global_indices) >= min(q.shape[2], k.shape[2]):
            why = (f"longformer: global_indices must be < the sequence length {min(q.shape[2], k.shape[2])}, "
                   f"got {self.global_indices}")
        return why

    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        """A window reaching every position on both sides: exact attention."""
        return {"window": 2 * n}

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"window": 4}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        g = len(self.global_indices)
        span = min(n_keys, self.window + 1 + g)
        pairs = n_queries * span + g * n_keys
        if self.backend in ("math", "sdpa", "reference"):
            pairs = n_queries * n_keys
        flops = 2.0 * batch * heads * pairs * 2 * head_dim
        mem = 4.0 * batch * heads * (n_queries + n_keys) * head_dim * 2
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return f"window={self.window}, global_indices={self.global_indices}, causal={self.causal}, backend={self.backend!r}"
