"""Masks over grids, videos and trees: axial, block and grid (MaxViT), same frame, same position, nested spans.

Layout (the one convention every grid mask, layer and model of attnlab uses)
-----------------------------------------------------------------------------
A grid of shape ``(s_0, ..., s_{d-1})`` is flattened row-major, the last axis fastest. An
image ``(H, W)`` puts cell ``(h, w)`` at position ``h * W + w``; a video ``(T, H, W)`` puts
``(t, h, w)`` at ``(t * H + h) * W + w``: frame after frame, each frame row by row. That is the
order of ``x.reshape(B, T * H * W, dim)`` for a ``(B, T, H, W, dim)`` tensor and of
:class:`attnlab.positional.SinusoidalND`. With time the slowest axis, a batch of videos with
fewer real frames is a key padding mask, ``masks.padding([frames * H * W, ...])``. (Hugging
Face's TimeSformer orders its tokens ``(H, W, T)``; :mod:`attnlab.layers.spacetime` converts.)

Grid masks
----------
Each is an equivalence relation: query ``i`` may see key ``j`` exactly when both fall in the
same group, and the group is read axis by axis:

* :func:`axial` ``(shape, axis)``: the same coordinate on every axis but ``axis`` (axial
  attention, Ho et al. 2019): ``axis=-1`` is a row, ``axis=-2`` a column, ``axis=0`` of a video
  the time line of one spatial position;
* :func:`same_frame` ``((T, H, W))``: the same ``t`` (space-only attention);
  :func:`same_position` ``((T, H, W))``: the same ``(h, w)`` (time-only attention; TimeSformer's
  divided space-time attention is one then the other);
* :func:`block_2d` ``(shape, size)``: the last two axes cut into windows of ``size`` cells,
  MaxViT's block attention (Tu et al. 2022, timm's ``window_partition``), within one frame;
* :func:`grid_2d` ``(shape, size)``: the last two axes cut into a sparse ``size`` grid, MaxViT's
  grid attention (timm's ``grid_partition``): rows ``ceil(H / size_h)`` apart share a group,
  so a group holds at most ``size_h x size_w`` cells (exactly that many when the sizes divide
  the shape), spread over the whole image.

The call must be self-attention over the whole grid (``N == M == prod(shape)``). Every
position sees itself, so no row is empty. :meth:`~attnlab.masks.Mask.block_kinds` is exact
without the ``N x M`` matrix: a tile is EMPTY when its query and key blocks share no group and
FULL when both hold one and the same group (per-block bitmaps of the ``G`` groups:
O((N / block_q) * G * (N / block_k)) work). Where every axis's groups are slabs of a reshape
(block and grid sizes divide the axes; axial, same-frame and same-position always),
:meth:`_Grid.regrouping` gives the view and permutation that turn the call into ``G``
independent attentions of ``S = N / G`` positions, which the ``regroup`` backend runs.

Nested spans (trees)
--------------------
Every token has a span ``[lo, hi]`` of positions that contains it; spans nest (two spans are
disjoint or one holds the other). Query ``i`` may see key ``j`` when ``j`` lies in ``i``'s span
or ``i`` lies in ``j``'s: a token sees the tokens of its own span (everything nested inside
it) and the tokens whose span encloses it (those of its enclosing spans), never a sibling
subtree. :func:`brackets` reads the spans from bracket tokens (ListOps' ``[MAX ... ]``),
:func:`tree` from a parent array, :func:`nested` takes them as they are. Tiles: EMPTY exactly
when no span of the query block meets the key block and none of the key block meets the query
block; FULL when every query's span covers the key block (or every key's the query block).

Shape legend: ``B`` batch, ``N`` positions (queries = keys), ``G`` groups, ``S`` positions per group.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Mask, _bidx, _blocks, _int_tensor, tile_kinds
from .kinds import grid_of, mask_kind

__all__ = ["axial", "same_frame", "same_position", "block_2d", "grid_2d", "nested", "brackets", "tree", "Regrouping"]

#: per-axis group rules of a grid mask: ``("all", 0)`` any coordinate, ``("same", 0)`` equal
#: coordinates, ``("block", b)`` equal ``c // b``, ``("grid", s)`` equal ``c % s``
_RULES = ("all", "same", "block", "grid")

#: most bitmap entries one step of the tile classification holds
_BITMAP_BUDGET = 1 << 24


@dataclass(frozen=True)
class Regrouping:
    """A grid mask as a reshape: ``x.view(B, H, *sizes, D)``, the ``group`` dims folded into the batch.

    Attributes:
        sizes: the grid's axes after splitting the block and grid axes in two.
        group: indices into ``sizes`` of the dims that tell groups apart (in front, with ``B``).
        within: indices into ``sizes`` of the dims inside one group (after the heads).
    """

    sizes: tuple[int, ...]
    group: tuple[int, ...]
    within: tuple[int, ...]

    @property
    def groups(self) -> int:
        """``G``, the number of groups."""
        return math.prod(self.sizes[g] for g in self.group)

    @property
    def size(self) -> int:
        """``S``, the positions of one group."""
        return math.prod(self.sizes[w] for w in self.within)

    def split(self, x: Tensor) -> Tensor:
        """``(B, H, N, D) -> (B * G, H, S, D)``: one batch row per (sequence, group)."""
        b, h, _, d = x.shape
        k = len(self.sizes)
        x = x.reshape(b, h, *self.sizes, d)  # (B, H, *sizes, D)
        order = [0, *(2 + g for g in self.group), 1, *(2 + w for w in self.within), 2 + k]
        return x.permute(order).reshape(b * self.groups, h, self.size, d)  # (B * G, H, S, D)

    def merge(self, y: Tensor, batch: int) -> Tensor:
        """``(B * G, H, S, D) -> (B, H, N, D)``, the inverse of :meth:`split`."""
        _, h, _, d = y.shape
        y = y.reshape(batch, *(self.sizes[g] for g in self.group), h, *(self.sizes[w] for w in self.within), d)
        at = {axis: 1 + i for i, axis in enumerate(self.group)}  # where each axis sits now
        at.update({axis: 2 + len(self.group) + i for i, axis in enumerate(self.within)})
        order = [0, 1 + len(self.group), *(at[a] for a in range(len(self.sizes))), y.dim() - 1]
        return y.permute(order).reshape(batch, h, self.groups * self.size, d)  # (B, H, N, D)

    def split_keys(self, keep: Tensor, batch: int) -> Tensor:
        """A key mask ``(B'|1, M)`` as the groups' key masks ``(B * G, 1, 1, S)``."""
        keep = keep.expand(batch, keep.shape[-1])  # (B, M)
        return self.split(keep[:, None, :, None]).reshape(batch * self.groups, 1, 1, self.size)


def _shape(shape, name: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    try:
        out = tuple(shape)
    except TypeError:
        raise ValueError(f"{name}: shape must be a tuple of positive ints, got {shape!r}") from None
    if len(out) not in dims or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in out):
        want = " or ".join(f"{d} positive ints" for d in dims)
        raise ValueError(f"{name}: shape must be {want} (the layout (H, W) or (T, H, W)), got {shape!r}")
    return out


def _size2(size, shape: tuple[int, ...], name: str) -> tuple[int, int]:
    """A window or grid size ``(sh, sw)`` for the last two axes of ``shape``, checked against them."""
    if isinstance(size, int) and not isinstance(size, bool):
        pair = (size, size)
    else:
        try:
            pair = tuple(size)
        except TypeError:
            pair = ()
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in pair):
        raise ValueError(f"{name}: size must be an int or a pair of ints, got {size!r}")
    h, w = shape[-2:]
    for s, axis, n in ((pair[0], "rows", h), (pair[1], "columns", w)):
        if not 1 <= s <= n:
            raise ValueError(f"{name}: size must be in [1, {n}] along the {axis} of shape {shape}, got size={size!r}")
    return pair  # type: ignore[return-value]


class _Grid(Mask):
    """A partition of a grid's positions into groups read per axis (see the module docstring)."""

    depends = frozenset({"q", "k"})

    def __init__(self, name: str, shape: tuple[int, ...], rules: tuple[tuple[str, int], ...], args: str):
        self.name, self.shape, self.rules, self.args = name, shape, rules, args
        self.n = math.prod(shape)
        self.strides = tuple(math.prod(shape[a + 1:]) for a in range(len(shape)))

    def validate(self, n_q, n_k):
        if n_q != self.n or n_k != self.n:
            raise ValueError(f"{self.name}: shape {self.shape} has {self.n} positions, but the call has N={n_q} "
                             f"queries and M={n_k} keys (a grid mask is self-attention over the whole grid)")

    def _axis_groups(self, p: Tensor) -> list[Tensor]:
        """Group id along every axis that restricts, for flat positions ``p``."""
        out = []
        for s, stride, (rule, size) in zip(self.shape, self.strides, self.rules):
            if rule == "all":
                continue
            c = torch.div(p, stride, rounding_mode="floor") % s  # coordinate on this axis
            out.append(c if rule == "same" else torch.div(c, size, rounding_mode="floor") if rule == "block"
                       else c % size)
        return out

    def _gid(self, p: Tensor) -> Tensor:
        """One group id per position of ``p`` (mixed radix over the restricting axes)."""
        gid = torch.zeros_like(p)
        restricting = [c for c, (rule, _) in zip(self._groups_per_axis(), self.rules) if rule != "all"]
        for g, count in zip(self._axis_groups(p), restricting):
            gid = gid * count + g
        return gid

    def allows(self, b, h, q, k, n_q, n_k):
        # the ids of the queries and of the keys, then one broadcast comparison (a tile of 256 x 256
        # compares once instead of once per axis)
        return self._gid(q) == self._gid(k)

    def _groups_per_axis(self) -> list[int]:
        counts = []
        for s, (rule, size) in zip(self.shape, self.rules):
            counts.append(1 if rule == "all" else s if rule == "same" else -(-s // size) if rule == "block" else size)
        return counts

    def group_ids(self, device=None) -> Tensor:
        """``(N,)`` the group of every position, one integer (mixed radix over the axes)."""
        return self._gid(torch.arange(self.n, device=device))

    def num_groups(self) -> int:
        """``G``: how many groups there are (some may be empty only in none: every id occurs)."""
        return math.prod(self._groups_per_axis())

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self.validate(n_q, n_k)
        gid = self.group_ids(device)  # (N,)
        n, groups = self.n, self.num_groups()
        qb = torch.div(torch.arange(n, device=device), block_q, rounding_mode="floor")  # (N,) query block of each
        kb = torch.div(torch.arange(n, device=device), block_k, rounding_mode="floor")
        nqb, nkb = int(qb[-1]) + 1, int(kb[-1]) + 1
        kmap = torch.zeros(nkb, groups, device=device)
        kmap[kb, gid] = 1.0  # (nkb, G): which groups each key block holds
        any_ = torch.empty(nqb, nkb, dtype=torch.bool, device=device)
        step = max(1, _BITMAP_BUDGET // groups)
        for r0 in range(0, nqb, step):  # query blocks in chunks: the bitmap stays within budget
            sel = (qb >= r0) & (qb < r0 + step)
            qmap = torch.zeros(min(step, nqb - r0), groups, device=device)
            qmap[qb[sel] - r0, gid[sel]] = 1.0  # (chunk, G)
            any_[r0:r0 + qmap.shape[0]] = (qmap @ kmap.T) > 0  # shared groups, counted exactly in float32
        qlo = torch.full((nqb,), n, device=device).scatter_reduce(0, qb, gid, "amin")
        qhi = torch.full((nqb,), -1, device=device).scatter_reduce(0, qb, gid, "amax")
        klo = torch.full((nkb,), n, device=device).scatter_reduce(0, kb, gid, "amin")
        khi = torch.full((nkb,), -1, device=device).scatter_reduce(0, kb, gid, "amax")
        full = ((qlo == qhi)[:, None] & (klo == khi)[None, :] & (qlo[:, None] == klo[None, :]))
        return tile_kinds(full, any_).view(1, 1, nqb, nkb)

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        return False  # every position sees itself

    def regrouping(self) -> Regrouping | None:
        """The reshape that makes this mask a batch of small dense attentions, or None when it is none."""
        sizes: list[int] = []
        group: list[int] = []
        within: list[int] = []
        for s, (rule, size) in zip(self.shape, self.rules):
            if rule in ("all", "same"):
                (within if rule == "all" else group).append(len(sizes))
                sizes.append(s)
                continue
            if s % size:
                return None  # ragged windows: not one reshape
            outer, inner = s // size, size
            # block: which window (outer) tells groups apart; grid: the offset (inner) does
            (group if rule == "block" else within).append(len(sizes))
            (within if rule == "block" else group).append(len(sizes) + 1)
            sizes += [outer, inner]
        return Regrouping(tuple(sizes), tuple(group), tuple(within))

    def __repr__(self):
        return f"{self.name}({self.args})"


# -- nested spans --------------------------------------------------------------------------------


class _Nested(Mask):
    """Query ``i`` sees key ``j`` when ``j`` is in ``i``'s span or ``i`` in ``j``'s (spans ``(B, N)``)."""

    depends = frozenset({"b", "q", "k"})

    def __init__(self, lo: Tensor, hi: Tensor, name: str):
        self.lo, self.hi, self.name = lo, hi, name  # (B, N) inclusive span of every position

    @property
    def batch_size(self):
        return self.lo.shape[0]

    def validate(self, n_q, n_k):
        n = self.lo.shape[1]
        if n_q != n or n_k != n:
            raise ValueError(f"{self.name}: the spans cover {n} positions, but the call has N={n_q} queries and "
                             f"M={n_k} keys (a nested mask is self-attention over those positions)")

    def allows(self, b, h, q, k, n_q, n_k):
        lo, hi = self.lo.to(q.device), self.hi.to(q.device)
        b = _bidx(b, lo.shape[0])
        return ((k >= lo[b, q]) & (k <= hi[b, q])) | ((q >= lo[b, k]) & (q <= hi[b, k]))

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self.validate(n_q, n_k)
        lo, hi = self.lo.to(device), self.hi.to(device)  # (B, N)

        def per_block(lo_: Tensor, hi_: Tensor, size: int, other: int):
            """Does each token's span meet / cover each block of ``other`` cut in ``size``: (B, N, nb)."""
            b0, b1 = _blocks(other, size, device)  # (nb,) first and last position of each block
            meets = (lo_[..., None] <= b1) & (hi_[..., None] >= b0)
            covers = (lo_[..., None] <= b0) & (hi_[..., None] >= b1)
            return meets, covers

        def reduce(x: Tensor, size: int, op: str) -> Tensor:
            """``(B, N, nb) -> (B, ceil(N / size), nb)``: any/all over the tokens of each block."""
            bsz, n, nb = x.shape
            nblocks = -(-n // size)
            pad = nblocks * size - n
            if pad:  # repeat the last token: changes neither any() nor all()
                x = torch.cat([x, x[:, -1:].expand(bsz, pad, nb)], dim=1)
            x = x.view(bsz, nblocks, size, nb)
            return x.any(2) if op == "any" else x.all(2)

        n = lo.shape[1]
        q_meets, q_covers = per_block(lo, hi, block_k, n)  # query tokens against key blocks (B, N, nkb)
        k_meets, k_covers = per_block(lo, hi, block_q, n)  # key tokens against query blocks (B, N, nqb)
        any_ = reduce(q_meets, block_q, "any") | reduce(k_meets, block_k, "any").transpose(1, 2)
        full = reduce(q_covers, block_q, "all") | reduce(k_covers, block_k, "all").transpose(1, 2)
        return tile_kinds(full, any_)[:, None]  # (B, 1, nqb, nkb)

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        return False  # every span holds its own token

    def to(self, device):
        return _Nested(self.lo.to(device), self.hi.to(device), self.name)

    def __repr__(self):
        return f"{self.name}(batch={self.lo.shape[0]}, positions={self.lo.shape[1]})"


# -- constructors: grids -------------------------------------------------------------------------


def _example_brackets(n: int) -> Mask:
    """A bracketed sequence of ``n`` tokens (1 opens, 2 closes, 0 is a leaf), fixed by ``n``."""
    rng, toks, depth = random.Random(n), [], 0
    for i in range(n):
        left = n - i
        if depth and (left == depth or rng.random() < 0.3):
            toks.append(2)
            depth -= 1
        elif left > depth + 1 and rng.random() < 0.4:
            toks.append(1)
            depth += 1
        else:
            toks.append(0)
    return brackets(torch.tensor(toks), opening=1, closing=2)


def _example_tree(n: int) -> Mask:
    """A random tree of ``n`` nodes listed in preorder, fixed by ``n``."""
    rng, parents, path = random.Random(n + 1), [], []
    for i in range(n):
        while path and rng.random() < 0.4:
            path.pop()
        parents.append(path[-1] if path else -1)
        path.append(i)
    return tree(parents)


@mask_kind(rows=lambda n: axial(grid_of(n, 2), -1), columns=lambda n: axial(grid_of(n, 2), 0),
           time=lambda n: axial(grid_of(n, 3), 0), video_rows=lambda n: axial(grid_of(n, 3), 2))
def axial(shape: Sequence[int], axis: int) -> Mask:
    """Axial attention along ``axis``: positions whose coordinates agree on every other axis.

    ``axial((H, W), -1)`` is the row of a position, ``axial((H, W), 0)`` its column;
    ``axial((T, H, W), 0)`` the time line of one spatial position (``same_position``).

    Raises:
        ValueError: for a shape that is not positive ints or an axis outside it.
    """
    shape = _shape(shape, "axial", (1, 2, 3, 4))
    d = len(shape)
    if not isinstance(axis, int) or isinstance(axis, bool) or not -d <= axis < d:
        raise ValueError(f"axial: axis must be an int in [{-d}, {d - 1}] for shape {shape}, got {axis!r}")
    axis %= d
    rules = tuple(("all", 0) if a == axis else ("same", 0) for a in range(d))
    return _Grid("axial", shape, rules, f"shape={shape}, axis={axis}")


@mask_kind(video=lambda n: same_frame(grid_of(n, 3)))
def same_frame(shape: Sequence[int]) -> Mask:
    """Space-only attention over ``(T, H, W)`` tokens: a position sees the ``H * W`` positions of its frame."""
    shape = _shape(shape, "same_frame", (3,))
    return _Grid("same_frame", shape, (("same", 0), ("all", 0), ("all", 0)), f"shape={shape}")


@mask_kind(video=lambda n: same_position(grid_of(n, 3)))
def same_position(shape: Sequence[int]) -> Mask:
    """Time-only attention over ``(T, H, W)`` tokens: a position sees the ``T`` frames' tokens at its ``(h, w)``."""
    shape = _shape(shape, "same_position", (3,))
    return _Grid("same_position", shape, (("all", 0), ("same", 0), ("same", 0)), f"shape={shape}")


def _example_windows(n: int, dims: int, fn, divide: bool = False):
    """``fn(shape, size)`` on a grid of ``n`` cells: sizes 2 x 3 (ragged windows), or the smallest that divide."""
    shape = grid_of(n, dims)
    if divide:
        size = tuple(min(d for d in range(2, s + 1) if s % d == 0) if s > 1 else 1 for s in shape[-2:])
    else:
        size = (min(2, shape[-2]), min(3, shape[-1]))
    return fn(shape, size)


@mask_kind(image=lambda n: _example_windows(n, 2, block_2d), video=lambda n: _example_windows(n, 3, block_2d),
           dividing=lambda n: _example_windows(n, 2, block_2d, divide=True))
def block_2d(shape: Sequence[int], size: int | tuple[int, int]) -> Mask:
    """MaxViT block attention: windows of ``size = (rows, columns)`` cells over the last two axes.

    ``shape`` is ``(H, W)`` or ``(T, H, W)`` (windows never cross frames). Windows at the
    right and bottom edges are smaller when ``size`` does not divide the shape.

    Raises:
        ValueError: for a size <= 0 or larger than the shape along its axis.
    """
    shape = _shape(shape, "block_2d", (2, 3))
    sh, sw = _size2(size, shape, "block_2d")
    rules = (("same", 0),) * (len(shape) - 2) + (("block", sh), ("block", sw))
    return _Grid("block_2d", shape, rules, f"shape={shape}, size={(sh, sw)}")


@mask_kind(image=lambda n: _example_windows(n, 2, grid_2d), video=lambda n: _example_windows(n, 3, grid_2d),
           dividing=lambda n: _example_windows(n, 3, grid_2d, divide=True))
def grid_2d(shape: Sequence[int], size: int | tuple[int, int]) -> Mask:
    """MaxViT grid attention: a sparse ``size = (rows, columns)`` grid of cells spread over the image.

    Cells whose rows are congruent modulo ``ceil(H / rows)`` and whose columns are congruent
    modulo ``ceil(W / columns)`` form one group of at most ``rows x columns`` cells (exactly
    that when ``size`` divides the shape: timm's ``grid_partition``). ``shape`` is ``(H, W)``
    or ``(T, H, W)`` (groups never cross frames).

    Raises:
        ValueError: for a size <= 0 or larger than the shape along its axis.
    """
    shape = _shape(shape, "grid_2d", (2, 3))
    sh, sw = _size2(size, shape, "grid_2d")
    h, w = shape[-2:]
    rules = (("same", 0),) * (len(shape) - 2) + (("grid", -(-h // sh)), ("grid", -(-w // sw)))
    return _Grid("grid_2d", shape, rules, f"shape={shape}, size={(sh, sw)}")


# -- constructors: trees ------------------------------------------------------------------------


def _rows(x, name: str) -> Tensor:
    t = _int_tensor(x, name, (1, 2))
    return t.unsqueeze(0) if t.ndim == 1 else t


def _example_spans(n: int) -> Mask:
    """The spans of :func:`_example_tree`'s tree, given to :func:`nested` as they are."""
    t = _example_tree(n)
    return nested(torch.stack([t.lo[0], t.hi[0]], dim=-1))


@mask_kind(spans=_example_spans)
def nested(spans) -> Mask:
    """A nested-span mask from the span ``[lo, hi]`` (inclusive) of every position.

    Args:
        spans: integer ``(N, 2)`` or ``(B, N, 2)``; position ``i``'s span must hold it
            (``0 <= lo <= i <= hi < N``). Spans should nest (:func:`brackets` and :func:`tree`
            make such); query ``i`` sees key ``j`` when ``j`` is in ``i``'s span or ``i`` in ``j``'s.

    Raises:
        ValueError: naming the first position whose span does not hold it.
    """
    t = _int_tensor(spans, "nested: spans", (2, 3))
    if t.shape[-1] != 2:
        raise ValueError(f"nested: spans must have shape (N, 2) or (B, N, 2), got {tuple(t.shape)}")
    t = t.unsqueeze(0) if t.ndim == 2 else t
    lo, hi = t[..., 0], t[..., 1]  # (B, N)
    n = t.shape[1]
    pos = torch.arange(n, device=t.device)
    bad = ~((lo >= 0) & (lo <= pos) & (pos <= hi) & (hi < n))
    if bool(bad.any()):
        b, i = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"nested: spans[{b}][{i}] = [{int(lo[b, i])}, {int(hi[b, i])}] must hold position {i} "
                         f"within [0, {n - 1}]")
    return _Nested(lo, hi, "nested")


def _id_set(ids, name: str) -> set[int]:
    vals = [ids] if isinstance(ids, int) and not isinstance(ids, bool) else list(ids)
    if not vals or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        raise ValueError(f"brackets: {name} must be a token id or a sequence of token ids, got {ids!r}")
    return set(vals)


@mask_kind(tokens=_example_brackets)
def brackets(tokens, opening: int | Sequence[int], closing: int | Sequence[int]) -> Mask:
    """The nested-span mask of a bracketed token sequence (ListOps' ``[MAX 2 [MIN 4 7 ] 0 ]``).

    A bracket pair spans from its opening to its closing token; every token's span is that of
    the innermost pair holding it (a pair's own two tokens included). Tokens outside every
    pair (a classification token, padding) span the whole sequence, so they see and are seen
    by every token: combine with a key mask to hide padding.

    Args:
        tokens: integer ``(N,)`` or ``(B, N)`` token ids.
        opening: the id (or ids: ListOps has one per operator) that opens a pair.
        closing: the id (or ids) that closes one.

    Raises:
        ValueError: for unbalanced brackets, naming the row and position.
    """
    rows = _rows(tokens, "brackets: tokens")
    opens, closes = _id_set(opening, "opening"), _id_set(closing, "closing")
    if opens & closes:
        raise ValueError(f"brackets: opening and closing ids must differ, both hold {sorted(opens & closes)}")
    n = rows.shape[1]
    lo = torch.zeros(rows.shape, dtype=torch.long)
    hi = torch.full(rows.shape, n - 1, dtype=torch.long)
    for b, row in enumerate(rows.tolist()):
        stack: list[int] = []
        owner = [-1] * n  # the opening position of the innermost pair holding each token
        close_of: dict[int, int] = {}
        for i, tok in enumerate(row):
            if tok in opens:
                stack.append(i)
                owner[i] = i
            elif tok in closes:
                if not stack:
                    raise ValueError(f"brackets: unbalanced tokens in row {b}: the closing token at position {i} "
                                     f"has no opening one")
                owner[i] = stack.pop()
                close_of[owner[i]] = i
            else:
                owner[i] = stack[-1] if stack else -1
        if stack:
            raise ValueError(f"brackets: unbalanced tokens in row {b}: the opening token at position {stack[-1]} "
                             f"is never closed")
        lo[b] = torch.tensor([o if o >= 0 else 0 for o in owner])
        hi[b] = torch.tensor([close_of[o] if o >= 0 else n - 1 for o in owner])
    return _Nested(lo.to(rows.device), hi.to(rows.device), "brackets")


@mask_kind(parents=_example_tree)
def tree(parents) -> Mask:
    """The nested-span mask of a tree whose nodes are the positions: a node sees its subtree and its ancestors.

    Args:
        parents: integer ``(N,)`` or ``(B, N)``: the parent position of each node, ``-1`` for
            a root. Nodes are listed in preorder (every node after its parent and its
            subtree contiguous), so node ``i``'s subtree is the span ``[i, last descendant]``.

    Raises:
        ValueError: for a parent index outside ``[-1, N - 1]``, a node its own parent, or a
            listing that is not preorder, naming the row and node.
    """
    rows = _rows(parents, "tree: parents")
    n = rows.shape[1]
    lo = torch.arange(n).expand(rows.shape[0], n).clone()
    hi = torch.empty(rows.shape, dtype=torch.long)
    for b, row in enumerate(rows.tolist()):
        path: list[int] = []  # the ancestors of the node before this one, root first
        for i, p in enumerate(row):
            if not -1 <= p < n:
                raise ValueError(f"tree: parents[{b}][{i}] = {p} is out of range: a parent index must be in "
                                 f"[-1, {n - 1}] (-1 for a root)")
            if p == i:
                raise ValueError(f"tree: parents[{b}][{i}] = {i}: a node cannot be its own parent")
            while path and path[-1] != p:
                path.pop()
            if p != -1 and not path:
                raise ValueError(f"tree: parents[{b}][{i}] = {p} is not an ancestor of node {i - 1}: list the nodes "
                                 f"in preorder (each subtree contiguous, every node after its parent)")
            path.append(i)
        end = list(range(n))
        for i in range(n - 1, -1, -1):  # the last descendant of every node
            if row[i] >= 0:
                end[row[i]] = max(end[row[i]], end[i])
        hi[b] = torch.tensor(end)
    return _Nested(lo.to(rows.device), hi.to(rows.device), "tree")
