"""The ``native`` backend: attnlab's own CPU attention kernel (C++, on PyTorch's oneDNN micro-GEMM).

FlashAttention's algorithm (Dao et al., 2022; the backward of FlashAttention-2, Dao 2023)
written for the CPU in ``native_attn.cpp``: every product is a call of
``at::native::cpublas::brgemm``, the oneDNN micro-kernel PyTorch itself uses (on AVX-512
it runs float32 tiles about twice as fast as the MKL path PyTorch's own CPU flash kernel
takes). The forward walks, per (batch, head, 64-row query block), only the 64-key tiles
the block's rows may see, with an online softmax; the backward owns, per (batch, kv head,
chunk of key blocks), its keys' gradients and adds the rows' ``dq``, given the rows' global
``out`` and ``lse``. Masks reach it as per-row key intervals and bit tiles
(:mod:`attnlab.exact.native_layout`); a bias tensor is read in place through its strides;
grouped-query heads are an index mapping (query head ``h`` reads key/value head ``h // G``).
A bias function that declares itself relative (``fn.relative = True``: a function of the head
and of the key's position minus the query's alone, as ALiBi and T5's buckets are) is evaluated
once per relative distance (:func:`relative_table`) and read by the kernel along the tile's
diagonals; its table's gradient comes back from the backward, and autograd carries it to the
tensors the function reads (a T5 bucket table).

It computes the ``math`` backend's function (the readable picture it is checked against,
with :func:`attnlab.exact.tiles.plain_forward` for ``(out, lse)``). Float32 on CPU, and bfloat16
where the CPU has ``avx512_bf16`` (:func:`attnlab.exact.native_build.bf16_status`): bfloat16 products
with float32 accumulation, the softmax, ``lse`` and the gradient sums in float32, ``out`` and the
gradients returned in bfloat16 (an odd head dim is padded with a zero column, the products read
pairs); without ``avx512_bf16`` bfloat16 calls take the path they took before. No
dropout, no weights, no bias function that is not relative, no bias tensor that needs
gradients (those stay on the ``chunked`` backend's other paths). Time proportional to the allowed area,
O(B H N M D) for a dense mask; memory O(B H (N + M) D) forward and backward, plus the
tile table of a mask that has one. ``chunked`` on CPU runs this kernel whenever it serves a
call (so ``auto``, which costs ``chunked``, learns its speed from ``attnlab bench calibrate``);
:func:`set_native_enabled` turns it off for comparisons.

How it is built and when it is not used: :mod:`attnlab.exact.native_build`
(:func:`status` says why not, in one line).

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``G = H / Hkv``,
``N`` queries, ``M`` keys, ``D`` head dim, ``Dv`` value head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .call import AttentionCall
from .native_build import bf16_status, library, set_native_enabled, status
from .native_layout import BLOCK_K, BLOCK_Q, KernelMask, kernel_mask, visible_pairs
from .registry import Backend, register_backend

__all__ = ["KernelMask", "bf16_status", "block_backward", "block_forward", "call_reason", "kernel_mask", "native_attention",
           "native_backward", "native_estimate", "native_forward", "rel_bias", "relative_table", "set_native_enabled",
           "status"]


def _rows(t: Tensor) -> Tensor:
    """``t`` itself when the kernel can read it in place, else a contiguous copy.

    In place: a contiguous last dimension and rows at least a row apart (any batch and head strides,
    broadcast ones included). A row stride below the row's size (an ``expand`` of one row, the
    ``dout`` of ``out.sum(2)``, overlapping views) would be a GEMM operand with ``lda < K``: copied.
    """
    if t.numel() == 0:
        return t
    last_ok = t.stride(-1) == 1 or t.shape[-1] == 1
    rows_ok = t.shape[-2] == 1 or t.stride(-2) >= t.shape[-1]
    return t if last_ok and rows_ok else t.contiguous()


_DTYPES = (torch.float32, torch.bfloat16)

def _check(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, **more: Tensor | None) -> None:
    if bias is not None and bias.dtype != torch.float32:
        raise ValueError(f"bias must be float32 for the native kernel, got {bias.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v), ("bias", bias), *more.items()):
        if t is None:
            continue
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor for the native kernel, got {t.device}")
        if name != "bias" and (t.dtype not in _DTYPES or t.dtype != q.dtype):
            raise ValueError(f"{name} must be float32 or bfloat16 (as q, {q.dtype}) for the native kernel, "
                             f"got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or \
            q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q (B, H, N, D), k (B, Hkv, M, D) and v (B, Hkv, M, Dv) with H a multiple of Hkv, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _even(t: Tensor) -> Tensor:
    """A bfloat16 ``t`` with an odd last dimension padded by one zero column (the kernel's bfloat16 products
    read the head dims in pairs; a zero column changes no score and no output), else ``t``."""
    if t.dtype != torch.bfloat16 or t.shape[-1] % 2 == 0:
        return t
    return torch.nn.functional.pad(t, (0, 1))  # (..., D + 1)


def _ops():
    ops = library()
    if ops is None:
        raise RuntimeError(f"the native kernel is not available: {status()}")
    return ops


def native_forward(q: Tensor, k: Tensor, v: Tensor, mask: KernelMask | None = None, *, dense: Tensor | None = None,
                   bias: Tensor | None = None, rel: Tensor | None = None, scale: float) -> tuple[Tensor, Tensor]:
    """``(out (B, H, N, Dv), lse (B, H, N))`` of the kernel; ``lse`` is -inf (and ``out`` 0) on rows that see nothing.

    ``mask`` from :func:`kernel_mask`; ``dense`` a bool ``(B, H, N, M)`` view (any strides,
    broadcast ones included) ANDed with it; ``bias`` a float32 ``(B, H, N, M)`` view, or instead
    ``rel`` a float32 ``(1|H, N + M - 1)`` bias of the relative position (:func:`relative_table`).
    """
    _check(q, k, v, bias=bias)
    m = mask or KernelMask()
    d = None if dense is None else dense.view(torch.uint8)
    r = None if rel is None else rel.detach().float().contiguous()
    with torch.no_grad():
        out, lse = _ops().forward(_rows(_even(q)), _rows(_even(k)), _rows(_even(v)), *m.args(), d, bias, r,
                                  float(scale), BLOCK_Q, BLOCK_K)
    return out[..., :v.shape[-1]], lse


def native_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    mask: KernelMask | None = None, *, dense: Tensor | None = None, bias: Tensor | None = None,
                    rel: Tensor | None = None, rel_grad: bool = False,
                    scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``(dq, dk, dv, drel)`` given the rows' global ``out`` and ``lse`` (arguments as in :func:`native_forward`);
    ``drel`` is the gradient of ``rel`` when ``rel_grad``, else None."""
    _check(q, k, v, bias=bias, dout=dout, out=out)
    m = mask or KernelMask()
    d = None if dense is None else dense.view(torch.uint8)
    r = None if rel is None else rel.detach().float().contiguous()
    with torch.no_grad():
        dq, dk, dv, drel = _ops().backward(_rows(_even(dout)), _rows(_even(q)), _rows(_even(k)), _rows(_even(v)),
                                           _rows(_even(out)), lse.float().contiguous(), *m.args(), d, bias, r,
                                           bool(rel_grad), float(scale), BLOCK_Q, BLOCK_K)
    D, Dv = q.shape[-1], v.shape[-1]
    return dq[..., :D], dk[..., :D], dv[..., :Dv], (drel if rel_grad else None)


# -- one block (attnlab.exact.tiles.attend_block) ---------------------------------------------------


def _block_inputs(q: Tensor, k: Tensor, tile_mask: Tensor | None, bias_tile: Tensor | None, is_causal: bool):
    B, H, n, m = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    mask = KernelMask()
    if is_causal:  # the block's top-left triangle: row i sees keys 0..i
        hi = torch.arange(1, n + 1, dtype=torch.int32).clamp(max=m).view(1, n)
        mask = KernelMask(torch.zeros_like(hi), hi)
    dense = None if tile_mask is None else tile_mask.expand(B, H, n, m)
    bias = None if bias_tile is None else bias_tile.to(torch.float32).expand(B, H, n, m)
    return mask, dense, bias


def block_forward(q: Tensor, k: Tensor, v: Tensor, tile_mask: Tensor | None, bias_tile: Tensor | None, scale: float,
                  is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`attnlab.exact.tiles.attend_block` on the kernel (q, k, v of the same heads, float32)."""
    mask, dense, bias = _block_inputs(q, k, tile_mask, bias_tile, is_causal)
    return native_forward(q, k, v, mask, dense=dense, bias=bias, scale=scale)


def block_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, tile_mask: Tensor | None,
                   bias_tile: Tensor | None, scale: float, is_causal: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`attnlab.exact.tiles.attend_block_backward` on the kernel."""
    mask, dense, bias = _block_inputs(q, k, tile_mask, bias_tile, is_causal)
    return native_backward(dout, q, k, v, out, lse, mask, dense=dense, bias=bias, scale=scale)[:3]


# -- a whole call (the native backend, and chunked on CPU) -----------------------------------------


def call_reason(call: AttentionCall) -> str | None:
    """None when the kernel computes ``call``; else why not (the kernel missing, or what the call needs)."""
    why = status()
    if why is not None:
        return why
    if call.device.type != "cpu":
        return f"the native kernel runs on CPU, the call is on {call.device.type}"
    if call.dtype not in _DTYPES:
        return f"the native kernel is float32 or bfloat16, the call is {call.dtype}"
    if call.dtype == torch.bfloat16:
        why = bf16_status()
        if why is not None:
            return why
    if call.dropout_p > 0:
        return "dropout: the native kernel has no counter-based dropout stream"
    if call.return_weights:
        return "does not materialize the weights (return_weights=True needs 'math')"
    if call.bias is not None and call.bias.requires_grad:
        return "a bias tensor that needs gradients (the native kernel returns none for it)"
    if call.bias_fn is not None and not getattr(call.bias_fn, "relative", False):
        return "a bias function that does not declare itself relative (evaluated tile by tile on the fused path)"
    if call.bias_fn is not None and call.bias is not None:
        return "a bias tensor and a bias function together"
    return None


def relative_table(call: AttentionCall) -> Tensor:
    """``(1|H, N + M - 1)``: a relative bias function (``fn.relative = True``) at every relative position.

    Entry ``d + M - 1`` holds the bias of a key ``d`` positions after the query's position
    (``-(M - 1) <= d <= N - 1``), evaluated once at one (query, key) pair per distance; it carries
    the function's autograd graph (a T5 bucket table, ALiBi slopes) when grad is enabled.
    """
    N, M = call.N, call.M
    d = torch.arange(-(M - 1), N, device=call.device)  # (N + M - 1,) key position - query position
    q = torch.where(d <= 0, N - 1, 0)  # the last query (position M - 1) for keys at or before it, else the first
    k = torch.where(d <= 0, M - 1 + d, M - N + d)
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=call.device)
    h = torch.arange(call.H, device=call.device).view(1, -1, 1, 1)
    t = call.bias_fn(b, h, q.view(1, 1, -1, 1), k.view(1, 1, -1, 1))  # (1, H|1, N + M - 1, 1)
    t = torch.as_tensor(t, device=call.device)
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t.reshape(t.shape[1], -1).to(torch.float32)  # (H|1, N + M - 1)


def _dense_bias(call: AttentionCall) -> Tensor | None:
    if call.bias is None:
        return None
    return call.bias.to(torch.float32).expand(call.B, call.H, call.N, call.M)  # (B, H, N, M) view


def rel_bias(rel: Tensor, N: int, M: int) -> Tensor:
    """``(1, 1|H, N, M)``: the bias a relative table ``(1|H, N + M - 1)`` gives each (query, key) pair, as the
    kernel reads it (key ``j`` of query row ``i`` reads entry ``(N - 1) - i + j``); differentiable in ``rel``."""
    idx = torch.arange(M, device=rel.device).view(1, -1) - torch.arange(N, device=rel.device).view(-1, 1) + N - 1
    return rel[:, idx].unsqueeze(0)  # (1, H|1, N, M)


def _graph_grads(ctx, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, rel: Tensor | None) -> tuple:
    """The gradients through the ``math`` backend's formula in differentiable torch ops: the backward of a
    ``create_graph=True`` pass (gradient penalties, Hessian-vector products), whose own graph autograd needs."""
    from .torch_math import MathBackend

    bias = ctx.bias
    if rel is not None:
        bias = rel_bias(rel, q.shape[2], k.shape[2])
    call = AttentionCall(q=q, k=k, v=v, mask=ctx.call_mask, bias=bias, bias_fn=None, scale=ctx.scale, dropout_p=0.0,
                         dropout_seed=0, return_weights=False)
    with torch.enable_grad():
        out = MathBackend().forward(call)[0]
    inputs = [t for t, need in zip((q, k, v, rel), ctx.needs_input_grad[:4]) if need]
    got = iter(torch.autograd.grad(out, inputs, dout, create_graph=True, allow_unused=True))
    return tuple(next(got) if need else None for need in ctx.needs_input_grad[:4])


class _NativeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rel, mask: KernelMask, bias, scale: float, call_mask):
        out, lse = native_forward(q, k, v, mask, bias=bias, rel=rel, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, rel)
        ctx.mask, ctx.bias, ctx.scale, ctx.call_mask = mask, bias, scale, call_mask
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rel = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the kernel's gradients would be constants to autograd
            return (*_graph_grads(ctx, dout, q, k, v, rel), None, None, None, None)
        rel_grad = rel is not None and ctx.needs_input_grad[3]
        dq, dk, dv, drel = native_backward(dout, q, k, v, out, lse, ctx.mask, bias=ctx.bias, rel=rel,
                                           rel_grad=rel_grad, scale=ctx.scale)
        return dq, dk, dv, (drel.to(rel.dtype) if rel_grad else None), None, None, None, None


def native_attention(call: AttentionCall) -> Tensor:
    """The kernel on a validated call (see :func:`call_reason`): ``(B, H, N, Dv)``, differentiable in q, k, v
    and in the tensors a relative bias function reads (twice too: a ``create_graph=True`` backward runs the
    ``math`` formula's, so gradient penalties keep every term)."""
    mask = kernel_mask(call.mask, call.N, call.M, call.device)
    bias = _dense_bias(call)
    rel = relative_table(call) if call.bias_fn is not None else None  # carries the function's graph under grad
    if call.needs_grad or (rel is not None and rel.requires_grad):
        return _NativeFn.apply(call.q, call.k, call.v, rel, mask, bias, call.scale, call.mask)
    return native_forward(call.q, call.k, call.v, mask, bias=bias, rel=rel, scale=call.scale)[0]


#: cost model in the registry's units (flop-equivalents at SDPA speed): the kernel's speed relative
#: to SDPA's on the allowed area, forward and forward+backward (measured about 1.8x and 2.0x on a
#: 2-core Zen 5 at N=4096, B=1, H=8, D=64), and a fixed cost per call (the mask's translation and
#: the Python around the op: about 70 us more than an SDPA call, measured on one decoding query)
_EFFICIENCY_FWD = 1.8
_EFFICIENCY_FWD_BWD = 2.0
_CALL_COST = 1.5e7


def native_estimate(call: AttentionCall) -> float:
    """Cost of ``call`` on the kernel: the allowed area (by the mask's intervals or tiles) plus a fixed cost."""
    if call.mask is None:
        area = float(call.N * call.M)
    else:
        iv = None
        parts = call.mask.row_interval(call.N, call.M) if call.N * call.M > 0 else None
        if parts is not None:
            lo, hi = (t.clamp(0, call.M) for t in parts)
            iv = float((hi - lo).clamp(min=0).sum()) / lo.shape[0] + call.N * BLOCK_K / 2  # ragged tile edges
        # else the tiles' kinds alone (never the bit tiles: O(E) for a graph), cached per mask and shape
        area = iv if iv is not None else visible_pairs(call.mask, call.N, call.M)
    work = 2.0 * call.B * call.H * area * (call.D + call.Dv)
    eff = _EFFICIENCY_FWD_BWD if call.needs_grad else _EFFICIENCY_FWD
    return work / eff + _CALL_COST


@register_backend
class NativeBackend(Backend):
    name = "native"
    summary = "attnlab's C++ kernel on oneDNN's micro-GEMM (CPU, float32; bfloat16 with avx512_bf16); chunked runs it"
    #: ``auto`` costs ``chunked``, which runs this kernel whenever it serves a call (one cost line per kernel)
    in_auto = False

    def available(self) -> str | None:
        return status()

    def supports(self, call: AttentionCall) -> str | None:
        return call_reason(call)

    def estimate(self, call: AttentionCall) -> float:
        return native_estimate(call)

    def forward(self, call: AttentionCall):
        return native_attention(call), None
