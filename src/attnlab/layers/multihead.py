"""Multi-head attention layer: self or cross, grouped-query, KV cache, optional weights.

Vaswani et al., "Attention Is All You Need" (2017), section 3.2.2; grouped-query
attention from Ainslie et al., "GQA" (2023), multi-query from Shazeer (2019).
The layer projects its inputs, splits heads and hands ``(q, k, v, mask)`` to a
:class:`attnlab.mechanisms.Mechanism` (exact attention by default), then merges heads
and projects back. Time O(B N (dim * inner) + mechanism), where exact attention costs
O(B H N M D) time and, on its memory-lean backends, O(B H (N + M) D) memory.

Shape legend: ``B`` batch, ``N`` queries, ``M`` keys, ``H`` query heads, ``Hkv``
key/value heads, ``D`` head dim, ``dim`` model width; layer inputs are batch-first
``(B, N, dim)``, head tensors ``(B, H, N, D)``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..distributed import SequenceParallel
from ..mechanisms import Exact, Mechanism
from ..utils import positive_int
from .kv_cache import KVCache

__all__ = ["MultiHeadAttention", "QKTransform"]


@runtime_checkable
class QKTransform(Protocol):
    """What ``positional=`` must provide: a transform of queries and keys (rotary encodings).

    ``apply(q (B, H, N, D), k (B, Hkv, M, D), q_positions (N,), k_positions (M,))``
    returns the transformed ``(q, k)`` of the same shapes. Positions are ``int64``
    absolute sequence positions on the tensors' device; during cached decoding they
    continue from the cache length, so position ``t`` means the same token in a full
    and in an incremental forward.
    """

    def apply(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]: ...



class MultiHeadAttention(nn.Module):
    """Multi-head attention over batch-first sequences.

    The positional arguments are ``torch.nn.MultiheadAttention``'s, in its order:
    ``MultiHeadAttention(512, 8, 0.1)`` has attention dropout 0.1. Everything after
    ``bias`` is keyword-only.

    Args:
        embed_dim: model width of the queries and of the output (``dim`` below).
        num_heads: number of query heads ``H``.
        dropout: attention-weight dropout of the default mechanism (training mode only);
            ignored when ``mechanism`` is given (configure that mechanism instead).
        bias: whether the four projections have biases (initialized to zero).
        kv_heads: number of key/value heads ``Hkv`` (default ``num_heads``); fewer gives
            grouped-query attention (1 = multi-query). Must divide ``num_heads``; query
            head ``h`` reads key/value head ``h // (num_heads // kv_heads)``.
        kdim: feature size of ``key`` inputs (default ``embed_dim``), for cross-attention.
        vdim: feature size of ``value`` inputs (default ``embed_dim``, as in torch).
        mechanism: what mixes values, an :class:`attnlab.mechanisms.Mechanism` called as
            ``mechanism(q, k, v, mask, bias=bias, return_weights=return_weights)``;
            default ``Exact(backend="auto", dropout=dropout)``.
        head_dim: per-head size ``D`` (default ``embed_dim // num_heads``, which must then
            divide exactly); the inner width ``H * D`` need not equal ``embed_dim``.
        positional: default q/k transform for self-attention calls (for example
            :class:`attnlab.positional.RotaryEmbedding`), used when ``forward`` gets no
            ``positional=``; see :class:`QKTransform`.
        sequence_parallel: a :class:`attnlab.distributed.SequenceParallel` (process group,
            ring or Ulysses): self-attention inputs are then this rank's shard of the
            sequence, attention is exact over the whole sequence (masks and biases at global
            positions) and the positional transform sees global positions. Also settable as
            an attribute (:func:`attnlab.distributed.sequence_parallel` does so for a model).

    Deprecated for one release (each with a ``DeprecationWarning``): the keywords
    ``dim=`` and ``heads=`` (now ``embed_dim=`` and ``num_heads=``), and the old
    positional order ``(dim, heads, kv_heads, dropout, bias)``, recognized by an int >= 1
    as the third positional argument (pass ``kv_heads=`` by keyword instead). The
    attributes ``dim`` and ``heads`` are now ``embed_dim`` and ``num_heads``.

    Parameters ``q_proj (dim -> H*D)``, ``k_proj (kdim -> Hkv*D)``, ``v_proj (vdim ->
    Hkv*D)`` and ``out_proj (H*D -> dim)`` are separate ``nn.Linear`` modules, weights
    initialized with ``xavier_uniform_`` (as ``torch.nn.MultiheadAttention`` does for its
    input projection), biases with zeros.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        mechanism: Mechanism | None = None,
        head_dim: int | None = None,
        positional: QKTransform | None = None,
        sequence_parallel: SequenceParallel | None = None,
    ):
        super().__init__()
        dim = positive_int(embed_dim, "embed_dim")
        heads = positive_int(num_heads, "num_heads")
        kv_heads = heads if kv_heads is None else positive_int(kv_heads, "kv_heads")
        if heads % kv_heads != 0:
            raise ValueError(f"kv_heads must divide num_heads, got kv_heads={kv_heads} and num_heads={heads}")
        if head_dim is None:
            if dim % heads != 0:
                raise ValueError(
                    f"embed_dim must be divisible by num_heads (or pass head_dim=), got embed_dim={dim} and "
                    f"num_heads={heads}"
                )
            head_dim = dim // heads
        head_dim = positive_int(head_dim, "head_dim")
        kdim = dim if kdim is None else positive_int(kdim, "kdim")
        vdim = dim if vdim is None else positive_int(vdim, "vdim")
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if mechanism is not None and not callable(mechanism):
            raise ValueError(f"mechanism must be an attnlab Mechanism, got {type(mechanism).__name__}")
        if positional is not None and not callable(getattr(positional, "apply", None)):
            raise ValueError(f"positional must have an apply(q, k, q_positions, k_positions) method, got {positional!r}")

        self.embed_dim, self.num_heads, self.kv_heads, self.head_dim = dim, heads, kv_heads, head_dim
        self.kdim, self.vdim = kdim, vdim
        inner, kv_inner = heads * head_dim, kv_heads * head_dim
        self.q_proj = nn.Linear(dim, inner, bias=bias)
        self.k_proj = nn.Linear(kdim, kv_inner, bias=bias)
        self.v_proj = nn.Linear(vdim, kv_inner, bias=bias)
        self.out_proj = nn.Linear(inner, dim, bias=bias)
        self.mechanism = mechanism if mechanism is not None else Exact(backend="auto", dropout=float(dropout))
        self.positional = positional  # an nn.Module here is registered (moves with .to())
        self.sequence_parallel = sequence_parallel
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projection weights, zero biases."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    # -- helpers -----------------------------------------------------------------------
    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)  # (B, heads, n, D)

    def _check_input(self, x: Tensor, name: str, features: int, batch: int | None = None) -> None:
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"{name} must have 3 dimensions (batch, seq, features), got shape {tuple(x.shape)}")
        if x.shape[-1] != features:
            raise ValueError(f"{name} must have {features} features (last dim), got shape {tuple(x.shape)}")
        if batch is not None and x.shape[0] != batch:
            raise ValueError(f"{name} has batch size {x.shape[0]} but query has {batch} (shape {tuple(x.shape)})")

    def _project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        k = self._split(self.k_proj(key), self.kv_heads)  # (B, Hkv, M, D)
        v = self._split(self.v_proj(value), self.kv_heads)  # (B, Hkv, M, D)
        return k, v

    # -- forward -----------------------------------------------------------------------
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask=None,
        bias=None,
        return_weights: bool = False,
        cache: KVCache | None = None,
        positional: QKTransform | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, N, dim)``.
            key: ``(B, M, kdim)``; None for self-attention (keys and values are ``query``).
            value: ``(B, M, vdim)``; defaults to ``key``.
            mask: where attention is allowed (an :mod:`attnlab.masks` mask or a bool
                tensor broadcastable to ``(B, H, N, M)``), over *all* keys including
                cached ones. Position masks align bottom-right, so ``masks.causal()``
                is right for a chunk of new queries against a cache. For a torch-style
                ``key_padding_mask`` (True = ignore) pass ``masks.key_mask(~kpm)``.
            bias: additive score bias, a float tensor broadcastable to ``(B, H, N, M)``
                or a function of index tensors (see :func:`attnlab.attention`).
            return_weights: also return the attention weights ``(B, H, N, M)`` per head
                (torch's ``need_weights`` averages them over heads: take ``.mean(1)``).
            cache: a :class:`KVCache`. Growing cache (self-attention only): the new
                keys/values are appended and the queries attend to all cached positions
                (``M = cache.length`` after the append). Static cache
                (``KVCache(static=True)``, cross-attention): the first call projects
                ``key``/``value`` and stores them; later calls reuse them and may pass
                ``key=None`` (a ``key`` passed to a filled static cache is ignored).
            positional: an object with ``apply(q, k, q_positions, k_positions) -> (q, k)``
                (see :class:`QKTransform`), e.g. rotary encodings, applied to the head
                tensors before attention in self-attention only. Query and key positions
                are ``cache.length + arange(N)`` (0-based without a cache); keys are
                cached already transformed. Default: the layer's own ``positional``.

        Returns:
            ``out (B, N, dim)``, or ``(out, weights (B, H, N, M))`` with ``return_weights``.

        Raises:
            ValueError: on inputs of the wrong rank/size (naming the argument), a
                growing cache with ``key`` given, or ``positional`` in cross-attention.
        """
        positional = self.positional if positional is None else positional
        self._check_input(query, "query", self.embed_dim)
        B, N = query.shape[0], query.shape[1]
        if value is not None and key is None:
            raise ValueError("value given without key: pass key= too (or neither for self-attention)")
        if cache is not None and not isinstance(cache, KVCache):
            raise ValueError(f"cache must be an attnlab KVCache, got {type(cache).__name__}")
        static = cache is not None and cache.static
        cross = key is not None or static
        if cross and cache is not None and not static:
            raise ValueError(
                "a growing KVCache serves self-attention (key=None); for cross-attention use KVCache(static=True)"
            )
        if cross and positional is not None:
            raise ValueError(
                "positional (q/k transform) applies to self-attention only; this call is cross-attention "
                "(key= or a static cache given)"
            )

        sp = None if cross else self.sequence_parallel  # cross-attention of a shard needs no other rank
        if sp is not None and (cache is not None or return_weights):
            raise ValueError("sequence_parallel self-attention takes no cache and cannot return weights "
                             f"(cache={cache!r}, return_weights={return_weights})")
        q = self._split(self.q_proj(query), self.num_heads)  # (B, H, N, D)
        if not cross:
            if query.shape[-1] != self.kdim or query.shape[-1] != self.vdim:
                raise ValueError(
                    f"self-attention needs kdim == vdim == embed_dim, got embed_dim={self.embed_dim}, "
                    f"kdim={self.kdim}, vdim={self.vdim}: pass key= and value="
                )
            k, v = self._project_kv(query, query)  # (B, Hkv, N, D) each
            if positional is not None:
                past = 0 if cache is None else cache.length
                pos = torch.arange(past, past + N, device=query.device)  # (N,)
                if sp is not None:  # the global positions of this rank's shard
                    pos = sp.positions(N, query.device)  # (N,)
                q, k = positional.apply(q, k, pos, pos)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, T, D) each
        elif static and cache.filled:
            k, v = cache.k, cache.v  # (B, Hkv, M, D) each
            if k.shape[0] != B:
                raise ValueError(f"static cache holds batch size {k.shape[0]} but query has {B}")
        else:
            if key is None:
                raise ValueError("an empty static KVCache needs key= (the encoder output) on the first call")
            value = key if value is None else value
            self._check_input(key, "key", self.kdim, B)
            self._check_input(value, "value", self.vdim, B)
            if key.shape[1] != value.shape[1]:
                raise ValueError(
                    f"key and value must have the same length, got key {tuple(key.shape)} and value {tuple(value.shape)}"
                )
            k, v = self._project_kv(key, value)  # (B, Hkv, M, D) each
            if static:
                cache.set(k, v)

        if sp is not None:
            res = sp.attend(q, k, v, mask, bias, backend=self._sequence_parallel_backend())
        else:
            res = self.mechanism(q, k, v, mask, bias=bias, return_weights=return_weights)
        out, weights = res if return_weights else (res, None)
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim)  # (B, N, H*D)
        out = self.out_proj(out)  # (B, N, dim)
        if return_weights:
            return out, weights
        return out

    def _sequence_parallel_backend(self) -> str:
        """The exact backend sequence parallelism may use in place of the mechanism (which it must match)."""
        mech = self.mechanism
        if not isinstance(mech, Exact):
            raise ValueError(f"sequence_parallel computes exact attention, but this layer's mechanism is "
                             f"{type(mech).__name__}; use Exact (or no sequence parallelism)")
        if mech.dropout > 0 and self.training:
            raise ValueError(f"sequence_parallel attention has no attention dropout, but the mechanism's dropout is "
                             f"{mech.dropout} in training mode; set it to 0")
        return mech.backend

    # -- interop -----------------------------------------------------------------------
    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """A layer computing what ``mha`` computes, with its weights copied.

        The returned layer takes batch-first inputs ``(B, N, dim)`` whatever
        ``mha.batch_first`` says. ``mha``'s dropout becomes the default mechanism's
        attention dropout. Its ``key_padding_mask`` (True = ignore) becomes
        ``mask=masks.key_mask(~key_padding_mask)``, a boolean ``attn_mask`` (True = not
        allowed) becomes ``mask=~attn_mask``, a float ``attn_mask`` becomes ``bias=``.

        Raises:
            ValueError: for ``add_bias_kv`` / ``add_zero_attn``, which this layer lacks.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise ValueError(f"mha must be a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("mha uses add_bias_kv or add_zero_attn, which MultiHeadAttention does not support")
        bias = mha.in_proj_bias is not None
        ref = mha.out_proj.weight
        layer = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=bias, kdim=mha.kdim, vdim=mha.vdim)
        layer = layer.to(device=ref.device, dtype=ref.dtype)
        e = mha.embed_dim
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                wq, wk, wv = mha.in_proj_weight.split(e, dim=0)
            else:
                wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            layer.q_proj.weight.copy_(wq)
            layer.k_proj.weight.copy_(wk)
            layer.v_proj.weight.copy_(wv)
            layer.out_proj.weight.copy_(mha.out_proj.weight)
            if bias:
                bq, bk, bv = mha.in_proj_bias.split(e, dim=0)
                layer.q_proj.bias.copy_(bq)
                layer.k_proj.bias.copy_(bk)
                layer.v_proj.bias.copy_(bv)
                layer.out_proj.bias.copy_(mha.out_proj.bias)
        return layer

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kv_heads={self.kv_heads}, "
            f"head_dim={self.head_dim}, kdim={self.kdim}, vdim={self.vdim}"
        )
