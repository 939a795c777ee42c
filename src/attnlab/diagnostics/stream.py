"""Attention statistics without the N x M weight matrix: a second tiled pass after ``chunked``.

FlashAttention (Dao et al., 2022) never stores the softmax weights; it keeps only the
row log-sum-exp. Once that is known the weight of any tile is recomputable exactly,
``p = exp2(scores2 - lse2)`` in the log2 domain of :mod:`attnlab.exact.chunked`.
:func:`attention_statistics` runs the chunked forward pass for ``lse2``, then walks
the same tiles (skipping EMPTY ones, masking PARTIAL ones) and accumulates, per head:

* per-query entropy ``-sum_j p_ij log p_ij`` (nats),
* per-key attention received (column sums ``sum_i p_ij``),
* the top-k keys of every query (a running ``torch.topk`` merged tile by tile),
* per-query mean distance ``sum_j p_ij |pos_i - j|`` and its per-head mean,
* optionally a pooled ``(bins_q, bins_k)`` map (mean over queries of a bin, sum over
  keys of a bin: rows still sum to 1) for drawing long sequences.

:func:`statistics_from_weights` computes the same quantities from a materialized
``(B, H, N, M)`` weight matrix: the readable picture the streamed pass is tested against.

Fully masked query rows (no allowed key) have entropy 0, distance 0, no top-k entries
(index -1, value 0) and ``valid`` False. Keys whose weight is exactly zero (masked, or
underflowed) are never reported among the top-k.

Query ``i`` sits at key position ``i + (M - N)`` (bottom-right alignment, as masks do).
Time O(B H N M D) (two passes over the non-empty tiles); memory O(B H (N k + M) + tile).
Shape legend: B batch, H heads, Hkv kv heads, G = H / Hkv, N queries, M keys, D dim,
k top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..exact.call import AttentionCall, make_call
from ..exact.chunked import LOG2E, TileWalker, plan_tiles, tiled_forward
from ..masks import FULL

__all__ = ["AttentionStatistics", "attention_statistics", "statistics_from_weights"]

LN2 = math.log(2.0)


@dataclass
class AttentionStatistics:
    """Statistics of softmax attention weights, all in float32 (float64 for float64 inputs).

    Attributes:
        entropy: ``(B, H, N)`` row entropy in nats (0 on fully masked rows).
        received: ``(B, H, M)`` attention each key receives, summed over queries.
        topk_values: ``(B, H, N, k)`` the largest weights of each row, descending
            (0 where the row has fewer than ``k`` nonzero weights).
        topk_indices: ``(B, H, N, k)`` int64 key indices of ``topk_values`` (-1 where missing).
        mean_distance: ``(B, H, N)`` ``sum_j p_ij |pos_i - j|``.
        valid: ``(B, H, N)`` bool, rows with at least one allowed key.
        pooled: ``(B, H, bins_q, bins_k)`` pooled weights when ``bins`` was given, else None.
    """

    entropy: Tensor
    received: Tensor
    topk_values: Tensor
    topk_indices: Tensor
    mean_distance: Tensor
    valid: Tensor
    pooled: Tensor | None = None

    @property
    def head_mean_distance(self) -> Tensor:
        """``(B, H)`` mean distance over the valid rows of each head (0 if none)."""
        return _masked_mean(self.mean_distance, self.valid)

    @property
    def head_entropy(self) -> Tensor:
        """``(B, H)`` mean entropy over the valid rows of each head (0 if none)."""
        return _masked_mean(self.entropy, self.valid)


def _masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    return (x * valid).sum(-1) / valid.sum(-1).clamp_min(1)


def _bins(n: int, bins: int, device) -> Tensor:
    """Bin of each of ``n`` positions when split into ``bins`` near-equal contiguous bins."""
    return torch.arange(n, device=device) * bins // n


def _check_bins(bins, n: int, m: int) -> tuple[int, int] | None:
    if bins is None:
        return None
    bq, bk = (bins, bins) if isinstance(bins, int) else tuple(bins)
    if not (isinstance(bq, int) and isinstance(bk, int) and bq >= 1 and bk >= 1):
        raise ValueError(f"bins must be a positive int or a pair of them, got {bins!r}")
    return min(bq, n), min(bk, m)


def _finish_topk(vals: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    missing = vals <= 0
    return vals.masked_fill(missing, 0.0), idx.masked_fill(missing, -1)


def statistics_from_weights(weights: Tensor, top_k: int = 8, bins=None) -> AttentionStatistics:
    """The statistics of a materialized weight tensor ``(B, H, N, M)`` (rows sum to 1 or are 0).

    The slow, readable definition :func:`attention_statistics` is checked against.
    """
    if not isinstance(weights, Tensor) or weights.ndim != 4:
        raise ValueError(f"weights must be a (B, H, N, M) tensor, got {getattr(weights, 'shape', type(weights))}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    w = weights.float() if weights.dtype != torch.float64 else weights
    _, _, n, m = w.shape
    pos = torch.arange(n, device=w.device).view(n, 1) + (m - n)  # (N, 1)
    dist = (torch.arange(m, device=w.device).view(1, m) - pos).abs().to(w.dtype)  # (N, M)
    ent = -(w * torch.log(w.clamp_min(torch.finfo(w.dtype).tiny))).sum(-1)  # (B, H, N)
    vals, idx = w.topk(min(top_k, m), dim=-1)  # (B, H, N, k)
    vals, idx = _finish_topk(vals, idx)
    pooled = None
    nb = _check_bins(bins, n, m)
    if nb is not None:
        rb, kb = _bins(n, nb[0], w.device), _bins(m, nb[1], w.device)
        cols = torch.zeros(*w.shape[:3], nb[1], dtype=w.dtype, device=w.device).index_add_(3, kb, w)  # (B, H, N, bk)
        pooled = torch.zeros(*w.shape[:2], nb[0], nb[1], dtype=w.dtype, device=w.device).index_add_(2, rb, cols)
        pooled /= torch.bincount(rb, minlength=nb[0]).to(w.dtype).view(-1, 1)  # mean over the queries of a bin
    return AttentionStatistics(
        entropy=ent,
        received=w.sum(-2),
        topk_values=vals,
        topk_indices=idx,
        mean_distance=(w * dist).sum(-1),
        valid=w.sum(-1) > 0,
        pooled=pooled,
    )


def _contiguous(call: AttentionCall) -> AttentionCall:
    return AttentionCall(
        q=call.q.contiguous(), k=call.k.contiguous(), v=call.v.contiguous(), mask=call.mask,
        bias=call.bias, bias_fn=call.bias_fn, scale=call.scale, dropout_p=0.0,
        dropout_seed=0, return_weights=False,
    )


@torch.no_grad()
def attention_statistics(
    q: Tensor,
    k: Tensor,
    v: Tensor | None = None,
    *,
    mask=None,
    bias=None,
    scale: float | None = None,
    top_k: int = 8,
    bins: int | tuple[int, int] | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> AttentionStatistics:
    """Statistics of ``softmax(q k^T * scale + bias, masked)`` in memory linear in N and M.

    Args:
        q: ``(B, H, N, D)``; k: ``(B, Hkv, M, D)`` (grouped-query heads allowed).
        v: unused by the statistics; accepted so a call's ``(q, k, v)`` can be passed
            as is (a 1-wide zero value is used when None, which makes the first pass cheap).
        mask, bias, scale: as in :func:`attnlab.attention`.
        top_k: how many keys to keep per query (at most ``M``).
        bins: also return a pooled map with ``bins`` (or ``(bins_q, bins_k)``) bins.
        block_q, block_k: tile sizes (default: the ``chunked`` planner's choice).

    Returns:
        An :class:`AttentionStatistics`; query heads ``H`` (key heads are broadcast).

    Raises:
        ValueError: on malformed input (as :func:`attnlab.attention`), ``top_k < 1``
            or bad ``bins``.
    """
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    if v is None:
        v = k.new_zeros(k.shape[0], k.shape[1], k.shape[2], 1) if isinstance(k, Tensor) else k
    call = _contiguous(make_call(q, k, v, mask=mask, bias=bias, scale=scale))
    plan = plan_tiles(call, block_q, block_k)
    _, lse2 = tiled_forward(call, plan)  # (B, Hkv, G, N, 1) log2 domain, +inf on empty rows
    c, t = call, TileWalker(call, plan)
    ad, dev = t.ad, c.device
    nb = _check_bins(bins, c.N, c.M)
    kk = min(top_k, c.M)
    shape_q = (c.B, c.Hkv, c.G, c.N)
    ent = torch.zeros(shape_q, dtype=ad, device=dev)
    dist = torch.zeros(shape_q, dtype=ad, device=dev)
    received = torch.zeros(c.B, c.Hkv, c.G, c.M, dtype=ad, device=dev)
    topv = torch.zeros(*shape_q, kk, dtype=ad, device=dev)
    topi = torch.full((*shape_q, kk), -1, dtype=torch.long, device=dev)
    pooled = torch.zeros(c.B, c.Hkv, c.G, nb[0], nb[1], dtype=ad, device=dev) if nb else None
    if nb:
        rbin, kbin = _bins(c.N, nb[0], dev), _bins(c.M, nb[1], dev)
    q2all = c.q.view(c.B, c.Hkv, c.G, c.N, c.D) * (c.scale * LOG2E)  # (B, Hkv, G, N, D)
    kt = c.k.unsqueeze(2).transpose(-1, -2)  # (B, Hkv, 1, D, M)
    keypos = torch.arange(c.M, device=dev, dtype=ad)
    guard = c.has_bias()  # a -inf bias can hide keys inside a FULL tile
    for i, (q0, q1) in enumerate(t.qr):
        q2 = q2all[:, :, :, q0:q1]  # (B, Hkv, G, bq, D)
        lse = lse2[:, :, :, q0:q1]  # (B, Hkv, G, bq, 1)
        qpos = torch.arange(q0, q1, device=dev, dtype=ad).view(-1, 1) + (c.M - c.N)  # (bq, 1)
        run_v = torch.full((c.B, c.Hkv, c.G, q1 - q0, kk), -1.0, dtype=ad, device=dev)
        run_i = torch.full_like(run_v, -1, dtype=torch.long)
        for k0, k1, kind in t.row(i):
            s = t.scores2(q2, kt[..., k0:k1], q0, q1, k0, k1, kind)  # (B, Hkv, G, bq, bk)
            s.sub_(lse)  # log2 of the weights; -inf where masked or on empty rows
            p = torch.exp2(s)  # (B, Hkv, G, bq, bk) the softmax weights of the tile
            if kind != FULL or guard:
                s.clamp_(min=-30000.0)  # masked entries: 0 * log 0 = 0 (FULL tiles without bias have none)
            ent[:, :, :, q0:q1] -= (p * s).sum(-1)
            dist[:, :, :, q0:q1] += (p * (keypos[k0:k1] - qpos).abs_()).sum(-1)
            received[:, :, :, k0:k1] += p.sum(-2)
            tv, ti = p.topk(min(kk, k1 - k0), dim=-1)  # (B, Hkv, G, bq, <=k)
            run_v, sel = torch.cat([run_v, tv], dim=-1).topk(kk, dim=-1)
            run_i = torch.cat([run_i, ti + k0], dim=-1).gather(-1, sel)
            if pooled is not None:
                cs = torch.nn.functional.pad(p.cumsum(-1), (1, 0))  # (B, Hkv, G, bq, bk + 1)
                kb = kbin[k0:k1]
                first, last = int(kb[0]), int(kb[-1])
                edges = torch.searchsorted(kb, torch.arange(first, last + 2, device=dev))  # bin starts in the tile
                seg = cs[..., edges[1:]] - cs[..., edges[:-1]]  # (B, Hkv, G, bq, nbins in tile)
                pooled[..., first:last + 1].index_add_(3, rbin[q0:q1], seg)
        v_, i_ = _finish_topk(run_v, run_i)
        topv[:, :, :, q0:q1], topi[:, :, :, q0:q1] = v_, i_
    if pooled is not None:
        pooled /= torch.bincount(rbin, minlength=nb[0]).to(ad).view(-1, 1)  # mean over the queries of a bin
    B, H, N, M = c.B, c.H, c.N, c.M
    return AttentionStatistics(
        entropy=(ent * LN2).view(B, H, N),  # (B, H, N), bits -> nats
        received=received.view(B, H, M),  # (B, H, M)
        topk_values=topv.view(B, H, N, kk),  # (B, H, N, k)
        topk_indices=topi.view(B, H, N, kk),  # (B, H, N, k)
        mean_distance=dist.view(B, H, N),  # (B, H, N)
        valid=torch.isfinite(lse2).view(B, H, N),  # (B, H, N)
        pooled=pooled.view(B, H, nb[0], nb[1]) if pooled is not None else None,  # (B, H, bins_q, bins_k)
    )
