"""Graph masks: attention along the edges of a graph, ``masks.graph(edge_index)``.

The edge list follows PyTorch Geometric's source -> target convention: ``edge_index`` is
``(2, E)``, row 0 the source nodes ``j`` and row 1 the target nodes ``i``, and the edge
``j -> i`` lets node ``i`` attend to node ``j``. Queries are the target nodes (``N`` of
them), keys the source nodes (``M``); a plain graph has ``N == M``, a bipartite one
(``num_nodes=(num_src, num_dst)``) may have ``N != M``. Node positions are node ids:
the bottom-right alignment of the position masks does not apply.

As a mask the graph is a set of allowed ``(i, j)`` pairs: an edge given twice is allowed
once (``dense`` and every dense backend see one score per pair). :meth:`GraphMask.csr`
sorts the edges by target, the rows of the sparse ``N x M`` pattern, for the ``edges``
backend (:mod:`attnlab.exact.edges`); with ``collapse=False`` it keeps every edge
(a multigraph, each edge with its own weight), which is what graph layers such as GAT
compute on.

* ``allows`` reads a cached ``N x M`` boolean table up to :data:`TABLE_LIMIT` entries (a
  pointwise lookup, which FlexAttention compiles), else looks pairs up in the sorted edge
  codes ``i * M + j`` (a binary search);
* ``block_kinds`` counts the edges per tile, O(E), so ``chunked`` skips the empty tiles
  without building ``N x M``;
* ``dense`` builds the ``N x M`` boolean only up to :data:`DENSE_LIMIT` entries (above that
  it raises: the ``edges`` backend computes such a graph on its edges).

An empty edge list is allowed: every query row is then empty and attention returns zeros.
Time O(E log E) to build the sorted forms (once per mask and size); memory O(E).
Shape legend: ``E`` edges, ``N`` target (query) nodes, ``M`` source (key) nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import EMPTY, FULL, PARTIAL, Mask

__all__ = ["DENSE_LIMIT", "TABLE_LIMIT", "EdgeCSR", "GraphMask", "graph"]

#: the most ``N x M`` entries :meth:`GraphMask.dense` materializes (256 Mi booleans, as SDPA's limit)
DENSE_LIMIT = 1 << 28
#: up to this many ``N x M`` entries ``allows`` reads a cached boolean table (a pointwise lookup, which
#: FlexAttention's mask_mod can compile); above it, a binary search in the sorted edge codes
TABLE_LIMIT = 1 << 24


@dataclass(frozen=True)
class EdgeCSR:
    """A graph's edges sorted by target (the rows of the sparse ``N x M`` pattern), then by source.

    Two views of the same edges: the **edges** (``E`` of them, duplicates kept unless collapsed,
    each with its own score and weight) and the **pattern** (the ``U`` distinct pairs ``(i, j)``,
    a valid CSR matrix with sorted, unique columns per row, which the sparse products read).

    Attributes:
        num_dst, num_src: ``N`` targets and ``M`` sources.
        src, dst: ``(E,)`` int64 source and target of each edge, sorted by ``(target, source)``
            (stably: duplicates keep their given order).
        order: ``(E,)`` int64, sorted edge ``e`` is column ``order[e]`` of the ``edge_index``
            given; None when duplicates were collapsed (the edges are then the pattern).
        counts: ``(N,)`` int64 edges into each target (duplicates counted).
        group: ``(E,)`` int64 pattern entry of each edge, or None when every pair occurs once.
        multiplicity: ``(U,)`` int64 edges per pattern entry (consecutive in the edge order), or None.
        crow, col: the pattern's CSR row pointers ``(N+1,)`` and columns (sources) ``(U,)``, int32
            while the sizes fit (the sparse kernels then take them without a copy), else int64.
        t_order: ``(U,)`` int64, the pattern sorted by source: its entry ``u`` is entry ``t_order[u]``.
        t_crow, t_col: CSR of the transposed pattern (rows = sources, columns = targets).
    """

    num_dst: int
    num_src: int
    src: Tensor
    dst: Tensor
    order: Tensor | None
    counts: Tensor
    group: Tensor | None
    multiplicity: Tensor | None
    crow: Tensor
    col: Tensor
    t_order: Tensor
    t_crow: Tensor
    t_col: Tensor

    @property
    def num_edges(self) -> int:
        """``E``: the edges (duplicates counted unless collapsed)."""
        return int(self.src.shape[0])

    @property
    def num_pairs(self) -> int:
        """``U``: the distinct ``(target, source)`` pairs."""
        return int(self.col.shape[0])

    @property
    def device(self) -> torch.device:
        return self.src.device


def _rowptr(counts: Tensor, dtype: torch.dtype) -> Tensor:
    out = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts, 0, out=out[1:])
    return out.to(dtype)


def build_csr(codes: Tensor, stride: int, num_src: int, num_dst: int, order: Tensor | None) -> EdgeCSR:
    """The :class:`EdgeCSR` of sorted edge codes ``i * stride + j`` (duplicates adjacent)."""
    uniq, mult = torch.unique_consecutive(codes, return_counts=True)  # the pattern, (U,)
    dst, src = codes // stride, codes % stride  # (E,)
    dst_u, src_u = uniq // stride, uniq % stride  # (U,)
    dup = uniq.shape[0] != codes.shape[0]
    index_dtype = torch.int32 if max(codes.shape[0], num_src, num_dst) < 2**31 - 1 else torch.int64
    t_order = torch.argsort(src_u, stable=True)  # (U,)
    return EdgeCSR(
        num_dst=num_dst, num_src=num_src, src=src, dst=dst, order=order,
        counts=torch.bincount(dst, minlength=num_dst),
        group=torch.repeat_interleave(torch.arange(uniq.shape[0], device=codes.device), mult) if dup else None,
        multiplicity=mult if dup else None,
        crow=_rowptr(torch.bincount(dst_u, minlength=num_dst), index_dtype), col=src_u.to(index_dtype),
        t_order=t_order, t_crow=_rowptr(torch.bincount(src_u, minlength=num_src), index_dtype),
        t_col=dst_u[t_order].to(index_dtype))


class GraphMask(Mask):
    """Node ``i`` may attend to node ``j`` for each edge ``j -> i`` of ``edge_index`` (see :func:`graph`)."""

    depends = frozenset({"q", "k"})

    def __init__(self, edge_index: Tensor, num_src: int | None, num_dst: int | None, src_end: int, dst_end: int):
        self.edge_index = edge_index  # (2, E) int64, as given
        self.num_src, self.num_dst = num_src, num_dst  # None: the call's M and N
        self.src_end, self.dst_end = src_end, dst_end  # one past the largest source / target id (host ints)
        # derived forms, built on first use: "codes", ("csr", sizes...), "table" (one dict, so that what
        # describes the mask's structure, its plain attributes, does not change as they are built)
        self._cache: dict = {}

    # -- sizes ---------------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        """Edges as given (duplicates counted)."""
        return int(self.edge_index.shape[1])

    def sizes(self, n_q: int | None = None, n_k: int | None = None) -> tuple[int, int]:
        """``(num_dst, num_src)``: the given sizes, else the call's ``(n_q, n_k)``, else one past the largest ids."""
        nd = self.num_dst if self.num_dst is not None else (n_q if n_q is not None else self.dst_end)
        ns = self.num_src if self.num_src is not None else (n_k if n_k is not None else self.src_end)
        return nd, ns

    def validate(self, n_q: int, n_k: int) -> None:
        if self.num_dst is not None and n_q != self.num_dst:
            raise ValueError(f"masks.graph: num_nodes gives {self.num_dst} target nodes but the call has N={n_q} "
                             f"queries (one per target node)")
        if self.num_src is not None and n_k != self.num_src:
            raise ValueError(f"masks.graph: num_nodes gives {self.num_src} source nodes but the call has M={n_k} "
                             f"keys (one per source node)")
        if self.dst_end > n_q:
            raise ValueError(f"masks.graph: edge_index holds target node id {self.dst_end - 1} but the call has "
                             f"N={n_q} queries (target ids must be < N)")
        if self.src_end > n_k:
            raise ValueError(f"masks.graph: edge_index holds source node id {self.src_end - 1} but the call has "
                             f"M={n_k} keys (source ids must be < M)")

    # -- the sorted forms ------------------------------------------------------------------
    def _stride(self) -> int:
        return max(self.src_end, 1)  # codes i * stride + j: unique for every edge's source j < src_end

    def codes(self) -> Tensor:
        """Sorted unique int64 codes ``i * S + j`` of the allowed pairs (``S`` one past the largest source id)."""
        if "codes" not in self._cache:
            src, dst = self.edge_index
            self._cache["codes"] = torch.unique(dst * self._stride() + src)  # sorted
        return self._cache["codes"]

    def has_duplicates(self) -> bool:
        """True when some edge ``j -> i`` is given more than once."""
        return self.codes().shape[0] != self.num_edges

    def csr(self, n_q: int | None = None, n_k: int | None = None, *, collapse: bool = True) -> EdgeCSR:
        """The edges sorted by target for a call with ``n_q`` targets and ``n_k`` sources (cached).

        ``collapse`` keeps each allowed pair once (the mask's meaning, what ``attention``
        computes); ``collapse=False`` keeps every edge, duplicates too, with
        :attr:`EdgeCSR.order` mapping back to the given columns.
        """
        nd, ns = self.sizes(n_q, n_k)
        if n_q is not None and n_k is not None:
            self.validate(n_q, n_k)
        key = ("csr", nd, ns, collapse and self.has_duplicates())
        if key not in self._cache:
            if key[3]:
                codes, order = self.codes(), None
            else:
                given = self.edge_index[1] * self._stride() + self.edge_index[0]  # (E,)
                order = torch.argsort(given, stable=True)
                codes = given[order]
            self._cache[key] = build_csr(codes, self._stride(), ns, nd, order)
        return self._cache[key]

    # -- the Mask questions ------------------------------------------------------------------
    def allows(self, b, h, q, k, n_q, n_k):
        if n_q * n_k <= TABLE_LIMIT:
            key = ("table", n_q, n_k, q.device)
            if key not in self._cache:
                self._cache[key] = self.dense(n_q, n_k, device=q.device)[0, 0]
            table = self._cache[key]
            inside = (q >= 0) & (q < n_q) & (k >= 0) & (k < n_k)
            return table[q.clamp(0, n_q - 1), k.clamp(0, n_k - 1)] & inside
        codes = self.codes().to(q.device)
        s = self._stride()
        want = q * s + torch.clamp(k, max=s - 1)  # (broadcast shape)
        pos = torch.searchsorted(codes, want.reshape(-1)).clamp_(max=max(codes.shape[0] - 1, 0))
        found = codes[pos].view(want.shape) == want if codes.numel() else torch.zeros_like(want, dtype=torch.bool)
        return found & (k < s) & (k >= 0) & (q >= 0)

    def dense(self, n_q, n_k, device=None, batch=None, heads=None):
        self.validate(n_q, n_k)
        if n_q * n_k > DENSE_LIMIT:
            raise ValueError(f"masks.graph: a dense {n_q} x {n_k} mask would hold {n_q * n_k:,} entries (more than "
                             f"{DENSE_LIMIT:,}); the 'edges' backend computes a graph of this size on its edges")
        device = self.edge_index.device if device is None else device
        out = torch.zeros(n_q, n_k, dtype=torch.bool, device=device)
        codes = self.codes().to(device)
        out[codes // self._stride(), codes % self._stride()] = True
        return out.view(1, 1, n_q, n_k)

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self.validate(n_q, n_k)
        device = self.edge_index.device if device is None else device
        nqb, nkb = math.ceil(n_q / block_q), math.ceil(n_k / block_k)
        codes = self.codes().to(device)
        tq, tk = codes // self._stride() // block_q, codes % self._stride() // block_k
        count = torch.bincount(tq * nkb + tk, minlength=nqb * nkb).view(nqb, nkb)  # edges per tile
        rows = torch.clamp(n_q - torch.arange(nqb, device=device) * block_q, max=block_q)  # (nqb,)
        cols = torch.clamp(n_k - torch.arange(nkb, device=device) * block_k, max=block_k)  # (nkb,)
        kinds = torch.full((nqb, nkb), PARTIAL, dtype=torch.int8, device=device)
        kinds[count == 0] = EMPTY
        kinds[count == rows[:, None] * cols[None, :]] = FULL
        return kinds.view(1, 1, nqb, nkb)

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        self.validate(n_q, n_k)
        return bool((torch.bincount(self.edge_index[1], minlength=n_q) == 0).any())

    def density(self, n_q: int | None = None, n_k: int | None = None) -> float:
        """Allowed pairs over ``N x M``."""
        nd, ns = self.sizes(n_q, n_k)
        return self.codes().shape[0] / max(nd * ns, 1)

    def to(self, device):
        if torch.device(device) == self.edge_index.device:
            return self
        return GraphMask(self.edge_index.to(device), self.num_src, self.num_dst, self.src_end, self.dst_end)

    def __repr__(self):
        sizes = "" if self.num_dst is None else (
            f", num_nodes={self.num_dst}" if self.num_src == self.num_dst else
            f", num_nodes=({self.num_src}, {self.num_dst})")
        return f"graph(edges={self.num_edges}{sizes})"


def _size(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"masks.graph: {name} must be an int >= 1, got {value!r}")
    return value


def graph(edge_index, num_nodes: int | tuple[int, int] | None = None) -> GraphMask:
    """Attention along a graph's edges: node ``i`` may attend to node ``j`` for each edge ``j -> i``.

    PyTorch Geometric's source -> target convention: ``edge_index[0]`` holds the sources
    ``j`` (keys), ``edge_index[1]`` the targets ``i`` (queries), and messages flow from
    source to target. Combine with other masks with ``&`` and ``|`` as usual.

    Args:
        edge_index: integer ``(2, E)`` tensor (or nested list) of node ids ``>= 0``. ``E = 0`` is
            allowed: every query row is then empty and attention returns zeros.
        num_nodes: the node count ``N`` (queries and keys alike), or ``(num_src, num_dst)`` for
            a bipartite graph (PyG's ``size``), or None to take the call's sizes (node ids must
            then be below them).

    Raises:
        ValueError: naming ``edge_index`` (wrong shape or dtype, a negative id, an id at or
            above ``num_nodes``) or ``num_nodes`` (not a positive int or pair).
    """
    ei = torch.as_tensor(edge_index)
    if ei.dtype.is_floating_point or ei.dtype.is_complex or ei.dtype == torch.bool:
        raise ValueError(f"masks.graph: edge_index must hold integer node ids (int64 or int32), got dtype {ei.dtype}")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise ValueError(f"masks.graph: edge_index must have shape (2, E) (row 0 the source nodes, row 1 the "
                         f"targets), got shape {tuple(ei.shape)}")
    ei = ei.long()
    if num_nodes is None:
        num_src = num_dst = None
    elif isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"masks.graph: num_nodes must be an int or a pair (num_src, num_dst), got {num_nodes!r}")
        num_src, num_dst = _size(num_nodes[0], "num_nodes[0] (sources)"), _size(num_nodes[1], "num_nodes[1] (targets)")
    else:
        num_src = num_dst = _size(num_nodes, "num_nodes")
    host = ei.cpu()  # one copy (a sync for a GPU tensor): every size below is a host int
    if host.numel() and int(host.min()) < 0:
        col = int((host < 0).any(0).nonzero()[0])
        raise ValueError(f"masks.graph: edge_index holds a negative node id ({int(host[:, col].min())}, in column "
                         f"{col}); node ids are 0 .. num_nodes - 1")
    src_end = int(host[0].max()) + 1 if host.shape[1] else 0
    dst_end = int(host[1].max()) + 1 if host.shape[1] else 0
    for end, bound, what, row in ((src_end, num_src, "source", 0), (dst_end, num_dst, "target", 1)):
        if bound is not None and end > bound:
            col = int((host[row] >= bound).nonzero()[0])
            given = num_nodes if isinstance(num_nodes, int) else tuple(num_nodes)
            raise ValueError(f"masks.graph: edge_index holds {what} node id {int(host[row, col])} (column {col}) but "
                             f"num_nodes={given} gives {bound} {what} nodes (ids must be < {bound})")
    return GraphMask(ei, num_src, num_dst, src_end, dst_end)
