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

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

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
]

#: Tile kinds returned by :meth:`Mask.block_kinds`. They are ordered so that ``&`` is
#: the element-wise minimum, ``|`` the maximum and ``~`` is ``FULL - kind``.
EMPTY, PARTIAL, FULL = 0, 1, 2

_DIMS = ("b", "h", "q", "k")


def _blocks(n: int, size: int, device: torch.device | None) -> tuple[Tensor, Tensor]:
    """First and last (inclusive) index of each block of ``size`` covering ``range(n)``."""
    lo = torch.arange(0, n, size, device=device)
    hi = torch.clamp(lo + size - 1, max=n - 1)
    return lo, hi


def tile_kinds(all_allowed: Tensor, any_allowed: Tensor) -> Tensor:
    """Tile kinds (int8 ``FULL``/``PARTIAL``/``EMPTY``) from per-tile 'all allowed' and 'any allowed' booleans.

    For a mask written outside this module that computes those two facts per tile itself.
    """
    return torch.where(
        all_allowed,
        torch.tensor(FULL, dtype=torch.int8, device=all_allowed.device),
        torch.where(
            any_allowed,
            torch.tensor(PARTIAL, dtype=torch.int8, device=all_allowed.device),
            torch.tensor(EMPTY, dtype=torch.int8, device=all_allowed.device),
        ),
    )


def _tile_reduce(allowed: Tensor, block_q: int, block_k: int) -> Tensor:
    """Classify tiles of a materialized boolean ``(B', H', N', M')`` tensor.

    Dimensions of size 1 in ``N'`` or ``M'`` are broadcast (the mask does not depend on
    them), so they stay size 1 in the result and broadcast over the tile grid.
    """
    b, h, n, m = allowed.shape
    bq = block_q if n > 1 else 1
    bk = block_k if m > 1 else 1
    nqb, nkb = math.ceil(n / bq), math.ceil(m / bk)
    pad_q, pad_k = nqb * bq - n, nkb * bk - m
    x = allowed
    if pad_q or pad_k:
        # pad by repeating the last row/column: repetition changes neither any() nor all()
        x = torch.nn.functional.pad(x.to(torch.uint8), (0, pad_k, 0, pad_q), mode="replicate")
        x = x.bool()
    x = x.reshape(b, h, nqb, bq, nkb, bk)  # (B', H', nqb, bq, nkb, bk)
    any_ = x.any(dim=5).any(dim=3)  # (B', H', nqb, nkb)
    all_ = x.all(dim=5).all(dim=3)
    return tile_kinds(all_, any_)


class Mask:
    """Base class of all masks: where attention is allowed (``True`` = may attend).

    Subclasses implement :meth:`allows` and, where they can do better than
    materializing, :meth:`block_kinds`. ``depends`` names the index dimensions the
    mask reads (a subset of ``"b", "h", "q", "k"``); :meth:`dense` uses it to stay
    compact in the others.
    """

    depends: frozenset[str] = frozenset(_DIMS)

    # -- the questions every mask answers --------------------------------------------
    def validate(self, n_q: int, n_k: int) -> None:
        """Raise ValueError when the mask cannot describe a call with ``n_q`` queries and ``n_k`` keys.

        The message names the argument, the bad value and the valid range (for example a
        padding length above ``n_k``). :meth:`dense`, :meth:`tile` and :meth:`block_kinds`
        call it; :meth:`allows` does not (it runs inside traced kernels).
        """

    def allows(self, b: Tensor, h: Tensor, q: Tensor, k: Tensor, n_q: int, n_k: int) -> Tensor:
        """May query ``q`` see key ``k``?

        Args:
            b, h, q, k: integer index tensors that broadcast together (for example
                ``(B,1,1,1)``, ``(1,H,1,1)``, ``(1,1,N,1)``, ``(1,1,1,M)``).
            n_q, n_k: total number of queries and keys of the call (for alignment).

        Returns:
            A boolean tensor of the broadcast shape.
        """
        raise NotImplementedError

    def block_kinds(self, n_q: int, n_k: int, block_q: int, block_k: int, device=None) -> Tensor:
        """Classify every (query-block, key-block) tile.

        Returns:
            ``int8`` tensor of shape ``(B' , H', ceil(N/block_q), ceil(M/block_k))`` with
            ``B'``/``H'`` equal to 1 where the mask does not depend on batch/head, holding
            :data:`EMPTY`, :data:`PARTIAL` or :data:`FULL`. ``PARTIAL`` is always a safe
            answer; EMPTY and FULL are exact.
        """
        return _tile_reduce(self.dense(n_q, n_k, device=device), block_q, block_k)

    def dense(self, n_q: int, n_k: int, device=None, batch: int | None = None, heads: int | None = None) -> Tensor:
        """Materialize as a boolean tensor ``(B', H', N', M')``.

        Dimensions the mask does not depend on have size 1 (broadcastable), so a key
        padding mask is ``(B, 1, 1, M)``. ``batch`` and ``heads`` give the sizes of the
        batch and head dimensions for masks that need them (for example
        ``global_tokens`` does not, ``dense`` knows its own).
        """
        self.validate(n_q, n_k)
        sizes = {"b": self._batch_size(batch), "h": self._head_size(heads), "q": n_q, "k": n_k}
        idx = []
        for pos, name in enumerate(_DIMS):
            size = sizes[name] if name in self.depends else 1
            shape = [1, 1, 1, 1]
            shape[pos] = size
            idx.append(torch.arange(size, device=device).view(shape))
        out = self.allows(*idx, n_q=n_q, n_k=n_k)
        return out.expand(*[i.shape[p] for p, i in enumerate(idx)])

    def tile(self, q0: int, q1: int, k0: int, k1: int, n_q: int, n_k: int, device=None) -> Tensor:
        """Boolean ``(B'|1, H'|1, q1-q0, k1-k0)`` for queries ``q0:q1`` and keys ``k0:k1``.

        Batch and head dimensions are size 1 where the mask does not depend on them.
        """
        self.validate(n_q, n_k)
        b = torch.arange(self._batch_size(None) if "b" in self.depends else 1, device=device)
        h = torch.arange(self._head_size(None) if "h" in self.depends else 1, device=device)
        q = torch.arange(q0, q1, device=device)
        k = torch.arange(k0, k1, device=device)
        out = self.allows(b.view(-1, 1, 1, 1), h.view(1, -1, 1, 1), q.view(1, 1, -1, 1), k.view(1, 1, 1, -1), n_q, n_k)
        return out.expand(b.numel(), h.numel(), q1 - q0, k1 - k0)

    # -- sizes the mask carries -------------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        """Batch size the mask is tied to, or None when it holds for any batch."""
        return None

    @property
    def num_heads(self) -> int | None:
        """Number of heads the mask is tied to, or None when it holds for any head."""
        return None

    def _batch_size(self, batch: int | None) -> int:
        own = self.batch_size
        if own is not None:
            return own
        return 1 if batch is None else batch

    def _head_size(self, heads: int | None) -> int:
        own = self.num_heads
        if own is not None:
            return own
        return 1 if heads is None else heads

    # -- translation for SDPA-style kernels --------------------------------------------
    def band(self) -> tuple[int | None, int] | None:
        """``(left, right)`` when this mask is exactly the band ``p - left <= k <= p + right``.

        ``p`` is the query's bottom-right-aligned position; ``left`` None means unbounded
        (``causal()`` is ``(None, 0)``). None for every other mask. Kernels with a native
        causal or windowed mode (flash-attn) read it.
        """
        return None

    def is_causal(self, n_q: int, n_k: int) -> bool:
        """True when this mask equals PyTorch's top-left ``is_causal`` for this shape."""
        return False

    def has_empty_rows(self, n_q: int, n_k: int, device=None, batch: int | None = None) -> bool:
        """True when some query row may see no key at all (such rows yield zeros)."""
        return bool((~self.dense(n_q, n_k, device=device, batch=batch).any(-1)).any())

    # -- composition ------------------------------------------------------------------
    def __and__(self, other: Mask) -> Mask:
        return _And(self, as_mask(other, "other"))

    def __or__(self, other: Mask) -> Mask:
        return _Or(self, as_mask(other, "other"))

    def __invert__(self) -> Mask:
        return _Not(self)

    def to(self, device) -> Mask:
        """Return the mask with its tensors on ``device`` (masks without tensors return self)."""
        return self


def _bidx(b: Tensor, n: int) -> Tensor:
    """Batch index into a tensor with ``n`` rows: a single row broadcasts over the batch."""
    return b if n != 1 else torch.zeros_like(b)


def _pos(q: Tensor, n_q: int, n_k: int) -> Tensor:
    """Key-sequence position of query index ``q`` (bottom-right alignment)."""
    return q + (n_k - n_q)


def _preview(t: Tensor, limit: int = 8) -> str:
    """The first ``limit`` values of a 1-D tensor, for an error message."""
    values = t[:limit].tolist()
    return str(values) if t.numel() <= limit else str(values)[:-1] + f", ... ({t.numel()} values)]"


def _tile_bounds(n_q: int, n_k: int, block_q: int, block_k: int, device):
    qlo, qhi = _blocks(n_q, block_q, device)
    klo, khi = _blocks(n_k, block_k, device)
    off = n_k - n_q
    # (1, 1, nqb, 1) and (1, 1, 1, nkb)
    return (
        (qlo + off).view(1, 1, -1, 1),
        (qhi + off).view(1, 1, -1, 1),
        klo.view(1, 1, 1, -1),
        khi.view(1, 1, 1, -1),
    )


class _Causal(Mask):
    depends = frozenset({"q", "k"})

    def allows(self, b, h, q, k, n_q, n_k):
        return k <= _pos(q, n_q, n_k)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        plo, phi, klo, khi = _tile_bounds(n_q, n_k, block_q, block_k, device)
        return tile_kinds(khi <= plo, klo <= phi)

    def is_causal(self, n_q, n_k):
        return n_q == n_k

    def band(self):
        return None, 0

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        return n_q > n_k

    def __repr__(self):
        return "causal()"


class _SlidingWindow(Mask):
    depends = frozenset({"q", "k"})

    def __init__(self, left: int, right: int):
        self.left, self.right = left, right

    def allows(self, b, h, q, k, n_q, n_k):
        p = _pos(q, n_q, n_k)
        return (k >= p - self.left) & (k <= p + self.right)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        plo, phi, klo, khi = _tile_bounds(n_q, n_k, block_q, block_k, device)
        full = (klo >= phi - self.left) & (khi <= plo + self.right)
        any_ = (khi >= plo - self.left) & (klo <= phi + self.right)
        return tile_kinds(full, any_)

    def band(self):
        return self.left, self.right

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        # query at position p sees keys [p-left, p+right] ∩ [0, n_k); only a query
        # before the first key (p < 0, when n_q > n_k) can see none
        return (n_k - n_q) + self.right < 0

    def __repr__(self):
        return f"sliding_window(left={self.left}, right={self.right})"


class _Padding(Mask):
    depends = frozenset({"b", "k"})

    def __init__(self, lengths: Tensor, longest: int, any_empty: bool):
        self.lengths = lengths
        self.longest, self.any_empty = longest, any_empty  # host copies: no GPU sync to validate

    @property
    def batch_size(self):
        return self.lengths.shape[0]

    def validate(self, n_q, n_k):
        if self.longest > n_k:
            raise ValueError(f"padding: lengths must be in [0, {n_k}] for a call with M={n_k} keys, got "
                             f"{self.longest} (lengths={_preview(self.lengths)})")

    def allows(self, b, h, q, k, n_q, n_k):
        lengths = self.lengths.to(k.device)
        return k < lengths[_bidx(b, lengths.shape[0])]

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self.validate(n_q, n_k)
        klo, khi = _blocks(n_k, block_k, device)
        lengths = self.lengths.to(device).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
        return tile_kinds(khi.view(1, 1, 1, -1) < lengths, klo.view(1, 1, 1, -1) < lengths)

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        return self.any_empty

    def to(self, device):
        return _Padding(self.lengths.to(device), self.longest, self.any_empty)

    def __repr__(self):
        return f"padding(lengths={self.lengths.tolist()})"


class _KeyMask(Mask):
    depends = frozenset({"b", "k"})

    def __init__(self, keep: Tensor):
        self.keep = keep  # (B, M) bool

    @property
    def batch_size(self):
        return self.keep.shape[0]

    def validate(self, n_q, n_k):
        if n_k != self.keep.shape[1]:
            raise ValueError(f"key mask covers {self.keep.shape[1]} keys but the call has n_k={n_k}")

    def allows(self, b, h, q, k, n_q, n_k):
        self.validate(n_q, n_k)
        return self.keep.to(k.device)[_bidx(b, self.keep.shape[0]), k]

    def to(self, device):
        return _KeyMask(self.keep.to(device))

    def __repr__(self):
        return f"key_mask(shape={tuple(self.keep.shape)})"


class _GlobalTokens(Mask):
    depends = frozenset({"q", "k"})

    def __init__(self, indices: Tensor, table: Tensor, end: int):
        self.indices = indices  # sorted, unique
        # lookup table: is position p global? (indexing traces under FlexAttention; isin does not)
        self.table = table
        self.end = end  # one past the largest index, a host int: validating needs no GPU sync

    @classmethod
    def build(cls, host: Tensor, device) -> _GlobalTokens:
        """From non-negative CPU indices (any order, repeats allowed), with tensors on ``device``."""
        host = torch.unique(host)  # sorted
        end = int(host[-1]) + 1 if host.numel() else 0
        table = torch.zeros(end + 1, dtype=torch.bool)
        table[host] = True  # the last entry stays False: out-of-range positions map there
        return cls(host.to(device), table.to(device), end)

    def validate(self, n_q, n_k):
        if self.end > n_k:
            raise ValueError(f"global_tokens: indices must be key positions in [0, {n_k - 1}] for a call with "
                             f"M={n_k} keys, got {self.end - 1} (indices={_preview(self.indices)})")

    def _is_global(self, pos: Tensor) -> Tensor:
        table = self.table.to(pos.device)
        last = table.shape[0] - 1
        return table[torch.where((pos >= 0) & (pos < last), pos, last)]

    def allows(self, b, h, q, k, n_q, n_k):
        return self._is_global(_pos(q, n_q, n_k)) | self._is_global(k)

    def _count(self, lo: Tensor, hi: Tensor) -> Tensor:
        """Number of global positions in [lo, hi] (inclusive), vectorized."""
        idx = self.indices.to(lo.device)
        return torch.searchsorted(idx, hi, right=True) - torch.searchsorted(idx, lo, right=False)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self.validate(n_q, n_k)
        qlo, qhi = _blocks(n_q, block_q, device)
        klo, khi = _blocks(n_k, block_k, device)
        off = n_k - n_q
        nq = self._count(qlo + off, qhi + off).view(1, 1, -1, 1)
        nk = self._count(klo, khi).view(1, 1, 1, -1)
        q_all = nq == (qhi - qlo + 1).view(1, 1, -1, 1)
        k_all = nk == (khi - klo + 1).view(1, 1, 1, -1)
        return tile_kinds(q_all | k_all, (nq > 0) | (nk > 0))

    def to(self, device):
        return _GlobalTokens(self.indices.to(device), self.table.to(device), self.end)

    def __repr__(self):
        return f"global_tokens({self.indices.tolist()})"


class _Document(Mask):
    depends = frozenset({"b", "q", "k"})

    def __init__(self, ids: Tensor):
        self.ids = ids  # (B, M) integer document id of each key position

    @property
    def batch_size(self):
        return self.ids.shape[0]

    def _check(self, n_q, n_k):
        if n_k != self.ids.shape[1]:
            raise ValueError(f"document ids cover {self.ids.shape[1]} positions but the call has n_k={n_k}")
        if n_q > n_k:
            # queries take the ids of the last n_q key positions; with more queries than
            # positions the first ones have no id (indexing would silently wrap around)
            raise ValueError(f"document mask needs n_q <= n_k (queries are the last n_q positions), got n_q={n_q}, n_k={n_k}")

    def validate(self, n_q, n_k):
        self._check(n_q, n_k)

    def allows(self, b, h, q, k, n_q, n_k):
        self._check(n_q, n_k)
        ids = self.ids.to(k.device)
        b = _bidx(b, ids.shape[0])
        return ids[b, _pos(q, n_q, n_k)] == ids[b, k]

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self._check(n_q, n_k)
        ids = self.ids.to(device)
        off = n_k - n_q
        q_ids = ids[:, off:]  # (B, N) ids of the query positions

        def ranges(x: Tensor, size: int):
            n = x.shape[1]
            nb = math.ceil(n / size)
            pad = nb * size - n
            # repeat the last id (exact on integers; a float round trip merges large ids)
            xp = torch.cat([x, x[:, -1:].expand(-1, pad)], dim=1)  # (B, nb * size)
            xp = xp.view(x.shape[0], nb, size)
            return xp.amin(-1), xp.amax(-1)  # (B, nb)

        qmin, qmax = ranges(q_ids, block_q)
        kmin, kmax = ranges(ids, block_k)
        qmin, qmax = qmin.view(-1, 1, qmin.shape[1], 1), qmax.view(-1, 1, qmax.shape[1], 1)
        kmin, kmax = kmin.view(-1, 1, 1, kmin.shape[1]), kmax.view(-1, 1, 1, kmax.shape[1])
        full = (qmin == qmax) & (kmin == kmax) & (qmin == kmin)
        may_overlap = (qmax >= kmin) & (kmax >= qmin)
        return tile_kinds(full, may_overlap)

    def to(self, device):
        return _Document(self.ids.to(device))

    def __repr__(self):
        return f"document(ids shape={tuple(self.ids.shape)})"


class _KeyPrefix(Mask):
    depends = frozenset({"k"})

    def __init__(self, n: int):
        self.n = n

    def allows(self, b, h, q, k, n_q, n_k):
        return k < self.n

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        klo, khi = _blocks(n_k, block_k, device)
        return tile_kinds(khi.view(1, 1, 1, -1) < self.n, klo.view(1, 1, 1, -1) < self.n)

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        return self.n <= 0

    def __repr__(self):
        return f"key_prefix({self.n})"


class _Dense(Mask):
    def __init__(self, allowed: Tensor):
        self.allowed = allowed  # (B', H', N, M) bool

    @property
    def depends(self):  # type: ignore[override]
        return frozenset(d for d, s in zip(_DIMS, self.allowed.shape, strict=True) if s != 1)

    @property
    def batch_size(self):
        return self.allowed.shape[0] if self.allowed.shape[0] != 1 else None

    @property
    def num_heads(self):
        return self.allowed.shape[1] if self.allowed.shape[1] != 1 else None

    def _check(self, n_q, n_k):
        _, _, n, m = self.allowed.shape
        if (n != 1 and n != n_q) or (m != 1 and m != n_k):
            raise ValueError(
                f"dense mask of shape {tuple(self.allowed.shape)} does not match n_q={n_q}, n_k={n_k}"
            )

    def validate(self, n_q, n_k):
        self._check(n_q, n_k)

    def allows(self, b, h, q, k, n_q, n_k):
        self._check(n_q, n_k)
        a = self.allowed.to(q.device)
        idx = [i if s != 1 else torch.zeros_like(i) for i, s in zip((b, h, q, k), a.shape, strict=True)]
        return a[idx[0], idx[1], idx[2], idx[3]]

    def dense(self, n_q, n_k, device=None, batch=None, heads=None):
        self._check(n_q, n_k)
        b, h, n, m = self.allowed.shape
        return self.allowed.to(device).expand(b, h, n_q if n == 1 else n, n_k if m == 1 else m)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        return _tile_reduce(self.dense(n_q, n_k, device=device), block_q, block_k)

    def to(self, device):
        return _Dense(self.allowed.to(device))

    def __repr__(self):
        return f"dense(shape={tuple(self.allowed.shape)})"


class _Binary(Mask):
    def __init__(self, a: Mask, b: Mask):
        self.a, self.b = a, b
        ba, bb = a.batch_size, b.batch_size
        if ba is not None and bb is not None and ba != bb and 1 not in (ba, bb):
            raise ValueError(f"cannot combine masks with batch sizes {ba} and {bb}")
        ha, hb = a.num_heads, b.num_heads
        if ha is not None and hb is not None and ha != hb and 1 not in (ha, hb):
            raise ValueError(f"cannot combine masks with head counts {ha} and {hb}")

    @property
    def depends(self):  # type: ignore[override]
        return self.a.depends | self.b.depends

    def validate(self, n_q, n_k):
        self.a.validate(n_q, n_k)
        self.b.validate(n_q, n_k)

    @property
    def batch_size(self):
        sizes = [x for x in (self.a.batch_size, self.b.batch_size) if x is not None]
        return max(sizes) if sizes else None  # a batch of 1 broadcasts

    @property
    def num_heads(self):
        sizes = [x for x in (self.a.num_heads, self.b.num_heads) if x is not None]
        return max(sizes) if sizes else None


class _And(_Binary):
    def allows(self, b, h, q, k, n_q, n_k):
        return self.a.allows(b, h, q, k, n_q, n_k) & self.b.allows(b, h, q, k, n_q, n_k)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        return torch.minimum(
            self.a.block_kinds(n_q, n_k, block_q, block_k, device),
            self.b.block_kinds(n_q, n_k, block_q, block_k, device),
        )

    def to(self, device):
        return _And(self.a.to(device), self.b.to(device))

    def __repr__(self):
        return f"({self.a!r} & {self.b!r})"


class _Or(_Binary):
    def allows(self, b, h, q, k, n_q, n_k):
        return self.a.allows(b, h, q, k, n_q, n_k) | self.b.allows(b, h, q, k, n_q, n_k)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        return torch.maximum(
            self.a.block_kinds(n_q, n_k, block_q, block_k, device),
            self.b.block_kinds(n_q, n_k, block_q, block_k, device),
        )

    def to(self, device):
        return _Or(self.a.to(device), self.b.to(device))

    def __repr__(self):
        return f"({self.a!r} | {self.b!r})"


class _Not(Mask):
    def __init__(self, a: Mask):
        self.a = a

    @property
    def depends(self):  # type: ignore[override]
        return self.a.depends

    @property
    def batch_size(self):
        return self.a.batch_size

    @property
    def num_heads(self):
        return self.a.num_heads

    def validate(self, n_q, n_k):
        self.a.validate(n_q, n_k)

    def allows(self, b, h, q, k, n_q, n_k):
        return ~self.a.allows(b, h, q, k, n_q, n_k)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        return FULL - self.a.block_kinds(n_q, n_k, block_q, block_k, device)

    def to(self, device):
        return _Not(self.a.to(device))

    def __repr__(self):
        return f"~{self.a!r}"


# -- public constructors ----------------------------------------------------------------


def _int_tensor(x, name: str, ndim: tuple[int, ...]) -> Tensor:
    t = torch.as_tensor(x)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"{name} must hold integers, got dtype {t.dtype}")
    if t.ndim not in ndim:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape {tuple(t.shape)}")
    return t.long()


def causal() -> Mask:
    """Query at position ``p`` sees keys ``0..p`` (bottom-right aligned when N != M)."""
    return _Causal()


def sliding_window(left: int, right: int = 0) -> Mask:
    """Query at position ``p`` sees keys ``p-left .. p+right`` (inclusive).

    ``sliding_window(w)`` is a causal local window of ``w`` past keys plus itself;
    ``sliding_window(w, w)`` is the symmetric (Longformer-style) window.
    """
    for name, val in (("left", left), ("right", right)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 0:
            raise ValueError(f"sliding_window: {name} must be a non-negative int, got {val!r}")
    return _SlidingWindow(left, right)


def padding(lengths: Sequence[int] | Tensor) -> Mask:
    """Key padding: in batch row ``b`` only keys ``0 .. lengths[b]-1`` may be attended."""
    t = _int_tensor(lengths, "padding: lengths", (1,))
    host = t.cpu()  # one copy (a sync for a GPU tensor); every size read below is a host int
    if (host < 0).any():
        raise ValueError(f"padding: lengths must be >= 0, got {host.tolist()}")
    longest = int(host.max()) if host.numel() else 0
    return _Padding(t, longest, bool((host == 0).any()))


def key_mask(keep: Tensor) -> Mask:
    """Per-row key mask from a boolean ``(B, M)`` tensor (True = key may be attended)."""
    keep = torch.as_tensor(keep)
    if keep.dtype != torch.bool or keep.ndim != 2:
        raise ValueError(f"key_mask: keep must be a 2-D bool tensor (B, M), got {keep.dtype} {tuple(keep.shape)}")
    return _KeyMask(keep)


def global_tokens(indices: Sequence[int] | Tensor) -> Mask:
    """Positions in ``indices`` see every key and are seen by every query.

    Combine with a local mask: ``sliding_window(w, w) | global_tokens([0])``.
    """
    t = _int_tensor(indices, "global_tokens: indices", (1,))
    host = t.cpu()  # one copy (a sync for a GPU tensor); the table and its size are built on the host
    if (host < 0).any():
        raise ValueError(f"global_tokens: indices must be >= 0, got {host.tolist()}")
    return _GlobalTokens.build(host, t.device)


def document(ids: Tensor) -> Mask:
    """Block-diagonal packing: a position sees only positions with the same id.

    Args:
        ids: integer ``(M,)`` or ``(B, M)`` document id of each key position; queries
            take the ids of the last N positions (so a call needs ``N <= M``; more
            queries than positions raise ValueError). Combine with ``causal()`` for
            packed causal LM training.
    """
    t = _int_tensor(ids, "document: ids", (1, 2))
    return _Document(t.unsqueeze(0) if t.ndim == 1 else t)


def prefix_lm(n: int) -> Mask:
    """Prefix-LM: keys ``0..n-1`` (the prefix) are visible to all; the rest is causal."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"prefix_lm: n must be a non-negative int, got {n!r}")
    return _Or(_Causal(), _KeyPrefix(n))


def dense(allowed: Tensor) -> Mask:
    """Wrap a boolean tensor broadcastable to ``(B, H, N, M)`` (True = may attend).

    2-D ``(N, M)`` and 3-D ``(B, N, M)`` tensors are accepted and given leading
    size-1 dimensions (3-D is read as batch, not heads).
    """
    allowed = torch.as_tensor(allowed)
    if allowed.dtype != torch.bool:
        raise ValueError(
            f"dense: allowed must be a bool tensor (True = may attend), got dtype {allowed.dtype}; "
            "for an additive float mask pass it as bias=, for the '1 = blocked' convention use from_blocked()"
        )
    if allowed.ndim == 2:
        allowed = allowed[None, None]
    elif allowed.ndim == 3:
        allowed = allowed[:, None]
    elif allowed.ndim != 4:
        raise ValueError(f"dense: allowed must have 2, 3 or 4 dimensions, got shape {tuple(allowed.shape)}")
    return _Dense(allowed)


def padding_from_tokens(tokens: Tensor, pad_id: int = 0) -> Mask:
    """Key padding mask from a batch of token ids ``(B, M)``: keys equal to ``pad_id`` are hidden.

    This is the seeds' ``create_padding_mask(seq, pad_token=0)`` (which returns
    ``1`` where padding is) expressed in attnlab's sign: allowed where *not* padding.
    """
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"padding_from_tokens: tokens must be (B, M), got shape {tuple(tokens.shape)}")
    return _KeyMask(tokens != pad_id)


def from_blocked(blocked: Tensor) -> Mask:
    """Convert the seeds' convention (``1``/``True`` = blocked, added as ``-1e9``) to a mask.

    Accepts the look-ahead mask ``triu(ones, 1)`` (N, M), the padding mask
    ``(B, 1, 1, M)`` or anything broadcastable to ``(B, H, N, M)``; nonzero means blocked.
    """
    blocked = torch.as_tensor(blocked)
    return dense(blocked == 0)


def conjuncts(mask: Mask) -> list[Mask]:
    """The parts of an ``&`` tree, left to right (``[mask]`` for any other mask).

    ``mask`` allows a pair exactly when every part does, so a consumer can treat the
    key-only parts (``part.depends <= {"b", "k"}``) as key padding and the rest apart.
    """
    if isinstance(mask, _And):
        return conjuncts(mask.a) + conjuncts(mask.b)
    return [mask]


def as_mask(mask, name: str = "mask") -> Mask | None:
    """Accept a :class:`Mask`, a boolean tensor (True = may attend) or None."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if isinstance(mask, Tensor):
        if mask.dtype != torch.bool:
            raise ValueError(
                f"{name} must be a Mask or a bool tensor (True = may attend), got a {mask.dtype} tensor; "
                "pass additive float masks as bias=, or convert the '1 = blocked' convention with "
                "attnlab.masks.from_blocked()"
            )
        return dense(mask)
    raise ValueError(f"{name} must be an attnlab Mask, a bool tensor or None, got {type(mask).__name__}")
