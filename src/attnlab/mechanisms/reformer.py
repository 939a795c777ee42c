"""Reformer LSH attention: shared query/key, hashed into buckets, attend within sorted chunks.

Kitaev, Kaiser and Levskaya, 2020, "Reformer: The Efficient Transformer". Per head:

1. **Shared QK.** The keys are the queries normalized to unit length,
   ``k_j = q_j / |q_j|`` (the paper's shared-QK attention). The ``k`` argument is
   therefore *ignored* (only its shape is checked: self-attention, ``M == N``).
2. **Hash.** Angular LSH with random rotations ``R (D, n_buckets/2)``:
   ``bucket(x) = argmax([x R ; -x R])``, drawn independently for each of ``n_hashes``
   rounds. ``n_buckets`` (even) defaults to ``N // bucket_size`` (1 when that is < 2).
3. **Sort** positions by ``(bucket, position)``, cut the sorted order into chunks of
   ``bucket_size``; each query attends the keys of its chunk and of the previous
   chunk (look-one-back; the first chunk has none, there is no wrap-around).
4. **No attention to self** unless nothing else is available: the self score is set
   to ``self_score`` (-1e5 as in the paper), not -inf.
5. **Causal** (``causal=True`` or a user mask that is exactly ``causal()``): pairs are
   masked by their *original* positions (key position <= query position).
6. **Undo the sort** and **combine the rounds** by their log-sum-exp weights:
   ``out = sum_r exp(lse_r) o_r / sum_r exp(lse_r)``. With ``dedup=True`` (default)
   a key that falls into a query's chunks in ``c`` rounds has ``log c`` subtracted
   from its score, so the result is *exactly* softmax attention over the union of the
   keys the rounds found (each once) - more rounds can only add keys.

Randomness: the rotations come from a CPU ``torch.Generator`` seeded with ``seed``
on every forward (deterministic, same on every device); with ``redraw=True`` each
training-mode forward advances the seed by one (fresh hashes per step, still
reproducible from ``seed``).

Masks: key-only masks (``padding``, ``key_mask``), also inside ``&``, mark positions
as padding: they are sorted after every real position (so chunk boundaries of the
real tokens do not depend on how much padding follows: a padded batch equals its
sequences run one by one, given a fixed ``n_buckets``) and never attended. Any other
mask is evaluated on the attended (query, key) pairs. No bias.

Computation: the sorted chunks of every round are folded into the head dimension
(``(BH, R*nc, c, D)``) and one call of the fused block op
(:func:`attnlab.exact.tiles.attend_block`) attends each chunk to itself and the chunk
before, read as a strided view of the sorted keys (not copied); the rounds are merged
by log-sum-exp and the backward is the fused backward given the merged ``out`` and
``lse``, so no score matrix is kept. Deduplication masks a pair in every round after
the first that found it (the same union as ``-log(count)``, from byte comparisons of
chunk ids). Measured against ``reformer_pytorch.LSHAttention`` (bucket 64, 4 hashes)
by ``scripts/reformer_vs_peer.py``. The readable path (scores of every chunk in memory,
autograd through them) serves ``return_weights=True`` and a ``self_score`` above -1e4,
and is what the fused path is tested against.

Time O(B H R N (bs D + log N)) with ``R = n_hashes``, ``bs = bucket_size``
(plus O(B H R^2 N bs) byte comparisons for ``dedup``); memory O(B H R N bs) for the
mask tile (O(R N bs) without per-pair masks or ``dedup``), O(B H R N D) besides.
Shape legend: B batch, H heads, N positions (= M), D head dim, Dv value dim,
R rounds, c = bucket_size (chunk length), nc chunks, kb keys per chunk (c or 2c).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from ..exact.call import check_qkv
from ..exact.tiles import attend_block, attend_block_backward
from ..masks import Mask, as_mask, conjuncts
from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism
from .blockwise import Band


def split_key_mask(mask: Mask | None, B: int, N: int, device) -> tuple[Tensor | None, Mask | None]:
    """Split ``mask`` into a key-only part ``keep (B, N)`` and the rest (``mask == keep & rest``)."""
    if mask is None:
        return None, None
    keep: Tensor | None = None
    rest: Mask | None = None
    for part in conjuncts(mask):
        if part.depends <= {"b", "k"}:
            k = part.dense(N, N, device=device, batch=B)[:, 0, 0, :]  # (B|1, N)
            keep = k if keep is None else keep & k
        else:
            rest = part if rest is None else rest & part
    return (None if keep is None else keep.expand(B, N)), rest


def lsh_sort(buckets: Tensor, n_buckets: int, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Sort positions by ``(bucket, position)``, padding (``keep == False``) last.

    Args:
        buckets: ``(..., N)`` integer bucket ids in ``[0, n_buckets)``.
        keep: bool broadcastable to ``buckets`` (False = padding) or None.

    Returns:
        ``sorted_pos (..., N)`` (the position at each sorted slot) and its inverse
        ``inv (..., N)`` (the sorted slot of each position): ``x[sorted_pos][inv] == x``.
    """
    n = buckets.shape[-1]
    pos = torch.arange(n, device=buckets.device)
    if keep is not None:
        buckets = torch.where(keep, buckets, n_buckets)  # padding after every bucket
    sorted_pos = torch.sort(buckets * n + pos, dim=-1).indices  # (..., N)
    inv = torch.empty_like(sorted_pos).scatter_(-1, sorted_pos, pos.expand_as(sorted_pos))  # (..., N)
    return sorted_pos, inv


def _rows(x: Tensor, idx: Tensor) -> Tensor:
    """``x (BH, L, F)`` gathered at row indices ``idx (BH, *S)`` -> ``(BH, *S, F)``."""
    bh, length, f = x.shape
    flat = idx.reshape(bh, -1) + torch.arange(bh, device=x.device).view(-1, 1) * length  # (BH, S)
    return x.reshape(bh * length, f).index_select(0, flat.reshape(-1)).view(*idx.shape, f)



def _user_allowed(rest: Mask, B: int, H: int, N: int, qp: Tensor, kp: Tensor) -> Tensor:
    """The caller's mask at sorted positions: ``(B*H, R, nc, c, w)`` from ``qp (B*H, R, nc, c, 1)``, ``kp (..., 1, w)``.

    Padded slots (position -1) are clamped to a real position; the callers mask them out themselves.
    """
    R, nc, c = qp.shape[1], qp.shape[2], qp.shape[3]
    dev = qp.device
    bidx = torch.arange(B, device=dev).view(B, 1, 1, 1, 1, 1)
    hidx = torch.arange(H, device=dev).view(1, H, 1, 1, 1, 1)
    u = rest.allows(bidx, hidx, qp.clamp(0, N - 1).view(B, H, R, nc, c, 1),
                    kp.clamp(0, N - 1).view(B, H, R, nc, 1, -1), N, N)  # (B|1, H|1, R, nc, c, w)
    return u.expand(B, H, *u.shape[2:]).reshape(B * H, R, nc, c, -1)

def _fused_tile(sorted_pos: Tensor, inv: Tensor, keep_bh: Tensor | None, rest: Mask | None, is_causal: bool,
                B: int, H: int, c: int, dedup: bool,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Additive score tile ``(BH|1, R*nc, c, 2c)`` of the fused path (0 where a query may attend a
    key, ``finfo.min / 2`` elsewhere, its own key included) and whether each position may attend
    itself ``(BH|1, Np)`` in sorted round-0 order.

    The own key is masked here because a self score of -1e4 or less never survives beside
    another key (``exp`` underflows to 0 in float32 and float64 alike) and only matters when a
    query has nothing else in any round: the caller then returns its value. As an additive
    score it would make such rows' log-sum-exp about -1e5, where float32 keeps only 2 decimals
    and the rounds' weights stop summing to 1.

    Key slots ``0..c-1`` of a chunk's tile are the chunk before it, ``c..2c-1`` the chunk itself;
    chunk 0 of every round has no chunk before it. Deduplication keeps a pair only in the first
    round that finds it (later rounds mask it): each found key then counts once in the merged
    softmax, the same union as subtracting ``log(count)`` in every round, with half the
    comparisons (rounds ``r' < r`` only) and no per-pair float count.
    """
    BH, R, N = sorted_pos.shape
    nc = math.ceil(N / c)
    dev = sorted_pos.device
    spos = F.pad(sorted_pos, (0, nc * c - N), value=N)  # (BH, R, Np); N = empty slot
    qpos = spos.view(BH, R, nc, c)  # (BH, R, nc, c)
    kpos = torch.cat([F.pad(qpos[:, :, :-1], (0, 0, 1, 0), value=-1), qpos], -1)  # (BH, R, nc, 2c)
    if keep_bh is None:  # empty slots and missing chunks sit at the same slots in every head
        allowed = ((kpos[:1] >= 0) & (kpos[:1] < N)).unsqueeze(-2)  # (1, R, nc, 1, 2c)
    else:
        kvalid = (kpos >= 0) & F.pad(keep_bh.squeeze(1), (0, 1), value=False).gather(
            -1, kpos.masked_fill(kpos < 0, N).view(BH, -1)).view(kpos.shape)  # (BH, R, nc, 2c)
        allowed = kvalid.unsqueeze(-2)  # (BH, R, nc, 1, 2c)
    qp, kp = qpos.unsqueeze(-1), kpos.unsqueeze(-2)  # (BH, R, nc, c, 1), (BH, R, nc, 1, 2c)
    if is_causal:
        allowed = allowed & (kp <= qp)
    if rest is not None:
        allowed = allowed & _user_allowed(rest, B, H, N, qp, kp)
    if dedup and R > 1:
        chunk = torch.div(inv, c, rounding_mode="floor")  # (BH, R, N) chunk of each position in each round
        if nc <= 128:
            # bytes: differences of chunk ids below 128 wrap mod 256 onto {0, 1} only when they are 0 or 1
            # (empty slots get 200, never adjacent to a real chunk), so one unsigned compare tests adjacency
            chunk_of = F.pad(chunk, (0, 1), value=200).to(torch.uint8)  # (BH, R, N+1)
        else:
            chunk_of = F.pad(chunk, (0, 1), value=-5).to(torch.int16 if nc < 2**14 else torch.int32)
        allowed = allowed.expand(BH, R, nc, c, 2 * c).clone()  # (BH, R, nc, c, 2c)
        for r0 in range(R - 1):
            # round r0's chunk of every slot of the later rounds; a key slot's id is its chunk's
            # query slot id (the band: the chunk before, then the chunk itself)
            cq = chunk_of[:, r0].gather(-1, spos[:, r0 + 1 :].reshape(BH, -1)).view(BH, R - 1 - r0, nc, c)
            ck = torch.cat([F.pad(cq[:, :, :-1], (0, 0, 1, 0), value=200 if nc <= 128 else -5), cq], -1)
            d = cq.unsqueeze(-1) - ck.unsqueeze(-2)  # (BH, R-1-r0, nc, c, 2c)
            # round r0 paired them already (the key was in the query's chunk or the one before): mask
            apart = d > 1 if d.dtype == torch.uint8 else d.bitwise_and_(-2) != 0
            allowed[:, r0 + 1 :].logical_and_(apart)
    # the query's own key: chunk slot r, key slot c + r (round 0 is never deduplicated)
    is_self = torch.arange(c, device=dev).view(-1, 1) + c == torch.arange(2 * c, device=dev)  # (c, 2c)
    a0 = allowed[:, 0].expand(*allowed.shape[:1], nc, c, 2 * c)  # (BH|1, nc, c, 2c)
    self_ok = a0.diagonal(offset=c, dim1=-2, dim2=-1).reshape(a0.shape[0], nc * c)  # (BH|1, Np)
    allowed = allowed & ~is_self
    # a finite "never" (exp underflows to exactly 0 beside any allowed key) instead of -inf: the
    # fused call then need not scan this (BH, R*nc, c, 2c) tile for rows with no key, twice per
    # step; such a row's lse comes out near the "never" value, which the caller turns into -inf
    tile = torch.where(allowed, torch.zeros((), dtype=dtype, device=dev), torch.finfo(dtype).min / 2)
    return tile.view(tile.shape[0], R * nc, c, 2 * c), self_ok


def _sorted(x: Tensor, flat: Tensor, lead: int = 0) -> Tensor:
    """Rows of ``x (BH, N, F)`` at slots ``flat (BH, S)`` (``N`` = empty slot, a zero row): ``(BH, S, F)``.

    With ``lead`` the result is the tail of a buffer that starts with ``lead`` zero rows, so a view
    may reach ``lead`` rows before head 0's first slot (the chunk before chunk 0, which is masked).
    """
    BH, N, F_ = x.shape
    if bool((flat == N).any()):
        x = F.pad(x, (0, 0, 0, 1))  # (BH, N+1, F) the empty slots' zero row
    idx = (flat + torch.arange(BH, device=x.device).view(-1, 1) * x.shape[1]).reshape(-1)  # (BH*S,)
    buf = x.new_empty(lead * F_ + idx.numel() * F_)
    buf[: lead * F_].zero_()
    out = buf[lead * F_ :].view(BH, -1, F_)  # (BH, S, F)
    torch.index_select(x.reshape(-1, F_), 0, idx, out=out.view(-1, F_))
    return out


class _LSHChunksFn(torch.autograd.Function):
    """Shared-QK attention of every sorted chunk over itself and the chunk before, all rounds in
    one fused call (:func:`attnlab.exact.tiles.attend_block`), rounds merged by log-sum-exp.

    Chunks are folded into the head dimension (``(BH, R*nc, c, D)``); the ``2c`` keys of chunk
    ``j`` (chunk ``j-1`` and ``j`` of the sorted, normalized queries) are a strided view
    (:class:`attnlab.mechanisms.blockwise.Band`), never copied. No score matrix is kept: the
    backward is the fused backward given the merged ``out`` and ``lse``.
    """

    @staticmethod
    def forward(ctx, x, vx, spos, inv, tile, alone_ok, c, scale):
        BH, N, D = x.shape
        R, Np = spos.shape[1], spos.shape[2]
        nc = Np // c
        flat = spos.reshape(BH, R * Np)  # (BH, R*Np) position of each sorted slot; N = empty
        xs = _sorted(x, flat)  # (BH, R*Np, D) sorted queries
        ks = torch.empty(c * D + xs.numel(), dtype=x.dtype, device=x.device)
        ks[: c * D].zero_()  # chunk 0's (masked) chunk before
        ks = ks[c * D :].view(BH, R * Np, D)  # (BH, R*Np, D)
        torch.div(xs, torch.linalg.vector_norm(xs, dim=-1, keepdim=True).clamp_min_(1e-12), out=ks)
        vs = _sorted(vx, flat, lead=c)  # (BH, R*Np, Dv)
        band = Band(-1, 2)
        o, lse = attend_block(xs.view(BH, R * nc, c, D), band.keys(ks, c, R * nc, 0), band.keys(vs, c, R * nc, 0),
                              bias_tile=tile, scale=scale)  # (BH, R*nc, c, Dv), (BH, R*nc, c)
        # rows that may attend no key of their chunks (all "never"): lse near finfo.min / 2, not -inf
        lse = lse.masked_fill(lse < torch.finfo(tile.dtype).min / 4, float("-inf"))
        # undo the sort: position p of round r sits at row r*Np + inv[r, p]
        rows = (inv + torch.arange(R, device=x.device).view(1, R, 1) * Np).reshape(BH, R * N)  # (BH, R*N)
        o_un = _rows(o.reshape(BH, R * Np, -1), rows).view(BH, R, N, -1)  # (BH, R, N, Dv)
        l_un = lse.reshape(BH, R * Np).gather(1, rows).view(BH, R, N)  # (BH, R, N)
        l_all = torch.logsumexp(l_un, dim=1)  # (BH, N); -inf where every round is empty
        w = torch.exp(l_un - l_all.masked_fill(torch.isneginf(l_all), 0.0).unsqueeze(1))  # (BH, R, N)
        out = (w.unsqueeze(-1) * o_un).sum(1).to(x.dtype)  # (BH, N, Dv)
        # a query that found no other key in any round attends its own key alone: its value
        alone = torch.isneginf(l_all) & alone_ok  # (BH, N)
        out = torch.where(alone.unsqueeze(-1), vx, out)
        ctx.save_for_backward(xs, ks, vs, tile, out, l_all, flat, rows, alone)
        ctx.sizes = (c, nc, R, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        xs, ks, vs, tile, out, l_all, flat, rows, alone = ctx.saved_tensors
        c, nc, R, scale = ctx.sizes
        BH, _, D = xs.shape
        N = out.shape[1]
        Dv = vs.shape[-1]
        # every sorted slot gets its position's merged out, lse and output gradient (empty slots: 0, -inf)
        out_s = _sorted(out, flat).view(BH, R * nc, c, Dv)
        do_s = _sorted(dout.contiguous(), flat).view(BH, R * nc, c, Dv)
        lse_s = F.pad(l_all, (0, 1), value=float("-inf")).gather(1, flat).view(BH, R * nc, c)
        band = Band(-1, 2)
        dq, dkb, dvb = attend_block_backward(do_s, xs.view(BH, R * nc, c, D), band.keys(ks, c, R * nc, 0),
                                             band.keys(vs, c, R * nc, 0), out_s, lse_s, bias_tile=tile, scale=scale)
        # chunk j's keys are chunks j-1 and j: fold the two halves back (chunk 0's first half is masked)
        dk = dkb[:, :, c:].contiguous()  # (BH, R*nc, c, D)
        dk[:, :-1] += dkb[:, 1:, :c]
        dv = dvb[:, :, c:].contiguous()  # (BH, R*nc, c, Dv)
        dv[:, :-1] += dvb[:, 1:, :c]
        dk = dk.view(BH, -1, D)  # (BH, R*Np, D)
        # through k = x / |x|: the part of dk along x vanishes
        norm = torch.linalg.vector_norm(xs, dim=-1, keepdim=True).clamp_min_(1e-12)
        dxs = dq.reshape(BH, -1, D) + (dk - ks * (ks * dk).sum(-1, keepdim=True)) / norm  # (BH, R*Np, D)
        # undo the sort: each position collects its slot of every round
        dx = _rows(dxs, rows).view(BH, R, N, D).sum(1)  # (BH, N, D)
        dvx = _rows(dv.view(BH, -1, Dv), rows).view(BH, R, N, Dv).sum(1)  # (BH, N, Dv)
        dvx = dvx + dout * alone.unsqueeze(-1)  # the lone self-attending queries copied their value
        return dx, dvx, None, None, None, None, None, None


@dataclass
class _LSHCall:
    """One call's sizes, inputs and bucket sort (what both of Reformer's paths start from)."""

    B: int
    H: int
    N: int
    R: int  # hashing rounds
    c: int  # chunk length
    nc: int  # chunks
    scale: float
    x: Tensor  # (BH, N, D) queries, which are the keys too
    vx: Tensor  # (BH, N, Dv)
    keep: Tensor | None  # (B, N) key padding, or None
    rest: Mask | None  # the rest of the caller's mask
    is_causal: bool
    keep_bh: Tensor | None  # (BH, 1, N)
    sorted_pos: Tensor  # (BH, R, N) the positions in bucket order, per round
    inv: Tensor  # (BH, R, N) each position's slot in that order

    @property
    def spos(self) -> Tensor:
        """``sorted_pos`` padded to whole chunks with the empty slot ``N``: ``(BH, R, nc * c)``."""
        return F.pad(self.sorted_pos, (0, self.nc * self.c - self.N), value=self.N)


@dataclass
class _ChunkPattern:
    """Which (query, key) pairs of each chunk attend, in sorted positions (the readable path)."""

    qpos: Tensor  # (BH, R, nc, c)
    kpos: Tensor  # (BH, R, nc, kb) the chunk and the one before; -1 where there is none
    qp: Tensor  # (BH, R, nc, c, 1)
    kp: Tensor  # (BH, R, nc, 1, kb)
    allowed: Tensor  # (BH, R, nc, c|1, kb)
    is_self: Tensor  # (c, kb)
    addend: Tensor | None  # additive score term: -log(rounds a pair meets in), -inf where not allowed
    row_empty: Tensor | None  # (BH, R, nc, c|1, 1) rows with nothing to attend
    p: Tensor | None = None  # (BH, R, nc, c, kb) the softmax, once computed


def _round_counts(call: _LSHCall, qpos: Tensor, kpos: Tensor, lookback: bool) -> Tensor:
    """In how many rounds each (query, key) pair falls in the query's chunk or the one before: ``(BH, R, nc, c, kb)``."""
    BH, R, nc, c, kb = call.B * call.H, call.R, call.nc, call.c, kpos.shape[-1]
    chunk_of = F.pad(torch.div(call.inv, c, rounding_mode="floor"), (0, 1), value=-5).int()  # (BH, R, N+1)
    qi, ki = qpos.reshape(BH, R, -1), kpos.clamp(min=0).reshape(BH, R, -1)
    count = torch.ones((BH, R, nc, c, kb), dtype=torch.int32, device=call.x.device)  # its own round
    for d in range(1, R):
        other = chunk_of.roll(-d, dims=1)  # round (r + d) % R
        cq = other.gather(-1, qi).view(BH, R, nc, c, 1)
        ck = other.gather(-1, ki).view(BH, R, nc, 1, kb)
        diff = cq - ck  # (BH, R, nc, c, kb)
        count += ((diff & -2) == 0) if lookback else (diff == 0)  # diff in {0, 1} / diff == 0
    return count


def _combine_rounds(call: _LSHCall, o: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """Undo the sort and merge the rounds by their log-sum-exp: ``out (B, H, N, Dv)``, round weights ``(BH, R, N, 1)``."""
    BH, R, Np = call.B * call.H, call.R, call.nc * call.c
    rows = call.inv + torch.arange(R, device=o.device).view(1, R, 1) * Np  # (BH, R, N) rows of the sorted layout
    o_un = _rows(o.reshape(BH, R * Np, -1), rows)  # (BH, R, N, Dv)
    lse_un = _rows(lse.reshape(BH, R * Np, 1), rows)  # (BH, R, N, 1)
    mx = lse_un.detach().amax(1, keepdim=True)  # (BH, 1, N, 1)
    none = mx == float("-inf")
    w = torch.exp(lse_un - mx.masked_fill(none, 0.0))  # (BH, R, N, 1)
    wn = w / w.sum(1, keepdim=True).masked_fill(none, 1.0)  # (BH, R, N, 1) weight of each round
    return (wn * o_un).sum(1).view(call.B, call.H, call.N, -1), wn


def _dense_weights(call: _LSHCall, pat: _ChunkPattern, wn: Tensor) -> Tensor:
    """Each round's softmax times its round weight, scattered to ``(query, key)``: ``(B, H, N, N)``."""
    BH, R, N, nc, c = call.B * call.H, call.R, call.N, call.nc, call.c
    wq = torch.gather(F.pad(wn.squeeze(-1), (0, 1)), 2, call.spos).view(BH, R, nc, c, 1)  # (BH, R, nc, c, 1)
    vals = pat.p * wq  # (BH, R, nc, c, kb)
    idx = pat.qp.clamp(max=N) * (N + 1) + pat.kp.clamp(min=0, max=N).expand_as(vals)  # (BH, R, nc, c, kb)
    dense = torch.zeros(BH, (N + 1) * (N + 1), dtype=vals.dtype, device=vals.device)
    keep_pair = pat.allowed if pat.row_empty is None else pat.allowed & ~pat.row_empty
    dense = dense.scatter_add(1, idx.reshape(BH, -1), vals.masked_fill(~keep_pair, 0.0).reshape(BH, -1))
    return dense.view(BH, N + 1, N + 1)[:, :N, :N].reshape(call.B, call.H, N, N)  # (B, H, N, N)


@register_mechanism
class Reformer(Mechanism):
    """LSH self-attention with shared query/key (Reformer).

    Args:
        bucket_size: chunk length ``c`` (and the default bucket size) (64).
        n_hashes: hashing rounds ``R`` (2).
        n_buckets: even number of buckets, or None for ``N // bucket_size``.
        causal: autoregressive variant (mask by original positions).
        seed: seed of the random rotations.
        redraw: draw new rotations on every training-mode forward (seed + count).
        dedup: correct for keys found by several rounds (exact union semantics).
        self_score: score given to the query's own key (-1e5).
        scale: score multiplier (default ``1/sqrt(D)``).
    """

    name = "reformer"
    masks_supported = "any mask (key padding sorted to the end; others evaluated on attended pairs); no bias"
    exact = False
    padding_variant = "the number of buckets and the hash rotations depend on N, so a row alone is hashed differently"

    def __init__(
        self,
        bucket_size: int = 64,
        n_hashes: int = 2,
        n_buckets: int | None = None,
        causal: bool = False,
        seed: int = 0,
        redraw: bool = False,
        dedup: bool = True,
        self_score: float = -1e5,
        scale: float | None = None,
    ):
        super().__init__()
        positive_int(bucket_size, "reformer: bucket_size")
        positive_int(n_hashes, "reformer: n_hashes")
        if n_buckets is not None and (not isinstance(n_buckets, int) or n_buckets < 1 or (n_buckets > 1 and n_buckets % 2)):
            raise ValueError(f"reformer: n_buckets must be 1 or a positive even int (or None), got {n_buckets!r}")
        self.bucket_size, self.n_hashes, self.n_buckets = bucket_size, n_hashes, n_buckets
        self.causal, self.seed, self.redraw, self.dedup = bool(causal), int(seed), bool(redraw), bool(dedup)
        self.self_score, self.scale = float(self_score), scale
        self._draws = 0

    def buckets_for(self, n: int) -> int:
        """Number of buckets used at sequence length ``n``."""
        if self.n_buckets is not None:
            return self.n_buckets
        nb = n // self.bucket_size
        return 1 if nb < 2 else nb - nb % 2

    def rotations(self, d: int, n_buckets: int, seed: int | None = None) -> Tensor:
        """Random rotations ``(D, R, n_buckets // 2)`` (float32, CPU) for ``seed`` (default: current)."""
        gen = torch.Generator(device="cpu").manual_seed(self.seed if seed is None else seed)
        return torch.randn(d, self.n_hashes, max(1, n_buckets // 2), generator=gen)

    def hash(self, x: Tensor, n_buckets: int, rot: Tensor) -> Tensor:
        """Bucket ids ``(BH, R, N)`` of ``x (BH, N, D)`` under rotations ``rot (D, R, n_buckets/2)``."""
        if n_buckets == 1:
            return torch.zeros(x.shape[0], self.n_hashes, x.shape[1], dtype=torch.long, device=x.device)
        proj = torch.einsum("bnd,drk->brnk", x, rot.to(x.device, x.dtype))  # (BH, R, N, nb/2)
        # argmax([proj, -proj]) without building the concatenation
        hi, ihi = proj.max(-1)
        lo, ilo = proj.min(-1)
        return torch.where(hi >= -lo, ihi, ilo + proj.shape[-1])  # (BH, R, N)

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        call = self._prepare(q, k, v, mask, bias)
        if not return_weights and self.self_score <= -1e4:
            return self._fused(call)  # (B, H, N, Dv)
        # the readable path (and the weights, and a self score above -1e4): scores of every chunk
        # in memory, autograd through them
        with torch.no_grad():
            pattern = self._pattern(call)
        o, lse = self._attend_chunks(call, pattern)  # (BH, R, nc, c, Dv), (BH, R, nc, c, 1)
        out, wn = _combine_rounds(call, o, lse)  # (B, H, N, Dv), (BH, R, N, 1)
        if not return_weights:
            return out
        return out, _dense_weights(call, pattern, wn)

    def _prepare(self, q, k, v, mask, bias) -> _LSHCall:
        """Check the call, hash and sort its positions into buckets: what both paths start from."""
        check_qkv(q, k, v, who="reformer")
        B, H, N, D = q.shape
        if k.shape[2] != N:
            raise ValueError(f"reformer: LSH attention is self-attention and needs M == N, got N={N}, M={k.shape[2]}")
        if bias is not None:
            raise ValueError("reformer: bias is not supported by LSH attention")
        keep, rest = split_key_mask(as_mask(mask, "mask"), B, N, q.device)
        is_causal = self.causal
        if rest is not None and rest.is_causal(N, N):
            is_causal, rest = True, None
        c = min(self.bucket_size, N)
        nc = math.ceil(N / c)
        nbk = self.buckets_for(N)
        seed = self.seed
        if self.redraw and self.training:
            seed, self._draws = self.seed + self._draws, self._draws + 1
        x = q.reshape(B * H, N, D)  # (BH, N, D)
        vx = v.repeat_interleave(H // v.shape[1], dim=1) if v.shape[1] != H else v
        vx = vx.reshape(B * H, N, v.shape[-1])  # (BH, N, Dv)
        with torch.no_grad():
            buckets = self.hash(x.detach(), nbk, self.rotations(D, nbk, seed))  # (BH, R, N)
            keep_bh = None
            if keep is not None:
                keep_bh = keep.to(q.device).repeat_interleave(H, dim=0).unsqueeze(1)  # (BH, 1, N)
            sorted_pos, inv = lsh_sort(buckets, nbk, keep_bh)  # (BH, R, N) each
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(D)
        return _LSHCall(B=B, H=H, N=N, R=self.n_hashes, c=c, nc=nc, scale=scale, x=x, vx=vx, keep=keep, rest=rest,
                        is_causal=is_causal, keep_bh=keep_bh, sorted_pos=sorted_pos, inv=inv)

    def _fused(self, call: _LSHCall) -> Tensor:
        """Every chunk through the fused per-block op (no weights): ``(B, H, N, Dv)``."""
        with torch.no_grad():
            tile, self_ok = _fused_tile(call.sorted_pos, call.inv, call.keep_bh, call.rest, call.is_causal, call.B,
                                        call.H, call.c, self.dedup, call.x.dtype)  # (BH|1, R*nc, c, 2c)
            # positions that may attend themselves (sorted round-0 slot of each position)
            alone_ok = self_ok.expand(call.B * call.H, -1).gather(1, call.inv[:, 0])  # (BH, N)
        out = _LSHChunksFn.apply(call.x, call.vx, call.spos, call.inv, tile, alone_ok, call.c, call.scale)  # (BH, N, Dv)
        return out.view(call.B, call.H, call.N, -1)  # (B, H, N, Dv)

    def _pattern(self, call: _LSHCall) -> _ChunkPattern:
        """Which (query, key) pairs of each chunk may attend, and the additive term of each score."""
        BH, R, N, c, nc, dev = call.B * call.H, call.R, call.N, call.c, call.nc, call.x.device
        qpos = call.spos.view(BH, R, nc, c)  # (BH, R, nc, c)
        lookback = nc > 1
        kpos = torch.cat([F.pad(qpos[:, :, :-1], (0, 0, 1, 0), value=-1), qpos], -1) if lookback else qpos
        kvalid = (kpos >= 0) & (kpos < N)  # (BH, R, nc, kb)
        if call.keep is not None:
            kvalid &= F.pad(call.keep_bh.squeeze(1), (0, 1), value=False).gather(
                -1, kpos.clamp(min=0).view(BH, -1)).view(kpos.shape)
        allowed = kvalid.unsqueeze(-2)  # (BH, R, nc, 1, kb)
        qp, kp = qpos.unsqueeze(-1), kpos.unsqueeze(-2)  # (BH, R, nc, c, 1), (BH, R, nc, 1, kb)
        if call.is_causal:
            allowed = allowed & (kp <= qp)
        if call.rest is not None:
            allowed = allowed & _user_allowed(call.rest, call.B, call.H, N, qp, kp)
        kb = kpos.shape[-1]
        # the query's own key sits on a fixed diagonal of the (c, kb) chunk tile
        is_self = torch.arange(c, device=dev).view(-1, 1) + (c if lookback else 0) == torch.arange(kb, device=dev)
        addend = None  # additive score term (BH, R, nc, c|1, kb): -log(count) or -inf
        if self.dedup and R > 1:
            addend = torch.log(_round_counts(call, qpos, kpos, lookback).to(call.x.dtype)).neg_()
        row_empty = None
        if not bool(allowed.all()):
            row_empty = ~allowed.any(-1, keepdim=True)  # (BH, R, nc, c|1, 1) nothing to attend
            addend = torch.zeros((), dtype=call.x.dtype, device=dev) if addend is None else addend
            # empty rows are computed over every slot, then given zero weight below
            addend = torch.where(allowed | row_empty, addend, float("-inf"))
        return _ChunkPattern(qpos=qpos, kpos=kpos, qp=qp, kp=kp, allowed=allowed, is_self=is_self, addend=addend,
                             row_empty=row_empty)

    def _attend_chunks(self, call: _LSHCall, pat: _ChunkPattern) -> tuple[Tensor, Tensor]:
        """Softmax attention inside each chunk (and the one before): ``o (BH, R, nc, c, Dv)``, ``lse (.., 1)``."""
        N = call.N
        # gather queries, keys (the normalized queries) and values straight into chunk layout;
        # row N is a zero row that empty slots (and chunk 0's missing look-back) read
        kidx = pat.kpos.masked_fill(pat.kpos < 0, N)  # (BH, R, nc, kb)
        qc = _rows(F.pad(call.x, (0, 0, 0, 1)), pat.qpos)  # (BH, R, nc, c, D)
        kc = _rows(F.pad(F.normalize(call.x, dim=-1), (0, 0, 0, 1)), kidx)  # (BH, R, nc, kb, D)
        vc = _rows(F.pad(call.vx, (0, 0, 0, 1)), kidx)  # (BH, R, nc, kb, Dv)
        s = torch.matmul(qc * call.scale, kc.transpose(-1, -2))  # (BH, R, nc, c, kb)
        s.masked_fill_(pat.is_self, self.self_score)  # in place: matmul's backward does not need s
        if pat.addend is not None:
            s.add_(pat.addend)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (BH, R, nc, c, 1)
        pat.p = torch.softmax(s, dim=-1)  # (BH, R, nc, c, kb)
        o = torch.matmul(pat.p, vc)  # (BH, R, nc, c, Dv)
        if pat.row_empty is not None:
            lse = lse.masked_fill(pat.row_empty, float("-inf"))
        return o, lse

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for self-attention (M == N) under any valid mask, without bias; else the reason."""
        why = reason(check_qkv, q, k, v, who="reformer") or super().supports(q, k, v, mask)
        if why is None and k.shape[2] != q.shape[2]:
            why = f"reformer: LSH attention is self-attention and needs M == N, got N={q.shape[2]}, M={k.shape[2]}"
        if why is None and bias is not None:
            why = "reformer: bias is not supported by LSH attention"
        return why

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"bucket_size": max(4, n // 32), "n_hashes": 2, "seed": 0}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        n, R = n_queries, self.n_hashes
        c = min(self.bucket_size, n)
        kb = c * (2 if n > c else 1)
        nb = self.buckets_for(n)
        hash_flops = 2.0 * n * head_dim * R * max(1, nb // 2)
        sort_flops = R * n * max(1.0, math.log2(max(n, 2)))
        attn_flops = 2.0 * R * n * kb * 2 * head_dim
        flops = batch * heads * (hash_flops + sort_flops + attn_flops)
        mem = 4.0 * batch * heads * R * n * (kb * 3 + 3 * head_dim)
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return (f"bucket_size={self.bucket_size}, n_hashes={self.n_hashes}, n_buckets={self.n_buckets}, "
                f"causal={self.causal}, seed={self.seed}, redraw={self.redraw}, dedup={self.dedup}")
