"""BigBird block-sparse attention: window + global + random blocks, as exact attention under a mask.

Zaheer, Guruganesh, Dubey, Ainslie, Alberti, Ontanon, Pham, Ravula, Wang, Yang and
Ahmed, 2020, "Big Bird: Transformers for Longer Sequences" (the ITC variant). The
positions are cut into blocks of ``block_size`` (``bs``); query block ``i`` attends

* the window blocks ``i-1, i, i+1`` (``window_blocks=3``; in general ``i - w//2 .. i + w//2``),
* the first ``global_blocks`` blocks (which in turn attend every block),
* ``random_blocks`` (``r``) blocks drawn at random, without replacement, among the
  blocks the window and globals do not already give it.

Randomness: the block table is a pure function of ``(seed, number of blocks,
causal)``: drawn from a CPU ``torch.Generator`` seeded with ``seed`` the first time a
sequence length is seen and cached, so the pattern is fixed for a module (and
reproducible across runs and devices). Set a new ``seed`` to redraw.

The pattern is a :class:`BlockTableMask` (an ``(nb, nb)`` boolean table looked up by
block), combined with the user's mask by ``&``; BigBird is exact attention under it.
Two ways to compute it:

* ``backend="auto"``/``"gather"`` (self-attention without bias, dropout or weights):
  one batched call instead of ``chunked``'s Python loop over tiles (what accelerators
  want; on a busy CPU the tile loop's thousands of small ops also varied 0.7-20 s at
  N=8192 where this stayed within 10%):
  :func:`attnlab.mechanisms.local.block_attention` (``fused=False``) gathers each query block's
  ``K = w + g + r`` key blocks and runs one batched SDPA call; the global query rows go
  through :func:`attnlab.attention` against all keys. Time O(B H N K bs D), memory
  O(B H N K bs) - linear in N.
* an exact backend name (and ``auto`` for the other calls): :func:`attnlab.attention`
  with the mask. The mask classifies tiles exactly by table lookup (2-D prefix sums),
  so ``chunked`` skips empty tiles; BigBird runs ``chunked`` with tiles aligned to its
  blocks (``block_q = block_k = bs``): time O(B H N K bs D), memory O(B H N D).
  Dense backends compute the same numbers in O(B H N M D).

Causal (``causal=True``): the table keeps only blocks
at or before the query's block (random blocks are drawn among earlier blocks) and the
pattern is ANDed with ``causal()``. Supports every mask, additive bias, dropout and
``return_weights`` (served by ``math``).

Shape legend: B batch, H heads, N queries, M keys, D head dim, bs block size, nb blocks.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..exact import attention, choose_backend, chunked_attention, make_call
from ..exact.call import check_qkv
from ..masks import Mask, as_mask, causal, tile_kinds
from ..utils import int_at_least
from .base import Cost, Mechanism, register_mechanism
from .local import block_attention, block_mechanism_reason, block_route, check_block_settings


class BlockTableMask(Mask):
    """Block-level mask: position ``p`` may see key ``k`` iff ``table[p // bs, k // bs]``.

    Args:
        table: bool ``(nb, nb)`` over blocks of positions (``nb = ceil(M / bs)``).
        block_size: positions per block.

    Queries are bottom-right aligned (query ``i`` is position ``i + M - N``).
    """

    depends = frozenset({"q", "k"})

    def __init__(self, table: Tensor, block_size: int):
        if table.dtype != torch.bool or table.ndim != 2:
            raise ValueError(f"BlockTableMask: table must be a 2-D bool tensor, got {table.dtype} {tuple(table.shape)}")
        self.table = table
        self.block_size = block_size
        t = table.to(torch.int32)
        # integral image with a zero border: S[i, j] = table[:i, :j].sum()
        self._integral = torch.nn.functional.pad(t.cumsum(0).cumsum(1), (1, 0, 1, 0))

    def _check(self, n_k: int) -> None:
        nb = math.ceil(n_k / self.block_size)
        if self.table.shape != (nb, nb):
            raise ValueError(
                f"BlockTableMask: table {tuple(self.table.shape)} does not cover n_k={n_k} keys in blocks of "
                f"{self.block_size} (expected ({nb}, {nb}))"
            )

    def allows(self, b, h, q, k, n_q, n_k):
        self._check(n_k)
        p = q + (n_k - n_q)
        t = self.table.to(q.device)
        bq = torch.div(p.clamp(min=0), self.block_size, rounding_mode="floor")
        bk = torch.div(k, self.block_size, rounding_mode="floor")
        return t[bq, bk] & (p >= 0)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self._check(n_k)
        bs, off = self.block_size, n_k - n_q
        dev = self._integral.device  # the tile bounds index the integral image where it lives
        qlo = torch.arange(0, n_q, block_q, device=dev) + off
        qhi = torch.clamp(qlo + block_q - 1, max=n_k - 1)
        klo = torch.arange(0, n_k, block_k, device=dev)
        khi = torch.clamp(klo + block_k - 1, max=n_k - 1)
        # blocks touched by each tile (query positions < 0 belong to no block)
        r0 = torch.div(qlo.clamp(min=0), bs, rounding_mode="floor").view(-1, 1)
        r1 = torch.div(qhi.clamp(min=0), bs, rounding_mode="floor").view(-1, 1) + 1
        c0 = torch.div(klo, bs, rounding_mode="floor").view(1, -1)
        c1 = torch.div(khi, bs, rounding_mode="floor").view(1, -1) + 1
        S = self._integral
        count = S[r1, c1] - S[r0, c1] - S[r1, c0] + S[r0, c0]  # (nqb, nkb) allowed blocks in tile
        area = (r1 - r0) * (c1 - c0)
        full = (count == area) & (qlo >= 0).view(-1, 1)
        any_ = (count > 0) & (qhi >= 0).view(-1, 1)
        return tile_kinds(full, any_).view(1, 1, *count.shape).to(device)

    def to(self, device):
        """The mask with its table on ``device`` (self when it is there already).

        A compiled kernel captures the table of the mask it is given, so a CUDA call
        must get a CUDA table, not read a CPU one from inside the kernel.
        """
        if self.table.device == torch.device(device):
            return self
        return BlockTableMask(self.table.to(device), self.block_size)

    def __repr__(self):
        return f"block_table(nb={self.table.shape[0]}, block_size={self.block_size}, density={self.density():.3f})"

    def density(self) -> float:
        """Fraction of allowed blocks in the table."""
        return float(self.table.float().mean())


@register_mechanism
class BigBird(Mechanism):
    """Block-sparse attention with window, global and random blocks (BigBird ITC).

    Args:
        block_size: positions per block (``bs``, default 64).
        window_blocks: odd number of window blocks centred on the query block (3).
        global_blocks: number of leading global blocks (1).
        random_blocks: random key blocks per query block (3).
        seed: seed of the random block table (see the module docstring).
        causal: autoregressive variant.
        backend: ``"auto"`` (one call of attnlab's native CPU kernel under the block pattern
            when it serves the call, else the batched block-gather kernel when the call
            allows it - self-attention, no bias, no dropout, no weights - else the exact op's
            choice), ``"gather"`` (that kernel only), or an exact backend name
            (``"chunked"``, ``"math"``, ``"sdpa"``, ...). ``chunked`` runs with tiles
            aligned to the blocks.
        dropout: attention-weight dropout in training mode.
    """

    name = "bigbird"
    masks_supported = "any mask (combined with the block pattern by &) and additive bias"
    exact = False

    def __init__(
        self,
        block_size: int = 64,
        window_blocks: int = 3,
        global_blocks: int = 1,
        random_blocks: int = 3,
        seed: int = 0,
        causal: bool = False,
        backend: str = "auto",
        dropout: float = 0.0,
    ):
        super().__init__()
        for arg, val, lo in (("block_size", block_size, 1), ("window_blocks", window_blocks, 1),
                             ("global_blocks", global_blocks, 0), ("random_blocks", random_blocks, 0)):
            int_at_least(val, f"bigbird: {arg}", lo)
        if window_blocks % 2 == 0:
            raise ValueError(f"bigbird: window_blocks must be odd (centred on the query block), got {window_blocks}")
        check_block_settings("bigbird", backend, dropout)
        self.block_size, self.window_blocks = block_size, window_blocks
        self.global_blocks, self.random_blocks = global_blocks, random_blocks
        self.seed, self.causal, self.backend, self.dropout = int(seed), bool(causal), backend, dropout
        self._tables: dict[tuple[int, int, bool], Tensor] = {}
        self._patterns: dict[tuple, BlockTableMask] = {}

    def table(self, n_keys: int) -> Tensor:
        """The ``(nb, nb)`` bool block table for ``n_keys`` positions (cached per seed)."""
        nb = math.ceil(n_keys / self.block_size)
        key = (nb, self.seed, self.causal)
        if key not in self._tables:
            self._tables[key] = _draw_table(nb, self.window_blocks, self.global_blocks, self.random_blocks,
                                            self.seed, self.causal)
        return self._tables[key]

    def _gather_plan(self, n: int, device) -> tuple[Tensor, Tensor]:
        """Key blocks ``(nb, K)`` of every non-global query block (-1 padded) and the global rows."""
        table = self.table(n)
        nb = table.shape[0]
        g = min(self.global_blocks, nb)
        sparse = table.clone()
        sparse[:g] = False
        sparse[torch.arange(g), torch.arange(g)] = True  # global rows: computed densely, keep one block
        K = int(sparse.sum(1).max())
        order = torch.where(sparse, torch.arange(nb), nb).sort(dim=1).values[:, :K]  # (nb, K) listed first
        key_blocks = order.masked_fill(order == nb, -1)
        rows = torch.arange(min(g * self.block_size, n))
        return key_blocks.to(device), rows.to(device)

    def pattern(self, n_keys: int, device=None) -> Mask:
        """The block-sparse mask for ``n_keys`` positions (``& causal()`` when causal), its table on ``device``.

        The mask of each (length, device) is built once and reused, so kernels that
        cache per mask (FlexAttention's block masks) find it again on the next call.
        """
        dev = torch.device("cpu") if device is None else torch.device(device)
        key = (n_keys, self.seed, self.causal, self.block_size, str(dev))
        m = self._patterns.get(key)
        if m is None:
            m = BlockTableMask(self.table(n_keys), self.block_size).to(dev)
            self._patterns[key] = m
        return m & causal() if self.causal else m

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        check_qkv(q, k, v, who="bigbird")
        user = as_mask(mask, "mask")
        if user is not None:
            user.validate(q.shape[2], k.shape[2])  # lengths and indices against this call (as supports() says)
        full = self.pattern(k.shape[2], q.device)
        if user is not None:
            full = full & user
        route = block_route(self, "bigbird", q, k, v, full, bias=bias, return_weights=return_weights)
        if route == "native":
            return attention(q, k, v, mask=full, bias=bias, backend="native")
        if route == "gather":
            key_blocks, rows = self._gather_plan(q.shape[2], q.device)
            # not the fused path: at N=4096, block 64 (B=1, H=8, D=64) it measured 0.99x this path's
            # forward and 0.74x its fwd+bwd with every block gathered, 0.76x / 0.82x with the window as a
            # strided band beside the gathered rest; the gather, not the attention, is BigBird's cost
            return block_attention(q, k, v, key_blocks, self.block_size, full, dense_rows=rows, fused=False)
        kwargs = dict(mask=full, bias=bias, dropout_p=self.dropout if self.training else 0.0)
        if return_weights:
            backend = "math" if self.backend == "auto" else self.backend
            return attention(q, k, v, return_weights=True, backend=backend, **kwargs)
        backend = choose_backend(q, k, v, **kwargs) if self.backend == "auto" else self.backend
        if backend == "chunked":
            bs = self.block_size
            return chunked_attention(make_call(q, k, v, **kwargs), block_q=bs, block_k=bs)
        return attention(q, k, v, backend=backend, **kwargs)

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for any valid mask and bias (backend ``gather``: self-attention only); else the reason."""
        return block_mechanism_reason(self, "bigbird", q, k, v, mask, bias=bias, return_weights=return_weights)

    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        """One block holding every position (the block table is then all window): exact attention."""
        return {"block_size": n}

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"block_size": max(4, n // 32), "seed": 0}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        nb = math.ceil(n_keys / self.block_size)
        per_row = min(nb, self.window_blocks + self.global_blocks + self.random_blocks) * self.block_size
        pairs = n_queries * per_row + self.global_blocks * self.block_size * n_keys
        if self.backend in ("math", "sdpa", "reference"):
            pairs = n_queries * n_keys
        flops = 2.0 * batch * heads * pairs * 2 * head_dim
        mem = 4.0 * batch * heads * (n_queries + n_keys) * head_dim * 2
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return (f"block_size={self.block_size}, window_blocks={self.window_blocks}, global_blocks={self.global_blocks}, "
                f"random_blocks={self.random_blocks}, seed={self.seed}, causal={self.causal}, backend={self.backend!r}")


def _draw_table(nb: int, window: int, n_global: int, n_random: int, seed: int, is_causal: bool) -> Tensor:
    """BigBird block table ``(nb, nb)``: window band, global rows/columns, random blocks per row."""
    i = torch.arange(nb).view(-1, 1)
    j = torch.arange(nb).view(1, -1)
    half = window // 2
    table = (j - i).abs() <= half  # (nb, nb) window band
    g = min(n_global, nb)
    table[:g, :] = True
    table[:, :g] = True
    if is_causal:
        table &= j <= i
    if n_random > 0:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        score = torch.rand(nb, nb, generator=gen)  # (nb, nb)
        candidates = ~table
        if is_causal:
            candidates &= j < i
        score = score.masked_fill(~candidates, -1.0)
        r = min(n_random, nb)
        top, idx = score.topk(r, dim=1)  # (nb, r)
        pick = torch.zeros_like(table)
        pick.scatter_(1, idx, top >= 0)
        pick[:g] = False  # global rows already see everything
        table |= pick
    return table


__all__ = ["BigBird", "BlockTableMask"]
