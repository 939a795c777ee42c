"""Local (block) attention: each query block attends only within its own key block.

Block-local self-attention as used in the Image Transformer (Parmar et al., 2018,
"Image Transformer") and the local attention of Liu et al., 2018 ("Generating
Wikipedia by Summarizing Long Sequences"). The sequence is cut into non-overlapping
blocks of ``block_size`` positions; a query attends

* ``overlap=False``: the keys of its own block;
* ``overlap=True`` (half-overlapping windows): the keys of its own block and of the
  previous block (block 0 has no previous block);

optionally only keys at or before its own position (``causal=True``). The query
blocks are folded into the head dimension (``(B*H, nb, bs, D)``) and one fused call
(:mod:`attnlab.mechanisms.blockwise`) attends each to its keys, a strided view of the
key sequence (the previous block is not copied); the backward is the fused backward,
so no score matrix is kept (1.9x the old batched-SDPA forward, 1.15x fwd+bwd at
N=4096, block 256). Time O(B H N bs D) (twice that with ``overlap``), memory
O(B H N D) - linear in the sequence length. A ragged last block is padded and the
padded keys are masked, so the result is exactly attention under the dense mask
:meth:`Local.pattern` (tested against it).

Positions: with ``N < M`` (decoding against a longer key sequence) the queries are
the last ``N`` positions (bottom-right alignment, as everywhere in attnlab); blocks
are cut on positions. ``N > M`` raises ValueError.

Masks: any :mod:`attnlab.masks` mask, applied on top of the block pattern (evaluated
only on the in-block index pairs). Grouped-query heads: key/value heads are repeated.
No score bias, no weights (``return_weights=True`` raises ValueError).

Shape legend: B batch, H query heads, Hkv key/value heads, N queries, M keys, D head
dim, Dv value dim, bs block size, nb number of blocks, kb keys per block (bs or 2 bs).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from ..exact import attention
from ..exact.call import check_qkv
from ..masks import Mask, as_mask, dense
from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism
from .blockwise import Band, BlockPlan, Shared, Table, block_sparse_attention


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """Repeat key/value heads ``(B, Hkv, M, D) -> (B, H, M, D)`` (query head h reads kv head h // G)."""
    g = heads // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)  # (B, H, M, D)


def mask_on_pairs(mask: Mask, B: int, H: int, qidx: Tensor, kidx: Tensor, n_q: int, n_k: int) -> Tensor:
    """Evaluate ``mask`` on gathered index pairs.

    Args:
        qidx, kidx: integer tensors of query indices (``0..n_q-1``) and key indices
            (``0..n_k-1``) that broadcast together (leading dims are free, e.g.
            ``(nb, bs, 1)`` and ``(nb, 1, kb)``); out-of-range entries are clamped, so
            the caller must mask them itself.

    Returns:
        bool tensor ``(B|1, H|1, *broadcast(qidx, kidx).shape)``.
    """
    extra = max(qidx.ndim, kidx.ndim)
    dev = qidx.device
    nb_ = B if "b" in mask.depends else 1
    nh_ = H if "h" in mask.depends else 1
    b = torch.arange(nb_, device=dev).view(-1, *([1] * (extra + 1)))
    h = torch.arange(nh_, device=dev).view(1, -1, *([1] * extra))
    qi = qidx.clamp(0, n_q - 1).view(1, 1, *qidx.shape)
    ki = kidx.clamp(0, n_k - 1).view(1, 1, *kidx.shape)
    return mask.allows(b, h, qi, ki, n_q, n_k)


def check_block_settings(name: str, backend: str, dropout: float) -> None:
    """Validate the ``backend`` (``auto``, ``gather`` or an exact backend's name) and ``dropout`` of a
    block-sparse mechanism with a ``backend`` setting (Longformer, BigBird).

    Raises:
        ValueError: an unknown backend, or ``dropout`` outside ``[0, 1)``.
    """
    from ..exact.registry import get_backend

    if backend not in ("auto", "gather"):
        get_backend(backend)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{name}: dropout must be in [0, 1), got {dropout!r}")


def _gather_serves(mech: Mechanism, q: Tensor, k: Tensor, bias, return_weights: bool) -> bool:
    """The block kernel serves self-attention without bias, dropout (in training) or weights."""
    dropout = mech.dropout if mech.training else 0.0
    return q.shape[2] == k.shape[2] and bias is None and dropout == 0.0 and not return_weights


def block_mechanism_reason(mech: Mechanism, name: str, q: Tensor, k: Tensor, v: Tensor, mask=None, *,
                           bias=None, return_weights: bool = False) -> str | None:
    """``supports`` of a block-sparse mechanism with a ``backend`` setting (Longformer, BigBird).

    Its ``gather`` backend serves self-attention without bias, dropout or weights; an exact
    backend named outright answers for itself; ``auto`` serves every valid call.
    """
    from ..exact import make_call
    from ..exact.registry import get_backend

    why = reason(check_qkv, q, k, v, who=name) or Mechanism.supports(mech, q, k, v, mask, bias=bias)
    if why is None and mech.backend == "gather" and not _gather_serves(mech, q, k, bias, return_weights):
        why = f"{name}: backend 'gather' needs N == M, no bias, no dropout and no weights; use an exact backend"
    if why is None and mech.backend not in ("auto", "gather"):
        why = get_backend(mech.backend).verdict(make_call(q, k, v, mask=mask, bias=bias, return_weights=return_weights))
    return why


def block_route(mech: Mechanism, name: str, q: Tensor, k: Tensor, v: Tensor, full: Mask, *, bias=None,
                return_weights: bool = False) -> str:
    """The path a call of a block-sparse mechanism with a ``backend`` setting (Longformer, BigBird) takes
    under ``full`` (its pattern & the user's mask).

    Returns:
        ``"native"`` (backend ``auto`` and the native kernel serves the call: :func:`native_serves`),
        ``"gather"`` (backend ``auto`` or ``gather`` and the block kernel serves it: self-attention,
        no bias, no dropout, no weights) or ``"exact"`` (:func:`attnlab.attention`).

    Raises:
        ValueError: backend ``gather`` on a call the block kernel cannot serve.
    """
    dropout = mech.dropout if mech.training else 0.0
    if mech.backend == "auto" and native_serves(q, k, v, full, bias=bias, dropout_p=dropout,
                                                return_weights=return_weights):
        return "native"
    if mech.backend in ("auto", "gather") and _gather_serves(mech, q, k, bias, return_weights):
        return "gather"
    if mech.backend == "gather":
        raise ValueError(f"{name}: backend 'gather' needs N == M, no bias, no dropout and no weights; "
                         "use an exact backend ('auto' picks one)")
    return "exact"


def native_serves(q: Tensor, k: Tensor, v: Tensor, pattern: Mask, *, bias=None, dropout_p: float = 0.0,
                  return_weights: bool = False) -> bool:
    """True when attnlab's native CPU kernel computes exact attention under ``pattern`` as one call.

    The block-sparse mechanisms then run that call (the kernel walks only the pattern's tiles,
    its row intervals or bit tiles) instead of gathering key blocks: at N=4096, B=1, H=8, D=64
    fwd+bwd on a 2-core CPU it measured 1.3x Longformer's band-and-globals path (window 256,
    one global), 5x BigBird's gathered blocks (block 64) and 1.3x Local's folded blocks (128).
    """
    from ..exact import make_call, native

    if return_weights or dropout_p > 0:
        return False
    return native.call_reason(make_call(q, k, v, mask=pattern, bias=bias)) is None


def block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_blocks: Tensor,
    block_size: int,
    allowed: Mask,
    *,
    extra_keys: Tensor | None = None,
    dense_rows: Tensor | None = None,
    scale: float | None = None,
    fused: bool = True,
) -> Tensor:
    """Exact attention under ``allowed`` when every allowed key of query block ``i`` lies in
    the key blocks ``key_blocks[i]`` or among ``extra_keys`` (the block-sparse kernel).

    Positions are cut into blocks of ``block_size`` (``bs``). Square self-attention (``N == M``).
    Two paths compute the blocks, with the same result (tested against each other):

    * ``fused=False``, the readable one: for each query block the listed key blocks are
      gathered into one ``(B*H, nb, L, D)`` tensor (``L = K bs + E``) and one batched SDPA
      call attends them under ``allowed`` evaluated on the gathered pairs (autograd through
      that call). Time O(B H N L D), memory O(B H N L).
    * ``fused=True``: query blocks are folded into the head dimension and each part of their
      keys is one call of the fused op (:mod:`attnlab.mechanisms.blockwise`): a band of
      consecutive key blocks is a strided view of the keys (no copy), any other table of
      blocks is gathered, and ``extra_keys`` are a third call merged by log-sum-exp. No score
      matrix is kept for the backward, which runs the fused backward per part.

    Args:
        q: ``(B, H, N, D)``; k: ``(B, Hkv, N, D)``; v: ``(B, Hkv, N, Dv)``.
        key_blocks: long ``(nb, K)`` key-block indices per query block, ``-1`` = none;
            a block must not be listed twice in a row.
        allowed: the full mask (pattern & user mask), evaluated only on gathered pairs.
        extra_keys: long ``(E,)`` key positions appended to every query block (e.g.
            global tokens); where one already lies in a listed block it is skipped.
        dense_rows: long ``(G,)`` query positions whose allowed keys are anywhere (global
            queries): computed by :func:`attnlab.attention` against all keys instead.
        fused: the fused path (else the gather-and-SDPA one).

    Returns:
        ``(B, H, N, Dv)``; rows with no allowed key are zeros.
    """
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    has_extra = extra_keys is not None and extra_keys.numel() > 0
    blocks = _fused_blocks if fused else _gathered_blocks
    out = blocks(q, k, v, key_blocks, block_size, allowed, extra_keys if has_extra else None, scale)  # (B, H, N, Dv)
    if dense_rows is not None and dense_rows.numel():
        B, H, N, _ = q.shape
        keys = torch.arange(N, device=q.device).view(1, -1)
        ok_rows = mask_on_pairs(allowed, B, H, dense_rows.view(-1, 1), keys, N, N)  # (B|1, H|1, G, N)
        rows_out = attention(q.index_select(2, dense_rows), k, v, mask=dense(ok_rows), scale=scale)  # (B, H, G, Dv)
        out = out.index_copy(2, dense_rows, rows_out)
    return out


def _block_pairs_ok(allowed: Mask, B: int, H: int, N: int, qpos: Tensor, kpos: Tensor, ok_keys: Tensor) -> Tensor:
    """``allowed`` (over ``N`` positions) on (query block rows ``qpos (nb, bs, 1)``, keys ``kpos (nb, L)``),
    and ``ok_keys (nb, L)``: ``(B*H|1, nb, bs, L)`` (one for every head when ``allowed`` varies by neither)."""
    ok = mask_on_pairs(allowed, B, H, qpos, kpos.unsqueeze(1), N, N) & ok_keys.unsqueeze(1)  # (B|1, H|1, nb, bs, L)
    if ok.shape[0] * ok.shape[1] > 1:
        ok = ok.expand(B, H, *ok.shape[2:])
    return ok.reshape(-1, *ok.shape[2:])  # (B*H|1, nb, bs, L)


def _block_keys(key_blocks: Tensor, bs: int, N: int) -> tuple[Tensor, Tensor]:
    """The key positions ``(nb, K*bs)`` of each query block's listed blocks, and which of them are real keys."""
    nb, K = key_blocks.shape
    kpos = (key_blocks.unsqueeze(-1) * bs + torch.arange(bs, device=key_blocks.device)).reshape(nb, K * bs)
    return kpos, (key_blocks >= 0).repeat_interleave(bs, dim=1) & (kpos < N)  # (nb, K*bs) each


def _gathered_blocks(q: Tensor, k: Tensor, v: Tensor, key_blocks: Tensor, bs: int, allowed: Mask,
                     extra_keys: Tensor | None, scale: float) -> Tensor:
    """:func:`block_attention`'s blocks by gathering keys and one batched SDPA call: ``(B, H, N, Dv)``."""
    B, H, N, D = q.shape
    nb = math.ceil(N / bs)
    pad = nb * bs - N
    qb = F.pad(q, (0, 0, 0, pad)).reshape(B * H, nb, bs, D)  # (B*H, nb, bs, D)
    K = key_blocks.shape[1]
    kpos, valid = _block_keys(key_blocks, bs, N)  # (nb, K*bs) each
    if extra_keys is not None:
        E = extra_keys.numel()
        listed = (key_blocks.unsqueeze(-1) == torch.div(extra_keys, bs, rounding_mode="floor")).any(1)  # (nb, E)
        kpos = torch.cat([kpos, extra_keys.expand(nb, E)], dim=1)  # (nb, L)
        valid = torch.cat([valid, ~listed], dim=1)  # (nb, L)
    L = kpos.shape[1]
    if L == K * bs:  # whole blocks only: gather blocks (invalid ones read block 0, masked below)
        blocks = key_blocks.clamp(min=0).reshape(-1)  # (nb*K,)
        kp = F.pad(repeat_kv(k, H), (0, 0, 0, pad)).reshape(B * H, nb, bs, D)  # (B*H, nb, bs, D)
        vp = F.pad(repeat_kv(v, H), (0, 0, 0, pad)).reshape(B * H, nb, bs, -1)  # (B*H, nb, bs, Dv)
        kg = kp.index_select(1, blocks).view(B * H, nb, L, D)  # (B*H, nb, L, D)
        vg = vp.index_select(1, blocks).view(B * H, nb, L, -1)  # (B*H, nb, L, Dv)
    else:  # gather positions (invalid slots read position 0, masked below)
        flat = torch.where(valid, kpos, 0).reshape(-1)  # (nb*L,)
        kg = repeat_kv(k, H).reshape(B * H, N, D).index_select(1, flat).view(B * H, nb, L, D)  # (B*H, nb, L, D)
        vg = repeat_kv(v, H).reshape(B * H, N, -1).index_select(1, flat).view(B * H, nb, L, -1)  # (B*H, nb, L, Dv)
    qpos = torch.arange(nb * bs, device=q.device).view(nb, bs, 1)  # (nb, bs, 1)
    ok = _block_pairs_ok(allowed, B, H, N, qpos, kpos, valid)  # (B*H|1, nb, bs, L)
    row_any = ok.any(-1, keepdim=True)  # (B*H|1, nb, bs, 1)
    out = F.scaled_dot_product_attention(qb, kg, vg, attn_mask=ok | ~row_any, scale=scale)  # (B*H, nb, bs, Dv)
    out = out * row_any.to(out.dtype)
    return out.reshape(B, H, nb * bs, -1)[:, :, :N]  # (B, H, N, Dv)


def _band_offset(key_blocks: Tensor, nb: int) -> int | None:
    """``lo`` when ``key_blocks[i] == i + lo + arange(K)`` (out-of-range entries -1): a sliding band; else None."""
    K = key_blocks.shape[1]
    i = torch.arange(nb, device=key_blocks.device).view(-1, 1)
    j = torch.arange(K, device=key_blocks.device).view(1, -1)
    listed = key_blocks >= 0
    if not bool(listed.any()):
        return None
    lo = int((key_blocks - i - j)[listed].min())
    want = i + j + lo
    return lo if torch.equal(want.masked_fill((want < 0) | (want >= nb), -1), key_blocks) else None


def _fused_blocks(q: Tensor, k: Tensor, v: Tensor, key_blocks: Tensor, bs: int, allowed: Mask,
                  extra_keys: Tensor | None, scale: float) -> Tensor:
    """:func:`block_attention`'s blocks by fused block calls, one per part of the keys: ``(B, H, N, Dv)``."""
    B, H, N, D = q.shape
    nb = math.ceil(N / bs)
    dev = q.device
    K = key_blocks.shape[1]
    lo = _band_offset(key_blocks, nb)
    qpos = torch.arange(nb * bs, device=dev).view(nb, bs, 1)  # (nb, bs, 1)
    if lo is not None:  # a band: a strided view of the keys, no copy
        part = Band(lo, K)
        kpos = ((torch.arange(nb, device=dev) + lo) * bs).view(nb, 1) + torch.arange(K * bs, device=dev)  # (nb, L)
        valid = (kpos >= 0) & (kpos < N)  # (nb, L)
    else:  # any other blocks: gathered
        part = Table(key_blocks.clamp(min=0))
        kpos, valid = _block_keys(key_blocks, bs, N)  # (nb, L) each
    parts, tiles = [part], [_block_pairs_ok(allowed, B, H, N, qpos, kpos, valid)]
    if extra_keys is not None:
        E = extra_keys.numel()
        # a global key already in one of the block's listed blocks is seen there, not twice
        listed = ((kpos.unsqueeze(-1) == extra_keys) & valid.unsqueeze(-1)).any(1)  # (nb, E)
        parts.append(Shared(extra_keys))
        tiles.append(_block_pairs_ok(allowed, B, H, N, qpos, extra_keys.view(1, E).expand(nb, E), ~listed))
    plan = BlockPlan(bs, nb, 0, parts, tiles, [False] * len(parts), scale)
    return block_sparse_attention(q.reshape(B * H, N, D), repeat_kv(k, H).reshape(B * H, N, D),
                                  repeat_kv(v, H).reshape(B * H, N, -1), plan).reshape(B, H, N, -1)  # (B, H, N, Dv)


@register_mechanism
class Local(Mechanism):
    """Block-local attention (non-overlapping or half-overlapping blocks).

    Args:
        block_size: positions per block (``bs``).
        overlap: also attend the previous block (half-overlapping windows of ``2 bs``).
        causal: only keys at or before the query's position.
        scale: score multiplier (default ``1/sqrt(D)``).
    """

    name = "local"
    masks_supported = "any mask (applied within the blocks); no bias"
    exact = False

    def __init__(self, block_size: int = 128, overlap: bool = False, causal: bool = False, scale: float | None = None):
        super().__init__()
        positive_int(block_size, "local: block_size")
        self.block_size = block_size
        self.overlap = bool(overlap)
        self.causal = bool(causal)
        self.scale = scale

    def pattern(self) -> Mask:
        """The mask this mechanism equals exact attention under (before the user's mask)."""
        return _BlockPattern(self.block_size, self.overlap, self.causal)

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        check_qkv(q, k, v, who="local")
        if bias is not None:
            raise ValueError("local: bias is not supported (use Exact or Longformer for score biases)")
        if return_weights:
            raise ValueError("local: return_weights=True is not supported (use Exact with mask=Local.pattern())")
        B, H, N, D = q.shape
        M = k.shape[2]
        if N > M:
            raise ValueError(f"local: needs N <= M (queries are the last N of M positions), got N={N}, M={M}")
        user = as_mask(mask, "mask")
        if user is not None:
            user.validate(q.shape[2], k.shape[2])  # lengths and indices against this call (as supports() says)
        full = self.pattern() if user is None else self.pattern() & user
        if native_serves(q, k, v, full):  # one call of the native kernel over the blocks' intervals
            return attention(q, k, v, mask=full, scale=self.scale, backend="native")
        bs = min(self.block_size, M)
        nb = math.ceil(M / bs)
        off = M - N  # query i sits at position i + off
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(D)
        dev = q.device
        # query block i sees key blocks i + lo .. i (its own, and the previous one with overlap)
        lo = -1 if self.overlap and nb > 1 else 0
        L = (1 - lo) * bs
        qpos = torch.arange(nb * bs, device=dev).view(nb, bs, 1)  # (nb, bs, 1)
        kpos = ((torch.arange(nb, device=dev) + lo) * bs).view(nb, 1, 1) + torch.arange(L, device=dev)  # (nb, 1, L)
        allowed = None  # broadcastable to (B*H, nb, bs, L); None = everything
        if lo or nb * bs > M:  # padding keys: before block 0's missing predecessor, after the last key
            allowed = ((kpos >= 0) & (kpos < M)).unsqueeze(0)  # (1, nb, 1, L)
        # without overlap the causal pattern is each block's top-left triangle, which the fused op
        # computes without reading a mask; with overlap it is a mask on the (bs, 2bs) tile
        tri = self.causal and lo == 0
        if self.causal and not tri:
            c = (kpos <= qpos).unsqueeze(0)  # (1, nb, bs, L)
            allowed = c if allowed is None else allowed & c
        if user is not None:
            u = mask_on_pairs(user, B, H, qpos - off, kpos, N, M)  # (B|1, H|1, nb, bs, L)
            if u.shape[0] * u.shape[1] > 1:
                u = u.expand(B, H, *u.shape[2:])
            u = u.reshape(-1, *u.shape[2:])  # (B*H|1, nb, bs, L)
            allowed = u if allowed is None else allowed & u
        plan = BlockPlan(bs, nb, off, [Band(lo, 1 - lo)], [allowed], [tri], scale)
        out = block_sparse_attention(q.reshape(B * H, N, D), repeat_kv(k, H).reshape(B * H, M, D),
                                     repeat_kv(v, H).reshape(B * H, M, -1), plan)  # (B*H, N, Dv)
        return out.reshape(B, H, N, -1)  # (B, H, N, Dv)

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for any valid mask with ``N <= M``, no bias and no weights; else the reason."""
        why = reason(check_qkv, q, k, v, who="local") or super().supports(q, k, v, mask)
        if why is None and bias is not None:
            why = "local: bias is not supported (use Exact or Longformer for score biases)"
        if why is None and return_weights:
            why = "local: return_weights=True is not supported (use Exact with mask=Local.pattern())"
        if why is None and q.shape[2] > k.shape[2]:
            why = f"local: needs N <= M (queries are the last N of M positions), got N={q.shape[2]}, M={k.shape[2]}"
        return why

    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        """One block holding every position: exact attention."""
        return {"block_size": n}

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"block_size": max(1, n // 4)}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        kb = self.block_size * (2 if self.overlap else 1)
        nb = math.ceil(n_keys / self.block_size)
        rows = nb * self.block_size
        flops = 2.0 * batch * heads * rows * kb * 2 * head_dim
        mem = 4.0 * batch * heads * (rows * kb + 4 * rows * head_dim)
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, overlap={self.overlap}, causal={self.causal}"


class _BlockPattern(Mask):
    """Dense description of :class:`Local`'s pattern on positions (bottom-right aligned)."""

    depends = frozenset({"q", "k"})

    def __init__(self, block_size: int, overlap: bool, causal: bool):
        self.block_size, self.overlap, self.causal = block_size, overlap, causal

    def allows(self, b, h, q, k, n_q, n_k):
        bs = min(self.block_size, n_k)
        p = q + (n_k - n_q)
        qb, kb = torch.div(p, bs, rounding_mode="floor"), torch.div(k, bs, rounding_mode="floor")
        ok = kb == qb
        if self.overlap:
            ok = ok | (kb == qb - 1)
        ok = ok & (p >= 0)
        if self.causal:
            ok = ok & (k <= p)
        return ok

    def row_interval(self, n_q, n_k, device=None):
        bs = min(self.block_size, n_k)
        p = torch.arange(n_q, device=device) + (n_k - n_q)  # (N,) the queries' positions
        start = torch.div(p, bs, rounding_mode="floor") * bs  # first key of the query's block
        lo = start - bs if self.overlap else start
        hi = torch.minimum(p + 1, start + bs) if self.causal else start + bs
        hi = torch.where(p >= 0, hi, lo)  # a query before the first key sees nothing
        return lo.view(1, -1), hi.view(1, -1)

    def __repr__(self):
        return f"local_blocks(block_size={self.block_size}, overlap={self.overlap}, causal={self.causal})"


__all__ = ["Local", "block_attention", "block_mechanism_reason", "block_route", "check_block_settings", "mask_on_pairs",
           "native_serves", "repeat_kv"]
