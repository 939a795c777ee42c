"""One attention request, validated once and handed to every backend.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads (``H`` is a
multiple of ``Hkv``; query head ``h`` reads key/value head ``h // (H // Hkv)``),
``N`` queries, ``M`` keys, ``D`` query/key head dim, ``Dv`` value head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..masks import Mask, as_mask

BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class AttentionCall:
    """A validated call of :func:`attnlab.attention`.

    Attributes:
        q: ``(B, H, N, D)``; k: ``(B, Hkv, M, D)``; v: ``(B, Hkv, M, Dv)``.
        mask: where attention is allowed, or None.
        bias: additive score bias, a tensor broadcastable to ``(B, H, N, M)``, or None.
        bias_fn: additive score bias as a function of index tensors ``(b, h, q_idx, kv_idx)``. A
            function with the attribute ``relative = True`` promises to depend on the head and on
            ``kv_idx - (q_idx + M - N)`` alone (ALiBi, T5's buckets); kernels may then evaluate it
            once per relative distance (:func:`attnlab.exact.native.relative_table`).
        scale: multiplier of ``q @ k^T`` (default ``1/sqrt(D)``).
        dropout_p: probability of dropping an attention weight.
        dropout_seed: seed of the counter-based dropout stream (same seed, same drops,
            on every backend that uses it).
        return_weights: whether the caller wants the ``(B, H, N, M)`` weights.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Mask | None
    bias: Tensor | None
    bias_fn: BiasFn | None
    scale: float
    dropout_p: float
    dropout_seed: int
    return_weights: bool

    # -- sizes -----------------------------------------------------------------------
    @property
    def B(self) -> int:  # noqa: N802 - shape letters are the documented legend
        return self.q.shape[0]

    @property
    def H(self) -> int:  # noqa: N802
        return self.q.shape[1]

    @property
    def Hkv(self) -> int:  # noqa: N802
        return self.k.shape[1]

    @property
    def G(self) -> int:  # noqa: N802
        """Query heads per key/value head."""
        return self.H // self.Hkv

    @property
    def N(self) -> int:  # noqa: N802
        return self.q.shape[2]

    @property
    def M(self) -> int:  # noqa: N802
        return self.k.shape[2]

    @property
    def D(self) -> int:  # noqa: N802
        return self.q.shape[3]

    @property
    def Dv(self) -> int:  # noqa: N802
        return self.v.shape[3]

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def needs_grad(self) -> bool:
        """True when autograd will differentiate through this call."""
        if not torch.is_grad_enabled():
            return False
        ts = [self.q, self.k, self.v] + ([self.bias] if self.bias is not None else [])
        return any(t.requires_grad for t in ts)

    def flops(self) -> float:
        """Multiply-adds x2 of the two products for the full N x M score matrix."""
        return 2.0 * self.B * self.H * self.N * self.M * (self.D + self.Dv)

    def has_bias(self) -> bool:
        return self.bias is not None or self.bias_fn is not None

    # -- materialization helpers (used by the dense backends) -------------------------
    def dense_mask(self) -> Tensor | None:
        """Boolean mask, compact where it does not depend on a dim, or None."""
        if self.mask is None:
            return None
        return self.mask.dense(self.N, self.M, device=self.device, batch=self.B, heads=self.H)

    def dense_bias(self, dtype: torch.dtype | None = None) -> Tensor | None:
        """Additive bias broadcastable to ``(B, H, N, M)`` (tensor + function), or None."""
        out = None
        if self.bias is not None:
            out = self.bias
        if self.bias_fn is not None:
            fb = self.bias_fn(*index_grid(self.B, self.H, 0, self.N, 0, self.M, self.device))
            out = fb if out is None else out + fb
        if out is not None and dtype is not None:
            out = out.to(dtype)
        return out

    def bias_tile(self, q0: int, q1: int, k0: int, k1: int) -> Tensor | None:
        """Bias for queries ``q0:q1`` and keys ``k0:k1``, broadcastable to ``(B, H, q1-q0, k1-k0)``."""
        out = None
        if self.bias is not None:
            b = self.bias
            while b.ndim < 4:
                b = b.unsqueeze(0)
            rows = slice(q0, q1) if b.shape[2] != 1 else slice(None)
            cols = slice(k0, k1) if b.shape[3] != 1 else slice(None)
            out = b[:, :, rows, cols]
        if self.bias_fn is not None:
            fb = self.bias_fn(*index_grid(self.B, self.H, q0, q1, k0, k1, self.device))
            out = fb if out is None else out + fb
        return out


def index_grid(B: int, H: int, q0: int, q1: int, k0: int, k1: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Broadcastable index tensors ``(B,1,1,1)``, ``(1,H,1,1)``, ``(1,1,n,1)``, ``(1,1,1,m)``."""
    return (
        torch.arange(B, device=device).view(-1, 1, 1, 1),
        torch.arange(H, device=device).view(1, -1, 1, 1),
        torch.arange(q0, q1, device=device).view(1, 1, -1, 1),
        torch.arange(k0, k1, device=device).view(1, 1, 1, -1),
    )


# -- counter-based dropout -------------------------------------------------------------
_M32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer finalizer (xorshift-multiply), on int64 tensors holding uint32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def dropout_keep(seed: int, b: Tensor, h: Tensor, q: Tensor, k: Tensor, p: float) -> Tensor:
    """Which attention weights survive dropout: a pure function of (seed, b, h, q, k).

    Because it depends only on the indices, a tiled kernel can regenerate exactly the
    same drops in its backward pass, and the ``math`` and ``chunked`` backends drop the
    same weights for the same seed.
    """
    x = _mix32((b * 0x3C6EF372 + h * 0x1B873593 + seed) & _M32)
    x = _mix32(x ^ (q & _M32))
    x = _mix32(x ^ ((k * 0x9E3779B1) & _M32))
    return x >= int(p * 2**32)


def dropout_scale_tile(call: AttentionCall, q0: int, q1: int, k0: int, k1: int, dtype) -> Tensor:
    """``keep / (1 - p)`` for a tile, shape ``(B, H, q1-q0, k1-k0)``."""
    keep = dropout_keep(call.dropout_seed, *index_grid(call.B, call.H, q0, q1, k0, k1, call.device), call.dropout_p)
    return keep.to(dtype) / (1.0 - call.dropout_p)


# -- validation ------------------------------------------------------------------------


def _shape(t) -> str:
    return str(tuple(t.shape))


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, who: str = "", same_heads: bool = False,
              self_attention: bool = False, allow_empty: bool = False) -> None:
    """The one validator of ``q (B, H, N, D)``, ``k (B, Hkv, M, D)``, ``v (B, Hkv, M, Dv)``.

    Every entry point that takes q, k, v checks them here: the op (:func:`make_call`), the
    mechanisms, the per-block primitive, sequence parallelism, the diagnostics.

    Args:
        who: the caller's name, put before every message (``"reformer: ..."``).
        same_heads: ``H == Hkv`` is needed (the per-block primitive; grouped callers stack heads).
        self_attention: ``N == M`` is needed.
        allow_empty: no position is fine (a rank's shard of a sequence shorter than the world: the
            caller says why once every rank has been heard).

    Raises:
        ValueError: naming the argument and the shapes, dtypes or devices seen: a tensor that is
            not 4-D floating point, a dtype or device that differs, batch, (batch, heads, seq) of
            k and v, or head dim that do not agree, query heads that are not a multiple of the
            key/value heads, or an empty sequence.
    """
    pre = f"{who}: " if who else ""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{pre}{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{pre}{name} must have 4 dimensions (batch, heads, seq, head_dim), got shape {_shape(t)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{pre}{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{pre}q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{pre}q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"{pre}q, k, v must share the batch size, got q {_shape(q)}, k {_shape(k)}, v {_shape(v)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{pre}k and v must agree in (batch, heads, seq), got k {_shape(k)} and v {_shape(v)}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"{pre}q and k must have the same head_dim, got q {_shape(q)} and k {_shape(k)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0 or (same_heads and q.shape[1] != k.shape[1]):
        need = "equal to" if same_heads else "a multiple of"
        raise ValueError(f"{pre}the number of query heads must be {need} the key/value heads, got q heads "
                         f"{q.shape[1]} (q {_shape(q)}) and kv heads {k.shape[1]} (k {_shape(k)})")
    if (not allow_empty and (q.shape[2] == 0 or k.shape[2] == 0)) or q.shape[3] == 0:
        raise ValueError(f"{pre}q and k need at least one position and one feature, got q {_shape(q)}, k {_shape(k)}")
    if self_attention and q.shape[2] != k.shape[2]:
        raise ValueError(f"{pre}self-attention needs as many keys as queries, got N={q.shape[2]}, M={k.shape[2]}")


def _call_mask(mask, q: Tensor, k: Tensor):
    """``mask=`` of :func:`make_call` as a :class:`~attnlab.masks.Mask` on q's device, checked against the shapes."""
    B, H, N, _ = q.shape
    M = k.shape[2]
    m = as_mask(mask, "mask")
    if m is None:
        return None
    if m.batch_size is not None and m.batch_size not in (1, B):
        raise ValueError(f"mask is for batch size {m.batch_size} but q has batch size {B} (q {_shape(q)})")
    if m.num_heads is not None and m.num_heads not in (1, H):
        raise ValueError(f"mask is for {m.num_heads} heads but q has {H} heads (q {_shape(q)})")
    if isinstance(mask, Tensor):
        try:
            m.dense(N, M)  # checks the query/key sizes
        except ValueError as e:
            raise ValueError(f"mask of shape {_shape(mask)} does not broadcast to (B, H, N, M)=({B}, {H}, {N}, {M})") from e
    return m.to(q.device)


def _call_bias(bias, q: Tensor, k: Tensor) -> tuple[Tensor | None, object]:
    """``bias=`` of :func:`make_call` as ``(tensor (B|1, H|1, N|1, M|1) or None, function or None)``, checked."""
    if bias is None:
        return None, None
    if callable(bias) and not isinstance(bias, Tensor):
        return None, bias
    if not isinstance(bias, Tensor):
        raise ValueError(f"bias must be a tensor or a function of (b, h, q_idx, kv_idx), got {type(bias).__name__}")
    B, H, N, _ = q.shape
    M = k.shape[2]
    if not bias.dtype.is_floating_point:
        raise ValueError(f"bias must be a floating-point tensor, got dtype {bias.dtype}; use mask= for bool masks")
    if bias.ndim > 4:
        raise ValueError(f"bias must have at most 4 dimensions, got shape {_shape(bias)}")
    try:
        full = torch.broadcast_shapes(bias.shape, (B, H, N, M))
    except RuntimeError:
        full = None
    if full != (B, H, N, M):
        raise ValueError(f"bias of shape {_shape(bias)} does not broadcast to (B, H, N, M)=({B}, {H}, {N}, {M})")
    if bias.device != q.device:
        raise ValueError(f"bias is on {bias.device} but q is on {q.device}")
    while bias.ndim < 4:
        bias = bias.unsqueeze(0)
    return bias, None


def make_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask=None,
    bias=None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    dropout_seed: int | None = None,
) -> AttentionCall:
    """Validate the arguments of :func:`attnlab.attention` and bundle them.

    Raises:
        ValueError: naming the offending argument and the shapes/dtypes seen.
    """
    check_qkv(q, k, v)
    m = _call_mask(mask, q, k)
    bias_t, bias_fn = _call_bias(bias, q, k)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    elif not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    if dropout_p > 0 and dropout_seed is None:
        dropout_seed = int(torch.randint(0, 2**31 - 1, (), device="cpu"))
    return AttentionCall(
        q=q,
        k=k,
        v=v,
        mask=m,
        bias=bias_t,
        bias_fn=bias_fn,
        scale=float(scale),
        dropout_p=float(dropout_p),
        dropout_seed=int(dropout_seed or 0),
        return_weights=bool(return_weights),
    )
