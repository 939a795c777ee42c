"""Exact attention over one tile of the scores (one block of keys), as ``(out, lse)``, and the merge of partials.

Attention over keys ``K = K_1 ∪ K_2`` is a merge of attention over each part: with
``lse_i`` the row log-sum-exp of the scaled scores over ``K_i`` and ``out_i`` the
softmax-weighted values over ``K_i``,

    lse = logaddexp(lse_1, lse_2),   out = exp(lse_1 - lse) out_1 + exp(lse_2 - lse) out_2.

So a long key range can be walked block by block (the tiled ``chunked`` backend), or
blocks can live on different processes (ring attention), with exactly the result of one
softmax over all keys. The backward pass splits the same way: given the *global* ``out``
and ``lse`` of a row, the gradient contribution of one key block depends on that block
alone (``P = exp(s - lse)``, ``dS = P (dP - rowsum(dO * out))``).

:func:`attend_block` computes one block with attnlab's native CPU kernel
(:mod:`attnlab.exact.native`, float32) when it is built and verified, else with PyTorch's
fused CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, which returns
``(out, logsumexp)`` and takes a small additive mask) when that is present and verified,
else with plain torch (:func:`plain_forward`, the formula). :func:`attend_block_backward`
is its backward given the global ``out`` and ``lse``; :func:`tile_backward` is the one copy
of the backward formula in plain torch (the plain tiles of ``chunked``, ring attention's
bias-function tiles and :func:`plain_backward` use it). :func:`block_path` says which
path a block takes and why.

Rows that may see no key of the block get ``out = 0`` and ``lse = -inf`` (the merge then
ignores them; a row empty in every block stays zero, as everywhere in attnlab).

The fused op is private to PyTorch: :func:`fused_status` detects it once, checks its
schema, and verifies it numerically against the float64 formula on a tiny case (forward
and gradients) before it is used. If anything differs it is not used, and the reason is
what ``fused_status()`` and ``attnlab.explain`` report.

Shape legend: ``B`` batch, ``H`` heads (the same for q, k and v here: grouped-query
callers stack a group's query heads along the rows), ``n`` block queries, ``m`` block
keys, ``D`` head dim, ``Dv`` value head dim.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from . import native
from .call import check_qkv

__all__ = ["attend_block", "attend_block_backward", "block_path", "fused_status", "merge_partials", "plain_backward",
           "plain_forward", "reduce_to", "set_fused_enabled", "tile_backward"]

_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
_forced_off = False


def set_fused_enabled(enabled: bool) -> None:
    """Turn the fused op off (``False``) or back on for this process (tests of the fallback)."""
    global _forced_off
    _forced_off = not enabled


@functools.lru_cache(maxsize=1)
def _detect() -> str | None:
    """None when the fused op is present and verified; else the reason it is not used."""
    ops = torch.ops.aten
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"):
        if not hasattr(ops, name):
            return f"torch {torch.__version__} has no aten.{name}"
    schema = str(ops._scaled_dot_product_flash_attention_for_cpu.default._schema)
    if "attn_mask" not in schema or "logsumexp" not in schema:
        return f"aten._scaled_dot_product_flash_attention_for_cpu has an unexpected signature: {schema}"
    try:
        return _verify()
    except (RuntimeError, TypeError, ValueError) as e:  # the op exists but rejects our call
        return f"the fused CPU op failed its check: {str(e).splitlines()[0][:200]}"


def _verify() -> str | None:
    """Compare the fused op with the float64 formula on a tiny masked case, forward and backward.

    The first use may come under ``torch.no_grad()`` or ``torch.inference_mode()``: the check
    turns autograd back on for itself, so its verdict never depends on the caller's mode.
    """
    with torch.inference_mode(False), torch.enable_grad():
        return _verify_now()


def _verify_now() -> str | None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (5, 7, 7))
    allowed = torch.rand(2, 1, 5, 7, generator=g) > 0.3
    allowed[0, 0, 1] = False  # one row that sees nothing
    bias = torch.randn(1, 3, 5, 7, generator=g)
    do = torch.randn(2, 3, 5, 8, generator=g)
    for causal in (False, True):
        out, lse = _fused_forward(q, k, v, allowed, bias, 0.37, causal)
        dq, dk, dv = _fused_backward(do, q, k, v, out, lse, allowed, bias, 0.37, causal)
        ref = plain_forward(q.double(), k.double(), v.double(), allowed, bias.double(), 0.37, causal)
        qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
        o64, _ = plain_forward(qd, kd, vd, allowed, bias.double(), 0.37, causal)
        g64 = torch.autograd.grad(o64, (qd, kd, vd), do.double())
        checks = {"out": (out, ref[0]), "lse": (lse, ref[1]), "dq": (dq, g64[0]), "dk": (dk, g64[1]),
                  "dv": (dv, g64[2])}
        what_causal = " (is_causal)" if causal else ""
        for what, (got, want) in checks.items():
            fin = torch.isfinite(want)
            if not torch.equal(torch.isfinite(got), fin):
                return f"the fused CPU op's {what}{what_causal} differs from the formula on empty rows"
            err = float((got.double()[fin] - want[fin]).abs().max())
            if not err <= 1e-4:
                return f"the fused CPU op's {what}{what_causal} differs from the formula by {err:.2e}"
    return None


def fused_status() -> str | None:
    """None when :func:`attend_block` uses the fused CPU op; else why not (for ``explain``)."""
    if _forced_off:
        return "the fused CPU op is turned off (set_fused_enabled(False))"
    return _detect()


def _additive(allowed: Tensor | None, bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """One additive float mask from a boolean ``allowed`` tile and a ``bias`` tile (either may be None)."""
    if allowed is None and bias is None:
        return None
    add = bias.to(dtype) if bias is not None else None
    if allowed is not None:
        blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
        add = blocked if add is None else add + blocked
    return add


def _row_any(allowed: Tensor | None, bias: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    """``(B, H, n)`` True where a row may see a key of the block (None: every row may)."""
    seen = None
    if allowed is not None:
        seen = allowed.any(-1)
    if bias is not None and bool(torch.isneginf(bias).any()):
        finite = torch.isfinite(bias) if allowed is None else (torch.isfinite(bias) & allowed)
        seen = finite.any(-1)
    return None if seen is None else seen.expand(shape)


def _op_mask(allowed: Tensor | None, bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The fused op's additive mask, 4-D and left broadcastable over batch and heads.

    Broadcasting is what makes masks cheap: a ``(1, 1, n, m)`` tile is read once for all
    heads, where expanding it to ``(B, H, n, m)`` first wrote H copies per call.
    """
    add = _additive(allowed, bias, dtype)
    if add is None:
        return None
    while add.dim() < 4:
        add = add.unsqueeze(0)
    return add.contiguous()


def _causal_allowed(allowed: Tensor | None, n: int, m: int, device) -> Tensor | None:
    """``allowed`` restricted to the block's top-left causal triangle (None stays None: no row is empty)."""
    if allowed is None:
        return None
    return allowed & torch.ones(n, m, dtype=torch.bool, device=device).tril()


def _fused_forward(q, k, v, allowed, bias, scale, causal=False):
    add = _op_mask(allowed, bias, q.dtype)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=add, scale=scale)
    if causal:
        allowed = _causal_allowed(allowed, q.shape[2], k.shape[2], q.device)
    seen = _row_any(allowed, bias, lse.shape)
    if seen is not None:  # the op writes lse 0 for rows that see nothing
        lse = lse.masked_fill(~seen, float("-inf"))
        out = out.masked_fill(~seen[..., None], 0.0)
    return out, lse.float() if lse.dtype != torch.float64 else lse


def _fused_backward(do, q, k, v, out, lse, allowed, bias, scale, causal=False):
    add = _op_mask(allowed, bias, q.dtype)
    lse_op = lse.masked_fill(torch.isneginf(lse), float("inf"))  # empty rows: P = exp(s - inf) = 0
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do.contiguous(), q, k, v, out.contiguous(), lse_op.to(torch.float64 if q.dtype == torch.float64
                                                               else torch.float32).contiguous(),
        0.0, causal, attn_mask=add, scale=scale)
    return dq, dk, dv


def _plain_scores(q, k, allowed, bias, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, n, m)
    if bias is not None:
        s = s + bias.to(s.dtype)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def _with_causal(allowed: Tensor | None, n: int, m: int, device, causal: bool) -> Tensor | None:
    if not causal:
        return allowed
    tri = torch.ones(n, m, dtype=torch.bool, device=device).tril()
    return tri if allowed is None else allowed & tri


def plain_forward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None, scale: float,
                  causal: bool = False) -> tuple[Tensor, Tensor]:
    """The formula in plain torch: ``(out, lse)`` of one block (arguments as in :func:`attend_block`)."""
    allowed = _with_causal(allowed, q.shape[2], k.shape[2], q.device, causal)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = _plain_scores(q.to(acc), k.to(acc), allowed, bias, scale)
    lse = torch.logsumexp(s, dim=-1)  # (B, H, n), -inf on empty rows
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])
    out = torch.matmul(p, v.to(acc))
    return out.to(q.dtype), lse


def reduce_to(grad: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
    """Sum ``grad`` over the dimensions where ``shape`` has size 1 (undo broadcasting), keeping them."""
    dims = [d for d, (g, s) in enumerate(zip(grad.shape, shape, strict=True)) if s == 1 and g != 1]
    return grad.sum(dim=dims, keepdim=True) if dims else grad


def tile_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, delta: Tensor, lse: Tensor,
                  allowed: Tensor | None = None, bias: Tensor | None = None, scale: float = 1.0,
                  keep: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The attention backward formula on one tile, given the rows' global ``lse`` and ``delta``.

    ``P = exp(s - lse)`` with ``s = q k^T * scale + bias`` (masked), ``dV = P^T dO``,
    ``dS = P (dO V^T - delta)``, ``dQ = dS K * scale``, ``dK = dS^T Q * scale``; with dropout
    (``keep``: ``keep / (1 - p)`` per score) ``P`` is dropped in ``dV`` and ``dO V^T`` alike.

    Args:
        do: ``(..., n, Dv)``; q: ``(..., n, D)``; k: ``(..., m, D)``; v: ``(..., m, Dv)``. The
            leading dimensions broadcast (grouped-query heads: k and v with a size-1 group
            dimension); ``dk`` and ``dv`` are summed back to k's and v's shapes.
        delta: ``(..., n, 1)`` ``rowsum(dO * out)`` of the rows' global output.
        lse: ``(..., n)`` natural log-sum-exp, ``-inf`` on rows that see nothing (``P = 0``).
        allowed, bias, keep: broadcastable to the ``(..., n, m)`` scores, or None.

    Returns:
        ``(dq, dk, dv, ds)`` in the inputs' dtype, ``ds`` the score gradient before ``scale``.
    """
    s = _plain_scores(q, k, allowed, bias, scale)  # (..., n, m)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), float("inf"))[..., None].to(s.dtype))
    pd = p if keep is None else p * keep
    dv = reduce_to(torch.matmul(pd.transpose(-1, -2), do), v.shape)  # (..., m, Dv)
    dp = torch.matmul(do, v.transpose(-1, -2))  # (..., n, m)
    if keep is not None:
        dp = dp * keep
    ds = p * (dp - delta)
    dq = torch.matmul(ds, k) * scale  # (..., n, D)
    dk = reduce_to(torch.matmul(ds.transpose(-1, -2), q) * scale, k.shape)  # (..., m, D)
    return dq, dk, dv, ds


def plain_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, allowed: Tensor | None,
                   bias: Tensor | None, scale: float, causal: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`tile_backward` of one block in its accumulation dtype (arguments as in :func:`attend_block_backward`)."""
    allowed = _with_causal(allowed, q.shape[2], k.shape[2], q.device, causal)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    doa = do.to(acc)
    delta = (doa * out.to(acc)).sum(-1, keepdim=True)  # (B, H, n, 1)
    dq, dk, dv, _ = tile_backward(doa, q.to(acc), k.to(acc), v.to(acc), delta, lse.to(acc), allowed,
                                  None if bias is None else bias.to(acc), scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _use_fused(q: Tensor, v: Tensor, bias: Tensor | None) -> bool:
    return (q.device.type == "cpu" and q.dtype in _FUSED_DTYPES and q.shape[-1] == v.shape[-1]
            and fused_status() is None and not (bias is not None and bias.requires_grad))


def _use_native(q: Tensor, bias: Tensor | None) -> bool:
    return (q.device.type == "cpu" and q.dtype == torch.float32 and native.status() is None
            and not (bias is not None and bias.requires_grad))


def block_path(q: Tensor, v: Tensor, bias_tile: Tensor | None = None) -> tuple[str, str | None]:
    """``(path, why)``: which path :func:`attend_block` takes for these inputs (``native``, ``fused`` or
    ``plain``) and, when it is not the native kernel, why not."""
    if _use_native(q, bias_tile):
        return "native", None
    why = native.status() or (f"{q.dtype} (the native kernel is float32)" if q.dtype != torch.float32 else
                              f"{q.device.type} tensors" if q.device.type != "cpu" else
                              "a bias that needs gradients")
    return ("fused" if _use_fused(q, v, bias_tile) else "plain"), why


def _check(q: Tensor, k: Tensor, v: Tensor, tile_mask: Tensor | None, bias_tile: Tensor | None) -> None:
    check_qkv(q, k, v, who="attend_block", same_heads=True)
    for name, t in (("tile_mask", tile_mask), ("bias_tile", bias_tile)):
        if t is None:
            continue
        try:
            torch.broadcast_shapes(t.shape, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
        except RuntimeError:
            raise ValueError(f"{name} must broadcast to (B, H, n, m) = {(q.shape[0], q.shape[1], q.shape[2], k.shape[2])},"
                             f" got {tuple(t.shape)}") from None
    if tile_mask is not None and tile_mask.dtype != torch.bool:
        raise ValueError(f"tile_mask must be a bool tensor (True = may attend), got {tile_mask.dtype}")


def attend_block(q: Tensor, k: Tensor, v: Tensor, *, tile_mask: Tensor | None = None,
                 bias_tile: Tensor | None = None, scale: float | None = None,
                 is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """Exact attention of ``q`` over one block of keys: ``(out, lse)``.

    Args:
        q: ``(B, H, n, D)`` queries.
        k: ``(B, H, m, D)`` keys; v: ``(B, H, m, Dv)`` values (same heads as ``q``).
        tile_mask: bool, broadcastable to ``(B, H, n, m)``, True where a query may see a key.
        bias_tile: additive score bias broadcastable to ``(B, H, n, m)``.
        scale: multiplier of ``q k^T`` (default ``1/sqrt(D)``).
        is_causal: also restrict query ``i`` of the block to keys ``0..i`` of the block (the
            top-left triangle, ANDed with ``tile_mask``). For a square block on the diagonal of
            a causal mask this is the causal tile itself, and the fused op then skips the
            upper triangle's work instead of reading a mask.

    Returns:
        ``out (B, H, n, Dv)`` in q's dtype and ``lse (B, H, n)`` (float32, float64 for
        float64 inputs): the log-sum-exp of the row's scaled, biased scores over the keys
        it may see; ``-inf`` (with ``out`` 0) for a row that may see none.

    Not differentiable through autograd (use :func:`attend_block_backward`, which takes
    the global ``out`` and ``lse`` after merging).
    """
    _check(q, k, v, tile_mask, bias_tile)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    with torch.no_grad():
        if _use_native(q, bias_tile):
            return native.block_forward(q, k, v, tile_mask, bias_tile, scale, bool(is_causal))
        if _use_fused(q, v, bias_tile):
            return _fused_forward(q, k, v, tile_mask, bias_tile, scale, bool(is_causal))
        return plain_forward(q, k, v, tile_mask, bias_tile, scale, bool(is_causal))


def attend_block_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *,
                          tile_mask: Tensor | None = None, bias_tile: Tensor | None = None,
                          scale: float | None = None, is_causal: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of one key block given the rows' *global* ``out`` and ``lse``.

    ``dq`` is this block's share (sum the shares over blocks); ``dk`` and ``dv`` are the
    block's gradients. Arguments as in :func:`attend_block`; ``dout`` and ``out`` are
    ``(B, H, n, Dv)``, ``lse`` is ``(B, H, n)`` with ``-inf`` for rows that see no key at all.
    """
    _check(q, k, v, tile_mask, bias_tile)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    with torch.no_grad():
        if _use_native(q, bias_tile):
            return native.block_backward(dout, q, k, v, out, lse, tile_mask, bias_tile, scale, bool(is_causal))
        if _use_fused(q, v, bias_tile):
            return _fused_backward(dout, q, k, v, out, lse, tile_mask, bias_tile, scale, bool(is_causal))
        return plain_backward(dout, q, k, v, out, lse, tile_mask, bias_tile, scale, bool(is_causal))


def merge_partials(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Merge two partial results over disjoint key sets into the result over their union.

    ``out_*`` are ``(..., n, Dv)``, ``lse_*`` ``(..., n)``; rows with ``lse = -inf`` contribute
    nothing. Computed in ``lse``'s dtype; returns ``(out, lse)`` with ``out`` in ``out_a``'s dtype.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    ref = lse.masked_fill(torch.isneginf(lse), 0.0)
    wa = torch.exp(lse_a - ref)[..., None]  # 0 where lse_a = -inf
    wb = torch.exp(lse_b - ref)[..., None]
    out = wa * out_a.to(lse.dtype) + wb * out_b.to(lse.dtype)
    return out.to(out_a.dtype), lse
