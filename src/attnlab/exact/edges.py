"""The ``edges`` backend: attention computed on a graph's E edges, never on N x M.

For each edge ``j -> i`` of a graph (:func:`attnlab.masks.graph`, PyTorch Geometric's
source -> target convention) the score is ``q_i . k_j * scale`` plus an optional per-edge
bias; a segment softmax over each target's incoming edges gives the weights, and node
``i`` receives ``sum_j w_ij v_j``. That is the function the ``math`` backend computes
under the graph's dense mask (the readable picture every backend is tested against);
a node without incoming edges gets zeros, with zero gradients, as everywhere in attnlab.

How it runs. The edges are sorted by target once per graph (:meth:`GraphMask.csr
<attnlab.masks.graph.GraphMask.csr>`), so each target's edges are one contiguous
segment, the rows of a sparse ``N x M`` CSR pattern. Per head:

* scores: a sampled dense-dense product (SDDMM, ``torch.sparse.sampled_addmm``) of q and k
  on the pattern, O(E D);
* segment softmax: ``torch.segment_reduce`` max and sum over the sorted segments, O(E);
* output: a sparse-dense product (SpMM) of the weights with v, O(E Dv).

The backward is written out (a custom autograd function): ``g_e = dout_i . v_j`` (SDDMM),
``ds_e = w_e (g_e - sum_{e' -> i} w_e' g_e')``, ``dq = ds k`` (SpMM), ``dk = ds^T q`` and
``dv = w^T dout`` (SpMM on the transposed pattern, sorted by source). It saves only the
``(E, H)`` weights: time O(E H (D + Dv)), memory O(E H) beyond the inputs. On CPU the
products are MKL's sparse kernels: at 2 million edges they ran 30-40x faster than the
gather / ``index_add_`` formulation (8 heads of 8 channels, one thread). Inside ``torch.compile``
(where sparse tensors do not trace) the same functions run as the custom ops
``attnlab::edge_attention`` and ``attnlab::edge_attention_backward``, with fake kernels.

Public pieces: :func:`edge_attention` (node-major ``(N, H, D)`` tensors and an edge list,
every edge counted, per-edge bias ``(E, H)`` and weights ``(E, H)``: what graph layers such
as GAT use), :func:`segment_softmax`, and the registered backend that serves
``attnlab.attention(q, k, v, mask=masks.graph(...))`` (duplicate edges collapse there, as in
the mask). Scores and softmax are kept in float32 (float64 for float64 inputs).

Shape legend: ``E`` edges, ``N`` target (query) nodes, ``M`` source (key) nodes, ``H``
heads, ``G`` independent heads of one call (``B * H``), ``D`` q/k dim, ``Dv`` value dim.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..masks import EdgeCSR, GraphMask, conjuncts, graph
from ..utils import sparse_csr
from .call import AttentionCall, dropout_keep
from .registry import Backend, register_backend
from .torch_math import acc_dtype

__all__ = ["DENSITY_THRESHOLD", "attend_edges", "edge_attention", "graph_part", "segment_softmax"]

#: ``auto`` takes the ``edges`` backend for graph masks below this density (allowed pairs / N x M): where it
#: measured as fast as the fastest dense backend (SDPA with the graph's mask), forward and backward, on random
#: graphs (8 heads of 64, float32, one thread): 19.7% at N=1024, 18.4% at N=2048 (scripts/graph_vs_pyg.py density)
DENSITY_THRESHOLD = 0.18


# -- the sparse products, one head at a time ------------------------------------------------------
def _csr(crow: Tensor, col: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    return sparse_csr(crow, col, values, shape)


def _spmm(crow: Tensor, col: Tensor, values: Tensor, dense: Tensor, rows: int) -> Tensor:
    """Per head ``g``: the CSR matrix ``(rows, K)`` with ``values[g]`` times ``dense[g]``.

    ``values (G, U)``, ``dense (G, K, F)`` -> ``(G, rows, F)``.
    """
    G, K, F = dense.shape
    if values.shape[1] == 0:
        return dense.new_zeros(G, rows, F)
    return torch.stack([torch.mm(_csr(crow, col, values[g], (rows, K)), dense[g]) for g in range(G)])  # (G, rows, F)


def _sddmm(csr: EdgeCSR, a: Tensor, b: Tensor) -> Tensor:
    """Per edge ``e = (j -> i)`` and head ``g``: ``a[g, i] . b[g, j]``; ``a (G, N, F)``, ``b (G, M, F)`` -> ``(E, G)``.

    One batched sampled product over every head (the pattern's indices broadcast over the batch, no
    copies: 0.28 ms against 0.82 ms for a loop over 8 heads on Cora), computed once per pattern entry
    and repeated for duplicate edges.
    """
    G, U = a.shape[0], csr.num_pairs
    if U == 0:
        return a.new_zeros(0, G)
    pattern = sparse_csr(csr.crow.expand(G, -1), csr.col.expand(G, -1), a.new_zeros(()).expand(G, U),
                         (G, csr.num_dst, csr.num_src))
    vals = torch.sparse.sampled_addmm(pattern, a, b.transpose(1, 2), beta=0.0).values()  # (G, U)
    out = vals.t()  # (U, G)
    return out.contiguous() if csr.group is None else out.index_select(0, csr.group)  # (E, G)


def _pattern_values(x: Tensor, csr: EdgeCSR) -> Tensor:
    """Per-edge ``x (E, G)`` summed over duplicate edges and laid out per head: ``(G, U)`` for the products."""
    if csr.group is not None:
        x = torch.segment_reduce(x, "sum", lengths=csr.multiplicity, axis=0, unsafe=True)  # (U, G)
    return x.t().contiguous()


def _segment_sum(x: Tensor, counts: Tensor) -> Tensor:
    """Sum of ``x (E, G)`` over each target's (contiguous) edges -> ``(N, G)``."""
    return torch.segment_reduce(x, "sum", lengths=counts, axis=0, unsafe=True)


def _softmax_sorted(s: Tensor, counts: Tensor, dst: Tensor) -> Tensor:
    """Softmax of ``s (E, G)`` over each target's edges (sorted by target); empty or all -inf segments give 0.

    Differentiable by autograd when ``s`` needs a gradient (:func:`segment_softmax`): then no tensor
    autograd saved is written in place; the kernel's forward (no grad) updates ``(E, G)`` in place.
    """
    if s.shape[0] == 0:
        return s.clone()
    # (N, G); -inf where no edge. The softmax does not depend on the shift, so it is a constant (detached)
    mx = torch.segment_reduce(s.detach(), "max", lengths=counts, axis=0, unsafe=True)
    mx = mx.masked_fill(torch.isneginf(mx), 0.0)  # a segment of -inf scores: exp gives 0, not NaN
    in_place = not (s.requires_grad and torch.is_grad_enabled())
    p = s - mx.index_select(0, dst)  # (E, G)
    p = p.exp_() if in_place else p.exp()
    den = _segment_sum(p, counts)  # (N, G)
    den = den.masked_fill(den == 0, 1.0).index_select(0, dst)  # (E, G)
    return p.div_(den) if in_place else p / den


def _edge_forward(q, k, v, bias, keep, csr: EdgeCSR, scale: float) -> tuple[Tensor, Tensor]:
    """``out (G, N, Dv)`` in v's dtype and the weights ``w (E, G)`` in the accumulation dtype."""
    ad = acc_dtype(v.dtype)
    G, E, N = v.shape[0], csr.num_edges, csr.num_dst
    s = None
    if q is not None:
        s = _sddmm(csr, q.to(ad), k.to(ad)).mul_(scale)  # (E, G)
    if bias is not None:
        s = bias.to(ad) if s is None else s.add_(bias)
    if s is None:
        s = v.new_zeros(E, G, dtype=ad)
    w = _softmax_sorted(s, csr.counts, csr.dst)  # (E, G)
    wz = w if keep is None else w * keep
    out = _spmm(csr.crow, csr.col, _pattern_values(wz, csr), v.to(ad), N)  # (G, N, Dv)
    return out.to(v.dtype), w


def _edge_backward(dout, dw_ext, q, k, v, w, keep, csr: EdgeCSR, scale: float, needs) -> tuple:
    """``(dq, dk, dv, dbias)`` (None where not needed) of :func:`_edge_forward`'s outputs' gradients."""
    ad = w.dtype
    N, M = csr.num_dst, csr.num_src
    need_q, need_k, need_v, need_bias = needs
    do = None if dout is None else dout.to(ad).contiguous()  # (G, N, Dv)
    dw = None
    if do is not None:
        dw = _sddmm(csr, do, v.to(ad))  # (E, G): dout_i . v_j
        if keep is not None:
            dw.mul_(keep)
    if dw_ext is not None:
        dw = dw_ext.to(ad) if dw is None else dw.add_(dw_ext)
    dq = dk = dv = dbias = None
    if need_v and do is not None:
        wz = w if keep is None else w * keep
        wt = _pattern_values(wz, csr).index_select(1, csr.t_order)  # (G, U), sorted by source
        dv = _spmm(csr.t_crow, csr.t_col, wt, do, M).to(v.dtype)  # (G, M, Dv)
    if dw is not None and (need_bias or ((need_q or need_k) and q is not None)):
        delta = _segment_sum(w * dw, csr.counts)  # (N, G): sum over each target's edges of w g
        ds = dw.sub_(delta.index_select(0, csr.dst)).mul_(w)  # (E, G): d loss / d score
        if q is not None and (need_q or need_k):
            ds_t = _pattern_values(ds * scale, csr)  # (G, U)
            if need_q:
                dq = _spmm(csr.crow, csr.col, ds_t, k.to(ad), N).to(q.dtype)  # (G, N, D)
            if need_k:
                dk = _spmm(csr.t_crow, csr.t_col, ds_t.index_select(1, csr.t_order), q.to(ad), M).to(k.dtype)
        if need_bias:
            dbias = ds.to(v.dtype)
    return dq, dk, dv, dbias


class _EdgeAttentionFn(torch.autograd.Function):
    """softmax over each target's edges of ``q.k * scale + bias``, then ``w v``; its own backward (see the module)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, csr: EdgeCSR, scale: float):
        out, w = _edge_forward(q, k, v, bias, keep, csr, scale)
        ctx.save_for_backward(q, k, v, w, keep)
        ctx.csr, ctx.scale = csr, scale
        ctx.set_materialize_grads(False)
        return out, w.to(v.dtype)

    @staticmethod
    @once_differentiable  # its backward is not differentiated again: create_graph=True raises, never drops terms
    def backward(ctx, dout, dw_ext):
        q, k, v, w, keep = ctx.saved_tensors
        return (*_edge_backward(dout, dw_ext, q, k, v, w, keep, ctx.csr, ctx.scale, ctx.needs_input_grad[:4]),
                None, None, None)


# -- under torch.compile: the kernel as a custom op (sparse tensors do not trace) ------------------------------
#: the EdgeCSR fields the kernel reads, in the ops' argument order (``order`` is the caller's, not the kernel's)
_CSR_ARGS = ("src", "dst", "counts", "group", "multiplicity", "crow", "col", "t_order", "t_crow", "t_col")
_CSR_SCHEMA = ("Tensor src, Tensor dst, Tensor counts, Tensor? group, Tensor? multiplicity, Tensor crow, Tensor col, "
               "Tensor t_order, Tensor t_crow, Tensor t_col, int num_src")


def _csr_of(num_src: int, src, dst, counts, group, multiplicity, crow, col, t_order, t_crow, t_col) -> EdgeCSR:
    return EdgeCSR(num_dst=counts.shape[0], num_src=num_src, src=src, dst=dst, order=None, counts=counts, group=group,
                   multiplicity=multiplicity, crow=crow, col=col, t_order=t_order, t_crow=t_crow, t_col=t_col)


@torch.library.custom_op("attnlab::edge_attention", mutates_args=(),
                         schema=f"(Tensor? q, Tensor? k, Tensor v, Tensor? bias, Tensor? keep, {_CSR_SCHEMA}, "
                                "float scale) -> (Tensor, Tensor)")
def _edge_attention_op(q, k, v, bias, keep, src, dst, counts, group, multiplicity, crow, col, t_order, t_crow, t_col,
                       num_src, scale):
    csr = _csr_of(num_src, src, dst, counts, group, multiplicity, crow, col, t_order, t_crow, t_col)
    return _edge_forward(q, k, v, bias, keep, csr, scale)


@_edge_attention_op.register_fake
def _(q, k, v, bias, keep, src, dst, counts, *rest):
    return v.new_empty((v.shape[0], counts.shape[0], v.shape[2])), v.new_empty((src.shape[0], v.shape[0]),
                                                                               dtype=acc_dtype(v.dtype))


@torch.library.custom_op("attnlab::edge_attention_backward", mutates_args=(),
                         schema=f"(Tensor? dout, Tensor? dw, Tensor? q, Tensor? k, Tensor v, Tensor w, Tensor? keep, "
                                f"{_CSR_SCHEMA}, float scale, bool[] needs) -> (Tensor, Tensor, Tensor, Tensor)")
def _edge_attention_backward_op(dout, dw, q, k, v, w, keep, src, dst, counts, group, multiplicity, crow, col, t_order,
                                t_crow, t_col, num_src, scale, needs):
    csr = _csr_of(num_src, src, dst, counts, group, multiplicity, crow, col, t_order, t_crow, t_col)
    grads = _edge_backward(dout, dw, q, k, v, w, keep, csr, scale, needs)
    return tuple(v.new_empty(0) if g is None else g for g in grads)  # (0,) where not needed: None to autograd


def _grads_given(dout, dw, q, needs) -> list[bool]:
    """Which of ``(dq, dk, dv, dbias)`` :func:`_edge_backward` returns (the others are None)."""
    need_q, need_k, need_v, need_bias = needs
    has_ds = dout is not None or dw is not None
    return [q is not None and has_ds and need_q, q is not None and has_ds and need_k, need_v and dout is not None,
            need_bias and has_ds]


@_edge_attention_backward_op.register_fake
def _(dout, dw, q, k, v, w, keep, src, dst, counts, group, multiplicity, crow, col, t_order, t_crow, t_col, num_src,
      scale, needs):
    shapes = (q, k, v, w)
    given = _grads_given(dout, dw, q, needs)
    return tuple(v.new_empty(t.shape, dtype=(v.dtype if i == 3 else t.dtype)) if g else v.new_empty(0)
                 for i, (t, g) in enumerate(zip(shapes, given)))


def _edge_setup(ctx, inputs, output):
    q, k, v, bias, keep, *csr_args, num_src, scale = inputs
    ctx.save_for_backward(q, k, v, output[1], keep, *csr_args)
    ctx.num_src, ctx.scale = num_src, scale
    ctx.set_materialize_grads(False)


def _edge_attention_grad(ctx, dout, dw):
    q, k, v, w, keep, *csr_args = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    grads = torch.ops.attnlab.edge_attention_backward(dout, dw, q, k, v, w, keep, *csr_args, ctx.num_src, ctx.scale,
                                                      needs)
    grads = [g if given else None for g, given in zip(grads, _grads_given(dout, dw, q, needs))]
    return (*grads, *([None] * (len(_CSR_ARGS) + 3)))


_edge_attention_op.register_autograd(_edge_attention_grad, setup_context=_edge_setup)


def attend_edges(q: Tensor | None, k: Tensor | None, v: Tensor, csr: EdgeCSR, *, bias: Tensor | None = None,
                 keep: Tensor | None = None, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """The kernel on head-major tensors and edges sorted by target.

    Args:
        q, k: ``(G, N, D)`` and ``(G, M, D)``, or both None (the score is the bias alone).
        v: ``(G, M, Dv)``.
        csr: the sorted edges (:meth:`attnlab.masks.GraphMask.csr`).
        bias: ``(E, G)`` per-edge score bias in the sorted order (broadcast views are fine).
        keep: ``(E, G)`` dropout multipliers (``keep / (1 - p)``), or None.
        scale: multiplier of ``q . k``.

    Returns:
        ``out (G, N, Dv)`` and the softmax weights ``(E, G)`` in the sorted order (before dropout).

    Inside ``torch.compile`` the same computation runs as the custom op ``attnlab::edge_attention``
    (its backward ``attnlab::edge_attention_backward``), which dynamo and AOTAutograd trace by its
    fake kernel: the sparse products do not trace.
    """
    if torch.compiler.is_compiling():
        out, w = torch.ops.attnlab.edge_attention(q, k, v, bias, keep, *(getattr(csr, f) for f in _CSR_ARGS),
                                                  csr.num_src, float(scale))
        return out, w.to(v.dtype)
    return _EdgeAttentionFn.apply(q, k, v, bias, keep, csr, float(scale))


def segment_softmax(scores: Tensor, index: Tensor, num_segments: int | None = None) -> Tensor:
    """Softmax of ``scores (E, ...)`` over the entries that share ``index (E,)`` (PyG's ``softmax(src, index)``).

    Entries with index ``i`` (the edges into target ``i``) sum to 1; a group of ``-inf``
    scores gives zeros. Computed in float32 (float64 for float64) and returned in the
    scores' dtype. Differentiable through autograd (this function is the test yardstick;
    the ``edges`` kernel fuses it with its own backward).
    """
    if not isinstance(scores, Tensor) or not scores.dtype.is_floating_point:
        raise ValueError(f"segment_softmax: scores must be a floating-point tensor, got {type(scores).__name__}")
    index = torch.as_tensor(index, device=scores.device)
    if index.ndim != 1 or index.shape[0] != scores.shape[0] or index.dtype.is_floating_point:
        raise ValueError(f"segment_softmax: index must be an integer (E,) tensor with E={scores.shape[0]} "
                         f"(one per score row), got {index.dtype} of shape {tuple(index.shape)}")
    index = index.long()
    n = num_segments if num_segments is not None else (int(index.max()) + 1 if index.numel() else 0)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n):
        raise ValueError(f"segment_softmax: index must lie in [0, num_segments={n}), got "
                         f"[{int(index.min())}, {int(index.max())}]")
    order = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=n)
    flat = scores.reshape(scores.shape[0], -1)[order].to(acc_dtype(scores.dtype))  # (E, F), sorted by index
    w = _softmax_sorted(flat, counts, index[order])
    out = torch.empty_like(w).index_copy_(0, order, w)
    return out.view(scores.shape).to(scores.dtype)


# -- the node-major entry point (graph layers) -----------------------------------------------------
def _as_graph(edge_index, num_src: int, num_dst: int, given: bool, has_q: bool) -> GraphMask:
    try:
        g = edge_index if isinstance(edge_index, GraphMask) else graph(edge_index, num_nodes=(num_src, num_dst))
        g.validate(num_dst, num_src)
    except ValueError as e:
        if given:
            raise
        rows = f"q's rows ({num_dst} targets)" if has_q else f"v's rows ({num_dst} targets: pass num_nodes for others)"
        raise ValueError(f"edge_attention: {e}; the node counts are {rows} and v's rows ({num_src} sources)") from None
    return g


def _node_major(t: Tensor | None, name: str) -> None:
    if t is None:
        return
    if not isinstance(t, Tensor) or t.ndim != 3 or not t.dtype.is_floating_point:
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"edge_attention: {name} must be a floating-point (nodes, heads, dim) tensor, got {got}")


def edge_attention(q: Tensor | None, k: Tensor | None, v: Tensor, edge_index, *,
                   num_nodes: int | tuple[int, int] | None = None, bias: Tensor | None = None,
                   scale: float | None = None, dropout_p: float = 0.0,
                   return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Attention along every edge of ``edge_index`` (each edge counted, duplicates too), node-major like PyG.

    For each edge ``j -> i`` (``edge_index[0]`` the sources, ``edge_index[1]`` the targets) the
    score is ``q_i . k_j * scale + bias_e``; the weights are a softmax over each target's
    incoming edges and target ``i`` receives ``sum_e w_e v_j``. A target without incoming
    edges receives zeros.

    Args:
        q: ``(N, H, D)`` target-node queries, or None with ``k`` None: the score is then the
            bias alone (GAT's additive score).
        k: ``(M, H, D)`` source-node keys, or None.
        v: ``(M, H, Dv)`` source-node values.
        edge_index: ``(2, E)`` integer tensor or a :func:`attnlab.masks.graph` mask.
        num_nodes: ``N`` targets, or ``(M, N)``; default ``q``'s rows (``v``'s when ``q`` is None).
        bias: per-edge score bias ``(E, H)``, ``(E, 1)`` or ``(E,)``, in ``edge_index``'s order.
        scale: multiplier of ``q . k`` (default ``1 / sqrt(D)``).
        dropout_p: probability of dropping each weight (applied whenever > 0).
        return_weights: also return the softmax weights ``(E, H)`` (before dropout), edge by edge.

    Returns:
        ``out (N, H, Dv)``, or ``(out, weights)``.

    Raises:
        ValueError: naming the argument whose shape, dtype or node ids do not fit.
    """
    _node_major(q, "q")
    _node_major(k, "k")
    _node_major(v, "v")
    if (q is None) != (k is None):
        raise ValueError("edge_attention: pass q and k together, or neither (the score is then the bias alone)")
    M, H = v.shape[0], v.shape[1]
    if q is not None:
        if q.shape[1] != H or k.shape[1] != H or k.shape[0] != M or q.shape[2] != k.shape[2]:
            raise ValueError(f"edge_attention: q (N, H, D), k (M, H, D) and v (M, H, Dv) must agree, got q "
                             f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"edge_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if isinstance(num_nodes, (tuple, list)):
        num_src, num_dst = num_nodes
        if num_src != M:
            raise ValueError(f"edge_attention: num_nodes gives {num_src} source nodes but v has {M} rows")
    else:
        num_src = M
        num_dst = num_nodes if num_nodes is not None else (q.shape[0] if q is not None else M)
    if q is not None and q.shape[0] != num_dst:
        raise ValueError(f"edge_attention: num_nodes gives {num_dst} target nodes but q has {q.shape[0]} rows")
    g = _as_graph(edge_index, num_src, num_dst, num_nodes is not None, q is not None)
    csr = g.csr(num_dst, num_src, collapse=False)
    E = csr.num_edges
    if csr.device != v.device:
        raise ValueError(f"edge_attention: edge_index is on {csr.device} but v is on {v.device}")
    b = None
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.dtype.is_floating_point:
            raise ValueError(f"edge_attention: bias must be a floating-point (E, H) tensor, got {type(bias).__name__}")
        bb = bias.unsqueeze(1) if bias.ndim == 1 else bias
        if bb.ndim != 2 or bb.shape[0] != E or bb.shape[1] not in (1, H):
            raise ValueError(f"edge_attention: bias must have shape (E, H)=({E}, {H}) (or (E, 1), (E,)), got "
                             f"{tuple(bias.shape)}")
        b = bb.index_select(0, csr.order).expand(E, H)  # (E, H), sorted by target
    keep = None
    if dropout_p:
        if not 0.0 <= dropout_p < 1.0:
            raise ValueError(f"edge_attention: dropout_p must be in [0, 1), got {dropout_p!r}")
        keep = (torch.rand(E, H, device=v.device) >= dropout_p).to(acc_dtype(v.dtype)).mul_(1.0 / (1.0 - dropout_p))
    D = q.shape[2] if q is not None else 1
    sc = (D ** -0.5) if scale is None else float(scale)
    hm = (lambda t: None if t is None else t.transpose(0, 1).contiguous())  # noqa: E731  (H, nodes, dim)
    out, w = attend_edges(hm(q), hm(k), hm(v), csr, bias=b, keep=keep, scale=sc)
    out = out.transpose(0, 1)  # (N, H, Dv)
    if not return_weights:
        return out
    inv = torch.empty_like(csr.order)
    inv[csr.order] = torch.arange(E, device=inv.device)
    return out, w.index_select(0, inv)  # (E, H) in edge_index's order


# -- the backend ------------------------------------------------------------------------------------
def graph_part(mask) -> tuple[GraphMask | None, list]:
    """The graph mask among the ``&``-parts of ``mask`` and the other parts; ``(None, [])`` when there is none."""
    if mask is None:
        return None, []
    parts = conjuncts(mask)
    graphs = [p for p in parts if isinstance(p, GraphMask)]
    if len(graphs) != 1:
        return None, []
    return graphs[0], [p for p in parts if p is not graphs[0]]


@register_backend
class EdgesBackend(Backend):
    name = "edges"
    summary = "attention on a graph mask's E edges (segment softmax, sparse products); O(E) time and memory"

    def supports(self, call: AttentionCall) -> str | None:
        if call.mask is None:
            return "needs a graph mask (masks.graph(edge_index)): it computes attention on the graph's edges"
        parts = conjuncts(call.mask)
        n = sum(isinstance(p, GraphMask) for p in parts)
        if n == 0:
            return ("needs a graph mask (masks.graph(edge_index)), alone or joined to other masks with &; "
                    f"got {call.mask!r}")
        if n > 1:
            return "more than one graph mask joined with &: intersect the edge lists into one graph"
        return None

    def _edges(self, call: AttentionCall) -> tuple[int, float]:
        g, _ = graph_part(call.mask)
        e = g.codes().shape[0]
        return e, e / (call.N * call.M)

    def estimate(self, call: AttentionCall) -> float:
        # SDPA's cost for a masked call (call.flops() / 0.75) scaled by the density relative to the measured
        # crossover: below DENSITY_THRESHOLD it undercuts the dense backends, above it they win
        _, density = self._edges(call)
        return call.flops() / 0.75 * density / DENSITY_THRESHOLD + 2.0e4 * call.B * call.H

    def note(self, call: AttentionCall) -> str | None:
        e, density = self._edges(call)
        side = "below" if density < DENSITY_THRESHOLD else "above"
        return (f"{e:,} edges of {call.N:,} x {call.M:,} ({density:.3%} dense), {side} the {DENSITY_THRESHOLD:.0%} "
                f"density under which it measured faster than dense attention (scripts/graph_vs_pyg.py density)")

    def forward(self, call: AttentionCall):
        g, rest = graph_part(call.mask)
        B, H, N, M, D, Dv, G = call.B, call.H, call.N, call.M, call.D, call.Dv, call.G
        csr = g.csr(N, M)  # validates the graph against the call; duplicates collapse (the mask is a set)
        for part in rest:
            part.validate(N, M)
        E = csr.num_edges
        kv = (lambda t: t if G == 1 else t.repeat_interleave(G, dim=1))  # noqa: E731  (B, H, M, .)
        q = call.q.reshape(B * H, N, D)  # (G', N, D), G' = B * H independent heads
        k = kv(call.k).reshape(B * H, M, D)
        v = kv(call.v).reshape(B * H, M, Dv)
        dev = call.device
        bi = torch.arange(B, device=dev).view(-1, 1, 1, 1)
        hi = torch.arange(H, device=dev).view(1, -1, 1, 1)
        qi, kj = csr.dst.view(1, 1, 1, -1), csr.src.view(1, 1, 1, -1)  # each edge's query and key index
        bias = None
        if call.bias is not None:
            t = call.bias  # (B'|1, H'|1, N'|1, M'|1)
            rows = csr.dst if t.shape[2] != 1 else torch.zeros_like(csr.dst)
            cols = csr.src if t.shape[3] != 1 else torch.zeros_like(csr.src)
            bias = t[:, :, rows, cols].unsqueeze(2)  # (B'|1, H'|1, 1, E)
        if call.bias_fn is not None:
            fb = call.bias_fn(bi, hi, qi, kj)  # broadcastable to (B, H, 1, E)
            bias = fb if bias is None else bias + fb
        for part in rest:  # the other &-parts of the mask, asked at each edge
            allowed = part.allows(bi, hi, qi, kj, N, M)  # (B'|1, H'|1, 1, E)
            base = bias if bias is not None else torch.zeros((), dtype=acc_dtype(call.dtype), device=dev)
            bias = base.masked_fill(~allowed, float("-inf"))
        if bias is not None:
            bias = bias.expand(B, H, 1, E).reshape(B * H, E).t()  # (E, G')
        keep = None
        if call.dropout_p > 0:
            z = dropout_keep(call.dropout_seed, bi, hi, qi, kj, call.dropout_p)  # (B, H, 1, E), attnlab's stream
            keep = (z.to(acc_dtype(call.dtype)) / (1.0 - call.dropout_p)).expand(B, H, 1, E).reshape(B * H, E).t()
        out, w = attend_edges(q, k, v, csr, bias=bias, keep=keep, scale=call.scale)
        out = out.view(B, H, N, Dv)  # (B, H, N, Dv)
        weights = None
        if call.return_weights:
            weights = torch.zeros(B, H, N, M, dtype=call.dtype, device=dev)
            weights[:, :, csr.dst, csr.src] = w.t().reshape(B, H, E)  # (B, H, N, M)
        return out, weights
