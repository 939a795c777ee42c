"""Graph attention layers with PyTorch Geometric's signatures: GATConv, GATv2Conv, TransformerConv.

* GAT: Veličković et al., "Graph Attention Networks" (ICLR 2018): score
  ``e_ij = LeakyReLU(a_dst . W h_i + a_src . W h_j)``, weights a softmax over the neighbours
  ``j`` of ``i`` (its incoming edges, self-loop added), output ``sum_j w_ij W h_j``.
* GATv2: Brody, Alon, Yahav, "How Attentive are Graph Attention Networks?" (ICLR 2022):
  ``e_ij = a . LeakyReLU(W_r h_i + W_l h_j)``, which is "dynamic": the ranking of the
  neighbours can differ from one target to another, while GAT's is the same for every target.
* TransformerConv: Shi et al., "Masked Label Prediction" (IJCAI 2021): scaled dot-product
  ``q_i . k_j / sqrt(C)`` over the neighbours, with a root (skip) connection, optionally
  gated by ``beta``.

Each follows PyG's conventions (constructor arguments, parameter names, ``forward(x,
edge_index, return_attention_weights)``, source -> target edges, self-loops removed then
appended for nodes ``0 .. min(N_src, N_dst) - 1``, bipartite ``x=(x_src, x_dst)``; features
may also be a sparse tensor, projected in O(nnz)), and
``from_pyg(module)`` copies a PyG layer's weights. With ``return_attention_weights=True``
the forward returns ``(out, (edge_index, weights))``: the edge list the layer attended over
(with its self-loops) and one weight per edge and head, ``(E, H)``, column for column.
They are the weights before dropout (PyG returns them after it; in eval mode they agree).
An empty edge list is allowed: GAT layers then attend to the self-loops alone (with
``add_self_loops=False`` the output is the bias), TransformerConv's attention part is zero.

The attention runs on the ``edges`` kernel (:func:`attnlab.exact.edges.attend_edges`): the
score enters as a per-edge bias ``(E, H)`` (GAT's and GATv2's additive scores, with no
``q . k`` term) or as ``q`` and ``k`` (TransformerConv). A bias rather than a score function
keeps the kernel one formula: the gradient it returns for the bias is ``d loss / d score``,
and autograd carries it into whatever computed the score, so every score form (and edge
features later) composes without the kernel knowing it. Memory is O(E H) for GAT and
TransformerConv; GATv2's score itself, ``LeakyReLU(W_r h_i + W_l h_j)``, is O(E H C) under
autograd, as in PyG.

Time per layer O(N F H C + E H C); shape legend: ``N`` nodes (``N_src`` sources, ``N_dst``
targets), ``F`` input features, ``H`` heads, ``C`` channels per head, ``E`` edges.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..exact.edges import attend_edges
from ..masks import EdgeCSR, graph
from ..utils import positive_int

__all__ = ["GATConv", "GATv2Conv", "TransformerConv", "project"]


def _glorot(t: Tensor) -> None:
    """PyG's glorot: uniform in +-sqrt(6 / (size(-2) + size(-1)))."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


def _linear(n_in: int, n_out: int, bias: bool, glorot: bool) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=bias)  # bias ~ U(+-1/sqrt(n_in)), as PyG's Linear
    if glorot:
        _glorot(lin.weight)
    return lin


#: the layouts a layer's input features may have: dense, or sparse (bag-of-words features are ~1% nonzero)
_LAYOUTS = (torch.strided, torch.sparse_csr, torch.sparse_coo)


def project(lin: nn.Linear, x: Tensor) -> Tensor:
    """``lin(x)`` for dense or sparse ``x (N, F)``; a sparse product costs O(nnz), not O(N F).

    Cora's features: 3.4 ms instead of 22 ms for the first layer's projection, forward and backward.
    """
    if x.layout == torch.strided:
        return lin(x)
    out = torch.sparse.mm(x, lin.weight.t())  # (N, out)
    return out if lin.bias is None else out + lin.bias


def _channels(value, name: str) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in pair):
        raise ValueError(f"{name} must be a positive int or a (source, target) pair of them, got {value!r}")
    return pair  # type: ignore[return-value]



def _edge_list(edge_index, n_src: int, n_dst: int, self_loops: bool, name: str) -> tuple[Tensor, EdgeCSR, Tensor]:
    """``(edge list attended over (2, E), its edges sorted by target, inverse of the sort (E,))``; ``name`` the layer's."""
    try:
        g = graph(edge_index, num_nodes=(n_src, n_dst))
    except ValueError as e:
        raise ValueError(f"{name}: {e} (the node counts are x's rows: {n_src} sources, {n_dst} targets)") from None
    ei = g.edge_index
    if self_loops:  # PyG's remove_self_loops, then add_self_loops(num_nodes=min(N_src, N_dst)), in that order
        ei = ei[:, ei[0] != ei[1]]
        loops = torch.arange(min(n_src, n_dst), device=ei.device)
        ei = torch.cat([ei, torch.stack([loops, loops])], dim=1)
        g = graph(ei, num_nodes=(n_src, n_dst))
    csr = g.csr(n_dst, n_src, collapse=False)
    inv = torch.empty_like(csr.order)
    inv[csr.order] = torch.arange(csr.num_edges, device=inv.device)
    return ei, csr, inv


@torch.library.custom_op("attnlab::graph_edges", mutates_args=(),
                         schema="(Tensor edge_index, int num_src, int num_dst, bool self_loops, str name) -> Tensor[]")
def _graph_edges_op(edge_index, num_src, num_dst, self_loops, name):
    """:func:`_edge_list` as tensors: ``[edge list, inverse, src, dst, counts, group, multiplicity, crow, col,
    t_order, t_crow, t_col]``; group and multiplicity always (one entry per edge when no edge repeats), int64 indices."""
    ei, csr, inv = _edge_list(edge_index, num_src, num_dst, self_loops, name)
    E, U = csr.num_edges, csr.num_pairs
    group = csr.group if csr.group is not None else torch.arange(E, device=ei.device)
    mult = csr.multiplicity if csr.multiplicity is not None else torch.ones(U, dtype=torch.long, device=ei.device)
    out = [ei, inv, csr.src, csr.dst, csr.counts, group, mult, csr.crow, csr.col, csr.t_order, csr.t_crow, csr.t_col]
    return [t.long().clone() for t in out]  # fresh tensors: a custom op's outputs alias neither inputs nor each other


@_graph_edges_op.register_fake
def _(edge_index, num_src, num_dst, self_loops, name):
    ctx = torch.library.get_ctx()
    E, U = ctx.new_dynamic_size(), ctx.new_dynamic_size()  # edges (self-loops added) and distinct pairs: data's
    new = (lambda *shape: edge_index.new_empty(shape, dtype=torch.long))  # noqa: E731
    return [new(2, E), new(E), new(E), new(E), new(num_dst), new(E), new(U), new(num_dst + 1), new(U), new(U),
            new(num_src + 1), new(U)]


def _traced_edges(edge_index, n_src: int, n_dst: int, self_loops: bool, name: str) -> tuple[Tensor, EdgeCSR, Tensor]:
    """:func:`_edge_list` inside ``torch.compile``: one custom op (sizes that depend on the edges' values)."""
    ei, inv, src, dst, counts, group, mult, crow, col, t_order, t_crow, t_col = torch.ops.attnlab.graph_edges(
        torch.as_tensor(edge_index), n_src, n_dst, self_loops, name)
    csr = EdgeCSR(num_dst=n_dst, num_src=n_src, src=src, dst=dst, order=None, counts=counts, group=group,
                  multiplicity=mult, crow=crow, col=col, t_order=t_order, t_crow=t_crow, t_col=t_col)
    return ei, csr, inv


class _GraphConv(nn.Module):
    """What the three layers share: input checks, the edge list (cached per input tensor), dropout masks."""

    def __init__(self, in_channels, out_channels: int, heads: int, concat: bool, dropout: float,
                 message_dropout: float = 0.0):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = positive_int(out_channels, "out_channels")
        self.heads = positive_int(heads, "heads")
        self.concat = bool(concat)
        for name, p in (("dropout", dropout), ("message_dropout", message_dropout)):
            if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p!r}")
        self.dropout = float(dropout)
        self.message_dropout = float(message_dropout)
        self._cache: tuple | None = None

    def _inputs(self, x) -> tuple[Tensor, Tensor, bool]:
        """``(x_src, x_dst, bipartite)`` after checking shapes against ``in_channels``."""
        src_c, dst_c = _channels(self.in_channels, "in_channels")
        pair = isinstance(x, (tuple, list))
        if pair and len(x) != 2:
            raise ValueError(f"{type(self).__name__}: x must be a tensor or a pair (x_src, x_dst), got {len(x)} items")
        xs, xd = (x[0], x[1]) if pair else (x, x)
        for t, c, what in ((xs, src_c, "x_src" if pair else "x"), (xd, dst_c, "x_dst")):
            if not isinstance(t, Tensor) or t.ndim != 2 or not t.dtype.is_floating_point or t.shape[1] != c \
                    or t.layout not in _LAYOUTS:
                got = (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__)
                raise ValueError(f"{type(self).__name__}: {what} must be a floating-point (num_nodes, {c}) tensor, "
                                 f"got {got}")
        return xs, xd, pair

    def _edges(self, edge_index, n_src: int, n_dst: int, self_loops: bool) -> tuple[Tensor, EdgeCSR, Tensor]:
        """``(edge list attended over, its edges sorted by target, inverse of the sort)``; cached for one input tensor.

        The cache holds while the same ``edge_index`` tensor comes back unmodified (a weak
        reference and its version counter), as in full-batch training. Inside ``torch.compile``
        the op ``attnlab::graph_edges`` builds them on every call (no cache).
        """
        name = type(self).__name__
        if torch.compiler.is_compiling():
            return _traced_edges(edge_index, n_src, n_dst, self_loops, name)
        key = (n_src, n_dst, self_loops)
        if self._cache is not None:
            ref, version, k, value = self._cache
            if ref() is edge_index and k == key and getattr(edge_index, "_version", None) == version:
                return value
        value = _edge_list(edge_index, n_src, n_dst, self_loops, name)
        if isinstance(edge_index, Tensor):
            self._cache = (weakref.ref(edge_index), edge_index._version, key, value)
        return value

    def _keep(self, csr: EdgeCSR, like: Tensor) -> Tensor | None:
        """Dropout multipliers ``(E, H)`` of the attention weights in training, else None."""
        if not (self.training and self.dropout > 0):
            return None
        p = self.dropout
        # uniform draws and a compare: 8x faster than bernoulli_ on CPU (106k weights: 0.25 vs 2.1 ms)
        keep = torch.rand(csr.src.shape[0], self.heads, device=like.device) >= p  # (E, H); a shape compile traces
        return keep.to(like.dtype).mul_(1.0 / (1.0 - p))

    def _messages(self, h: Tensor) -> Tensor:
        """The sources' messages ``(N_src, H, C)`` as ``(H, N_src, C)``, after ``message_dropout`` in training."""
        h = F.dropout(h, self.message_dropout, self.training) if self.message_dropout else h
        return h.transpose(0, 1).contiguous()

    def _heads_out(self, out: Tensor) -> Tensor:
        """``(H, N, C)`` -> ``(N, H*C)`` (concat) or ``(N, C)`` (mean over heads)."""
        out = out.transpose(0, 1)  # (N, H, C)
        return out.reshape(out.shape[0], -1) if self.concat else out.mean(dim=1)

    @staticmethod
    def _result(out: Tensor, ei: Tensor, w: Tensor, inv: Tensor, with_weights: bool):
        """``out``, or ``(out, (edge_index with self-loops, weights (E, H) in its column order))``."""
        return (out, (ei, w.index_select(0, inv))) if with_weights else out

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = None  # a weak reference does not pickle (deepcopy, DDP)
        return state

    # -- from PyG -------------------------------------------------------------------------
    @classmethod
    def _check_pyg(cls, module, pyg_name: str, unsupported: dict) -> None:
        if type(module).__name__ != pyg_name:
            raise ValueError(f"{cls.__name__}.from_pyg needs a torch_geometric {pyg_name}, got {type(module).__name__}")
        for attr, ok in unsupported.items():
            val = getattr(module, attr, None)
            if val not in ok:
                raise ValueError(f"{cls.__name__}.from_pyg: {pyg_name} with {attr}={val!r} is not supported "
                                 f"(supported: {sorted(map(repr, ok))})")
        ch = module.in_channels
        if any(c is None or c <= 0 for c in (ch if isinstance(ch, (tuple, list)) else (ch,))):
            raise ValueError(f"{cls.__name__}.from_pyg: in_channels={ch!r} (lazy); run the PyG layer once first")
        if getattr(module, "aggr", "add") not in ("add", "sum"):
            raise ValueError(f"{cls.__name__}.from_pyg: aggr={module.aggr!r} is not supported (only sum aggregation)")

    def _load_pyg(self, module) -> None:
        own = self.state_dict()
        theirs = {k: v for k, v in module.state_dict().items() if k in own}
        missing = sorted(set(own) - set(theirs))
        if missing:
            raise ValueError(f"{type(self).__name__}.from_pyg: the PyG layer has no {missing}")
        ref = next(iter(theirs.values()))
        self.to(device=ref.device, dtype=ref.dtype)
        self.load_state_dict(theirs, strict=True)
        self.train(module.training)


class GATConv(_GraphConv):
    """Graph attention (GAT), PyG's ``GATConv`` without edge features or residual.

    Args:
        in_channels: input features, or ``(source, target)`` sizes for bipartite inputs (then
            sources and targets get their own projections ``lin_src``/``lin_dst``).
        out_channels: channels ``C`` per head.
        heads: attention heads ``H``.
        concat: concatenate the heads (``H * C`` outputs) or average them (``C``).
        negative_slope: of the LeakyReLU in the score.
        dropout: probability of dropping each attention weight while training.
        add_self_loops: remove self-loops, then add one per node (every node sees itself).
        bias: add a learned bias to the output.
        message_dropout: probability of dropping each channel of the projected source features
            (the messages ``W h_j``) while training; the scores see them undropped. Not in PyG;
            the GAT authors' code does it (``attn_head`` drops ``seq_fts`` before the aggregation).
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True, bias: bool = True,
                 *, message_dropout: float = 0.0):
        super().__init__(in_channels, out_channels, heads, concat, dropout, message_dropout)
        src_c, dst_c = _channels(in_channels, "in_channels")
        H, C = self.heads, self.out_channels
        self.negative_slope = float(negative_slope)
        self.add_self_loops = bool(add_self_loops)
        if isinstance(in_channels, int):
            self.lin = _linear(src_c, H * C, bias=False, glorot=True)
        else:
            self.lin_src = _linear(src_c, H * C, bias=False, glorot=True)
            self.lin_dst = _linear(dst_c, H * C, bias=False, glorot=True)
        self.att_src = nn.Parameter(torch.empty(1, H, C))
        self.att_dst = nn.Parameter(torch.empty(1, H, C))
        _glorot(self.att_src)
        _glorot(self.att_dst)
        self.bias = nn.Parameter(torch.zeros(H * C if concat else C)) if bias else None

    def _project(self, xs: Tensor, xd: Tensor, pair: bool) -> tuple[Tensor, Tensor]:
        H, C = self.heads, self.out_channels
        if hasattr(self, "lin"):
            hs = project(self.lin, xs).view(-1, H, C)  # (N_src, H, C)
            return hs, (project(self.lin, xd).view(-1, H, C) if pair else hs)
        return project(self.lin_src, xs).view(-1, H, C), project(self.lin_dst, xd).view(-1, H, C)

    def forward(self, x, edge_index, return_attention_weights: bool = False):
        """``x (N, F)`` or ``(x_src, x_dst)``; ``edge_index (2, E)`` source -> target.

        Returns ``out (N_dst, H*C | C)``, or ``(out, (edge_index_with_self_loops, weights (E', H)))``.
        """
        xs, xd, pair = self._inputs(x)
        hs, hd = self._project(xs, xd, pair)  # (N_src, H, C), (N_dst, H, C)
        ei, csr, inv = self._edges(edge_index, xs.shape[0], xd.shape[0], self.add_self_loops)
        a_src = (hs * self.att_src).sum(-1)  # (N_src, H)
        a_dst = (hd * self.att_dst).sum(-1)  # (N_dst, H)
        score = F.leaky_relu(a_src.index_select(0, csr.src) + a_dst.index_select(0, csr.dst), self.negative_slope)
        out, w = attend_edges(None, None, self._messages(hs), csr, bias=score,
                              keep=self._keep(csr, score))  # (H, N_dst, C), (E, H)
        out = self._heads_out(out)
        return self._result(out if self.bias is None else out + self.bias, ei, w, inv, return_attention_weights)

    def attention_scores(self, x, query: Tensor, key: Tensor) -> Tensor:
        """The unnormalized score of every ``query`` target against every ``key`` source: ``(H, Q, K)``.

        Whether or not they are neighbours (eval mode, no dropout): what decides GAT's ranking.
        """
        xs, xd, pair = self._inputs(x)
        hs, hd = self._project(xs, xd, pair)
        a_src = (hs[key] * self.att_src).sum(-1)  # (K, H)
        a_dst = (hd[query] * self.att_dst).sum(-1)  # (Q, H)
        return F.leaky_relu(a_dst.t()[:, :, None] + a_src.t()[:, None, :], self.negative_slope)  # (H, Q, K)

    @classmethod
    def from_pyg(cls, module) -> GATConv:
        """A GATConv with the weights (and train/eval mode) of ``torch_geometric.nn.GATConv`` ``module``."""
        cls._check_pyg(module, "GATConv", {"edge_dim": (None,), "residual": (False, None)})
        own = cls(module.in_channels, module.out_channels, module.heads, module.concat, module.negative_slope,
                  module.dropout, module.add_self_loops, module.bias is not None)
        own._load_pyg(module)
        return own


class GATv2Conv(_GraphConv):
    """GATv2's dynamic graph attention, PyG's ``GATv2Conv`` without edge features or residual.

    Arguments as :class:`GATConv`, plus ``share_weights`` (one projection for sources and
    targets). The projections ``lin_l`` (sources) and ``lin_r`` (targets) have biases when ``bias``.
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True, bias: bool = True,
                 share_weights: bool = False, *, message_dropout: float = 0.0):
        super().__init__(in_channels, out_channels, heads, concat, dropout, message_dropout)
        src_c, dst_c = _channels(in_channels, "in_channels")
        H, C = self.heads, self.out_channels
        self.negative_slope = float(negative_slope)
        self.add_self_loops = bool(add_self_loops)
        self.share_weights = bool(share_weights)
        if share_weights and src_c != dst_c:
            raise ValueError(f"share_weights needs equal source and target channels, got in_channels={in_channels!r}")
        self.lin_l = _linear(src_c, H * C, bias=bias, glorot=True)
        if not share_weights:
            self.lin_r = _linear(dst_c, H * C, bias=bias, glorot=True)
        self.att = nn.Parameter(torch.empty(1, H, C))
        _glorot(self.att)
        self.bias = nn.Parameter(torch.zeros(H * C if concat else C)) if bias else None

    def _project(self, xs: Tensor, xd: Tensor, pair: bool) -> tuple[Tensor, Tensor]:
        H, C = self.heads, self.out_channels
        hl = project(self.lin_l, xs).view(-1, H, C)  # (N_src, H, C): the sources' messages
        lin_r = self.lin_l if self.share_weights else self.lin_r
        hr = hl if (self.share_weights and not pair) else project(lin_r, xd).view(-1, H, C)  # (N_dst, H, C)
        return hl, hr

    def forward(self, x, edge_index, return_attention_weights: bool = False):
        """As :meth:`GATConv.forward`."""
        xs, xd, pair = self._inputs(x)
        hl, hr = self._project(xs, xd, pair)
        ei, csr, inv = self._edges(edge_index, xs.shape[0], xd.shape[0], self.add_self_loops)
        z = F.leaky_relu(hr.index_select(0, csr.dst) + hl.index_select(0, csr.src), self.negative_slope)  # (E, H, C)
        score = (z * self.att).sum(-1)  # (E, H)
        out, w = attend_edges(None, None, self._messages(hl), csr, bias=score, keep=self._keep(csr, score))
        out = self._heads_out(out)
        return self._result(out if self.bias is None else out + self.bias, ei, w, inv, return_attention_weights)

    def attention_scores(self, x, query: Tensor, key: Tensor) -> Tensor:
        """As :meth:`GATConv.attention_scores`: ``(H, Q, K)``."""
        xs, xd, pair = self._inputs(x)
        hl, hr = self._project(xs, xd, pair)
        z = F.leaky_relu(hr[query][:, None] + hl[key][None, :], self.negative_slope)  # (Q, K, H, C)
        return (z * self.att).sum(-1).permute(2, 0, 1)  # (H, Q, K)

    @classmethod
    def from_pyg(cls, module) -> GATv2Conv:
        """A GATv2Conv with the weights (and mode) of ``torch_geometric.nn.GATv2Conv`` ``module``."""
        cls._check_pyg(module, "GATv2Conv", {"edge_dim": (None,), "residual": (False, None)})
        own = cls(module.in_channels, module.out_channels, module.heads, module.concat, module.negative_slope,
                  module.dropout, module.add_self_loops, module.bias is not None, module.share_weights)
        own._load_pyg(module)
        return own


class TransformerConv(_GraphConv):
    """Scaled dot-product graph attention, PyG's ``TransformerConv`` without edge features.

    Args:
        in_channels, out_channels, heads, concat, dropout: as :class:`GATConv`.
        beta: gate the root connection, ``out = b x_r + (1 - b) out`` with
            ``b = sigmoid(lin_beta([out, x_r, out - x_r]))`` (only with ``root_weight``).
        bias: biases of the projections.
        root_weight: add the projected target features ``lin_skip(x_dst)``.
        message_dropout: as :class:`GATConv`'s, on the values.

    No self-loops are added: ``edge_index`` is attended as given.
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1, concat: bool = True,
                 beta: bool = False, dropout: float = 0.0, bias: bool = True, root_weight: bool = True, *,
                 message_dropout: float = 0.0):
        super().__init__(in_channels, out_channels, heads, concat, dropout, message_dropout)
        src_c, dst_c = _channels(in_channels, "in_channels")
        H, C = self.heads, self.out_channels
        self.root_weight = bool(root_weight)
        self.beta = bool(beta) and self.root_weight
        self.lin_key = nn.Linear(src_c, H * C, bias=bias)
        self.lin_query = nn.Linear(dst_c, H * C, bias=bias)
        self.lin_value = nn.Linear(src_c, H * C, bias=bias)
        width = H * C if concat else C
        self.lin_skip = nn.Linear(dst_c, width, bias=bias)  # PyG creates it even without root_weight
        self.lin_beta = nn.Linear(3 * width, 1, bias=False) if self.beta else None

    def _qkv(self, xs: Tensor, xd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        H, C = self.heads, self.out_channels
        q = project(self.lin_query, xd).view(-1, H, C)  # (N_dst, H, C)
        k = project(self.lin_key, xs).view(-1, H, C)  # (N_src, H, C)
        v = project(self.lin_value, xs).view(-1, H, C)
        return q, k, v

    def forward(self, x, edge_index, return_attention_weights: bool = False):
        """As :meth:`GATConv.forward`; the edge list returned is ``edge_index`` itself."""
        xs, xd, _ = self._inputs(x)
        q, k, v = self._qkv(xs, xd)
        ei, csr, inv = self._edges(edge_index, xs.shape[0], xd.shape[0], False)
        hm = (lambda t: t.transpose(0, 1).contiguous())  # noqa: E731  (H, nodes, C)
        out, w = attend_edges(hm(q), hm(k), self._messages(v), csr, keep=self._keep(csr, q),
                              scale=1.0 / math.sqrt(self.out_channels))
        out = self._heads_out(out)
        if self.root_weight:
            x_r = project(self.lin_skip, xd)
            if self.lin_beta is not None:
                b = torch.sigmoid(self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)))
                out = b * x_r + (1 - b) * out
            else:
                out = out + x_r
        return self._result(out, ei, w, inv, return_attention_weights)

    def attention_scores(self, x, query: Tensor, key: Tensor) -> Tensor:
        """As :meth:`GATConv.attention_scores`: ``q_i . k_j / sqrt(C)``, ``(H, Q, K)``."""
        xs, xd, _ = self._inputs(x)
        q, k, _ = self._qkv(xs, xd)
        return torch.einsum("qhc,khc->hqk", q[query], k[key]) / math.sqrt(self.out_channels)

    @classmethod
    def from_pyg(cls, module) -> TransformerConv:
        """A TransformerConv with the weights (and mode) of ``torch_geometric.nn.TransformerConv`` ``module``."""
        cls._check_pyg(module, "TransformerConv", {"edge_dim": (None,)})
        own = cls(module.in_channels, module.out_channels, module.heads, module.concat, module.beta, module.dropout,
                  module.lin_key.bias is not None, module.root_weight)
        own._load_pyg(module)
        return own
