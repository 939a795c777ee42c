"""The mask base class, its tile kinds, the ``&``/``|``/``~`` combinators, dense boolean tensors and :func:`as_mask`.

See :mod:`attnlab.masks` for the conventions every mask follows.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

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

    def row_interval(self, n_q: int, n_k: int, device=None) -> tuple[Tensor, Tensor] | None:
        """``(lo, hi)`` when this mask is exactly "query ``i`` sees keys ``lo[b, i] <= k < hi[b, i]``".

        Both are int64 ``(B'|1, N)`` (one row when the mask does not depend on the batch); values
        may lie outside ``[0, M]`` (clamp them) and ``lo >= hi`` means the row sees nothing.
        None when no interval says it (global tokens, dense masks, a document id that recurs
        after another one). Causal, sliding window, padding, a key prefix, documents in
        contiguous runs, prefix-LM and their ``&`` have one; kernels that walk a row's keys by
        interval (attnlab's native kernel) read it instead of a mask.
        """
        return None

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

    #: how the two combine: the elementwise op on ``allows``, the one on tile kinds (EMPTY < PARTIAL < FULL) and the
    #: operator's symbol; each subclass says its own, and its own ``row_interval``
    _allow: ClassVar[Callable[[Tensor, Tensor], Tensor]]
    _kinds: ClassVar[Callable[[Tensor, Tensor], Tensor]]
    _symbol: ClassVar[str]

    def allows(self, b, h, q, k, n_q, n_k):
        return type(self)._allow(self.a.allows(b, h, q, k, n_q, n_k), self.b.allows(b, h, q, k, n_q, n_k))

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        return type(self)._kinds(self.a.block_kinds(n_q, n_k, block_q, block_k, device),
                                 self.b.block_kinds(n_q, n_k, block_q, block_k, device))

    def to(self, device):
        return type(self)(self.a.to(device), self.b.to(device))

    def row_interval(self, n_q, n_k, device=None):
        a = self.a.row_interval(n_q, n_k, device)
        b = self.b.row_interval(n_q, n_k, device) if a is not None else None
        if a is None or b is None:
            return None
        return self._intervals(a, b, n_k)

    def _intervals(self, a, b, n_k):
        """Each query's interval of allowed keys from the two sides' ``(lo, hi)``, or None where it is not one."""
        raise NotImplementedError

    def __repr__(self):
        return f"({self.a!r} {self._symbol} {self.b!r})"


class _And(_Binary):
    _allow, _kinds, _symbol = torch.logical_and, torch.minimum, "&"  # both allow; the lower tile kind

    def _intervals(self, a, b, n_k):
        return torch.maximum(a[0], b[0]), torch.minimum(a[1], b[1])  # both allow: the intersection


class _Or(_Binary):
    _allow, _kinds, _symbol = torch.logical_or, torch.maximum, "|"  # either allows; the higher tile kind

    def _intervals(self, a, b, n_k):
        (la, ha), (lb, hb) = (tuple(t.clamp(0, n_k) for t in x) for x in (a, b))
        la, ha, lb, hb = torch.broadcast_tensors(la, ha, lb, hb)
        # the union is an interval where the two touch or overlap, or one of them is empty
        touch = (torch.maximum(la, lb) <= torch.minimum(ha, hb)) | (la >= ha) | (lb >= hb)
        if not bool(touch.all()):
            return None
        lo = torch.where(la >= ha, lb, torch.where(lb >= hb, la, torch.minimum(la, lb)))
        hi = torch.where(la >= ha, hb, torch.where(lb >= hb, ha, torch.maximum(ha, hb)))
        return lo, hi


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



def _int_tensor(x, name: str, ndim: tuple[int, ...]) -> Tensor:
    t = torch.as_tensor(x)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"{name} must hold integers, got dtype {t.dtype}")
    if t.ndim not in ndim:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape {tuple(t.shape)}")
    return t.long()


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
