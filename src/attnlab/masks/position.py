"""Masks of positions: causal, sliding window, global tokens, documents, prefix-LM.

Every one aligns queries bottom-right when N < M (see :mod:`attnlab.masks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .base import Mask, _bidx, _blocks, _int_tensor, _Or, _pos, _preview, _tile_bounds, tile_kinds


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

    def row_interval(self, n_q, n_k, device=None):
        hi = _pos(torch.arange(n_q, device=device), n_q, n_k) + 1
        return torch.zeros_like(hi).view(1, -1), hi.view(1, -1)

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

    def row_interval(self, n_q, n_k, device=None):
        p = _pos(torch.arange(n_q, device=device), n_q, n_k)
        return (p - self.left).view(1, -1), (p + self.right + 1).view(1, -1)

    def __repr__(self):
        return f"sliding_window(left={self.left}, right={self.right})"


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

    def row_interval(self, n_q, n_k, device=None):
        self._check(n_q, n_k)
        ids = self.ids.to(device)  # (B, M)
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]  # a new run of one id begins
        run = starts.long().cumsum(-1) - 1  # (B, M) run index of each position
        for row, r in zip(ids, run):  # each id in one run only, else the runs are not the documents
            if int(torch.unique(row).numel()) != int(r[-1]) + 1:
                return None
        pos = torch.arange(n_k, device=device)
        first = torch.full_like(ids, n_k).scatter_reduce(1, run, pos.expand_as(ids), "amin")  # run -> first position
        last = torch.zeros_like(ids).scatter_reduce(1, run, pos.expand_as(ids), "amax")
        q_run = run[:, n_k - n_q:]  # (B, N) the queries' runs
        return first.gather(1, q_run), last.gather(1, q_run) + 1

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

    def row_interval(self, n_q, n_k, device=None):
        hi = torch.full((1, n_q), self.n, dtype=torch.long, device=device)
        return torch.zeros_like(hi), hi

    def __repr__(self):
        return f"key_prefix({self.n})"



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


