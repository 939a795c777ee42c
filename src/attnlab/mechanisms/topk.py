"""Top-k (explicit sparse) attention: each query keeps only its ``k`` largest scores.

Zhao, Lin, Sun, Zhang, Ren and Su, 2019, "Explicit Sparse Transformer: Concentrated
Attention Through Explicit Selection". For each query ``i`` the scores
``s_ij = q_i . k_j * scale + bias_ij`` of the keys its mask allows are ranked, the ``k``
largest are kept and every other key is masked out before the softmax:

    out_i = sum_{j in topk_i} softmax_j(s_ij) v_j

The pattern is chosen by the input (a query attends where its own scores are large), so
it is a *dynamic* mask. The forward is exact: the selection becomes a dense boolean mask
``allowed & topk`` handed to :func:`attnlab.attention`, so the output and its gradient are
exact softmax attention under that mask (the selection is piecewise constant in q, k and
bias, so it has no gradient of its own: the gradient of top-k attention is the gradient
of attention under the selected mask, everywhere the top k are not tied). At
``k >= M`` no allowed key is dropped and it equals exact attention. Rows with fewer
than ``k`` allowed keys keep all of them; rows with none give zeros, like the op.

Selection runs on ``chunk`` queries at a time without autograd, so its float scores take
O(B H chunk M); the boolean mask it builds is O(B H N M) bytes (one byte per pair), and
the exact op on it is the ``math`` picture or a dense-mask backend. Time
O(B H N M (D + log k)) for the scores and the selection plus exact attention's
O(B H N M (D + Dv)): top-k saves no work, it concentrates the weights (that is the paper's
point); a kernel that skips the unselected keys is future work.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries,
``M`` keys, ``D`` head dim, ``Dv`` value dim, ``k`` kept keys per query.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..exact import attention, make_call
from ..exact.call import AttentionCall
from ..exact.registry import get_backend
from ..exact.tiles import attend_block, attend_block_backward
from ..masks import dense
from .base import Cost, Mechanism, register_mechanism
from .linear import repeat_kv

__all__ = ["TopK", "topk_allowed"]


def topk_allowed(q: Tensor, k: Tensor, v: Tensor, top: int, mask=None, *, bias=None,
                 chunk: int = 128) -> Tensor:
    """The keys each query keeps: ``(B, H, N, M)`` bool, True for the ``top`` largest allowed scores.

    Args:
        q, k, v: ``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv)`` (``v`` only validated).
        top: keys kept per query (all allowed keys when a row has fewer).
        mask, bias: as in :func:`attnlab.attention`; a key the mask hides is never kept.
        chunk: queries scored at a time (bounds the float scores to ``(B, H, chunk, M)``).
    """
    return _select(make_call(q, k, v, mask=mask, bias=bias), q, k, top, chunk)


def _select(call: AttentionCall, q: Tensor, k: Tensor, top: int, chunk: int) -> Tensor:
    """:func:`topk_allowed` of an already checked ``call``."""
    allowed = call.dense_mask()  # (B|1, H|1, N|1, M|1) or None
    causal = _causal(call)
    bias_t = call.dense_bias(q.dtype)  # broadcastable to (B, H, N, M) or None
    kk = repeat_kv(k.detach(), call.G)  # (B, H, M, D)
    keep = torch.zeros(call.B, call.H, call.N, call.M, dtype=torch.bool, device=q.device)  # (B, H, N, M)
    kept = min(top, call.M)
    with torch.no_grad():
        qs = q.detach() * call.scale  # (B, H, N, D): scaled once, not each (B, H, c, M) score tile
        kt = kk.transpose(-1, -2)  # (B, H, D, M)
        for i0 in range(0, call.N, chunk):
            i1 = min(i0 + chunk, call.N)
            m1 = min(i1, call.M) if causal else call.M  # causal: the chunk's rows see no key from i1 on
            s = qs[:, :, i0:i1] @ kt[..., :m1]  # (B, H, c, m1)
            if bias_t is not None:
                s += _rows(bias_t.detach(), i0, i1)[..., :m1]
            if allowed is not None:
                s.masked_fill_(~_rows(allowed, i0, i1)[..., :m1], float("-inf"))
            idx = s.topk(min(kept, m1), dim=-1, sorted=False).indices  # (B, H, c, kept)
            sel = keep[:, :, i0:i1, :m1].scatter_(-1, idx, True)  # (B, H, c, m1), written in place
            sel &= ~torch.isneginf(s)  # a hidden key (mask or -inf bias) picked to fill a short row stays hidden
    return keep


def _causal(call: AttentionCall) -> bool:
    """Whether the call's mask is top-left causal (query ``i`` sees keys ``0..i``) and nothing more."""
    return call.mask is not None and call.mask.is_causal(call.N, call.M)


def _rows(t: Tensor, i0: int, i1: int) -> Tensor:
    """Query rows ``i0:i1`` of a tensor broadcastable to ``(B, H, N, M)`` (a size-1 row dim stays)."""
    while t.ndim < 4:
        t = t.unsqueeze(0)
    return t if t.shape[2] == 1 else t[:, :, i0:i1]


class _Selected(torch.autograd.Function):
    """Exact attention under the selected mask as one block (:func:`attnlab.exact.tiles.attend_block`).

    The selection's dense mask goes to the block kernel as it is, instead of through
    :func:`attnlab.attention`, whose mask analysis (which tiles are full or empty) costs more
    than the attention when almost every tile is partly selected. A causal call also passes
    ``is_causal``, so the tiles above the diagonal are skipped, not read from the mask.
    """

    @staticmethod
    def forward(ctx, q, k, v, keep, bias, scale: float, causal: bool):
        G = q.shape[1] // k.shape[1]
        kk, vv = repeat_kv(k, G), repeat_kv(v, G)  # (B, H, M, D), (B, H, M, Dv)
        out, lse = attend_block(q, kk, vv, tile_mask=keep, bias_tile=bias, scale=scale, is_causal=causal)
        ctx.save_for_backward(q, kk, vv, keep, bias, out, lse)
        ctx.scale, ctx.causal, ctx.G = scale, causal, G
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, kk, vv, keep, bias, out, lse = ctx.saved_tensors
        dq, dk, dv = attend_block_backward(dout.contiguous(), q, kk, vv, out, lse, tile_mask=keep, bias_tile=bias,
                                           scale=ctx.scale, is_causal=ctx.causal)
        if ctx.G > 1:  # the query heads' shares of each kv head
            B, H, M = dk.shape[:3]
            dk = dk.view(B, H // ctx.G, ctx.G, M, -1).sum(2)
            dv = dv.view(B, H // ctx.G, ctx.G, M, -1).sum(2)
        return dq, dk, dv, None, None, None, None


@register_mechanism
class TopK(Mechanism):
    """Top-k attention: softmax over each query's ``k`` largest allowed scores.

    Args:
        k: keys kept per query (``k >= M`` is exact attention).
        backend: exact-attention backend run on the selected mask (``"auto"`` or a name).
        chunk: queries scored at a time during the selection.
    """

    name = "topk"
    masks_supported = "any mask and additive bias (the selection is among the keys the mask allows)"

    def __init__(self, k: int = 32, backend: str = "auto", chunk: int = 128):
        super().__init__()
        for arg, val in (("k", k), ("chunk", chunk)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{arg} must be a positive int, got {val!r}")
        if backend != "auto":
            get_backend(backend)  # raises ValueError naming the known backends
        self.k, self.backend, self.chunk = k, backend, chunk

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        """``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)`` (and weights ``(B, H, N, M)``)."""
        call = make_call(q, k, v, mask=mask, bias=bias)
        keep = _select(call, q, k, self.k, self.chunk)  # (B, H, N, M)
        if self.backend == "auto" and not return_weights and (bias is None or (torch.is_tensor(bias)
                                                                              and not bias.requires_grad)):
            # the block path gives no gradient to a bias: a bias that needs one (or a bias function's
            # parameters) goes through attnlab.attention below
            return _Selected.apply(q, k, v, keep, call.dense_bias(q.dtype), call.scale, _causal(call))
        backend = "math" if return_weights and self.backend == "auto" else self.backend
        return attention(q, k, v, mask=dense(keep), bias=bias, return_weights=return_weights, backend=backend)

    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        return {"k": n}

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"k": max(1, n // 4)}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        bhnm = float(batch * heads * n_queries * n_keys)
        flops = 2.0 * bhnm * head_dim + 2.0 * bhnm * 2 * head_dim  # selection scores + exact attention
        mem = bhnm * 1 + 4.0 * batch * heads * min(self.chunk, n_queries) * n_keys * 2  # bool mask + scores
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return f"k={self.k}, backend={self.backend!r}"
