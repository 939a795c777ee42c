"""Adaptive attention span: each head learns how far back it looks, and skips the keys beyond.

Sukhbaatar, Grave, Bojanowski and Joulin, 2019, "Adaptive Attention Span in Transformers".
Head ``h`` has a span ``z_h`` in ``[0, S]`` (``S = max_span``), stored as the fraction
``z_h / S`` (a parameter ``(H,)``, clamped to ``[0, 1]`` before every training forward, as
the paper clamps it after each step). A key at distance ``x = p - j >= 0`` behind the
query's position ``p`` is weighted by the soft mask

    m_z(x) = clamp((R + z - x) / R, 0, 1)        (R = ramp)

which is 1 up to the span, falls linearly to 0 over the next ``R`` positions, and is 0
beyond. The weights are the masked exp-scores renormalised,

    a_pj = m(p - j) exp(s_pj) / sum_k m(p - k) exp(s_pk),

which is softmax attention with the additive bias ``log m`` (``-inf`` where ``m = 0``): that
is how it runs, as :func:`attnlab.attention` with a *relative* bias function (a function of
the head and of the distance alone, which the native CPU kernel tabulates once per distance
and differentiates, so the gradient reaches ``z``). ``m`` is differentiable in ``z`` on the
ramp (``d log m / dz = 1 / (R m)``) and constant elsewhere, so only the keys on a head's ramp
move its span; the penalty (below) pulls every span down.

Keys beyond the spans are skipped, not only masked: each head's keys lie within
``w_h = ceil(z_h + R)`` rounded up to a multiple of ``window_multiple`` (so the shapes the
kernel sees change rarely), computed from the current spans without gradient. The heads that
share a window run as one call whose mask is the user's causal mask ``& sliding_window(w_h)``
(one call over the widest window when the windows are alike, :meth:`AdaptiveSpan.groups_pay`, or
when the mask differs by head), so a head with a short span costs a short
window even when another head of the layer looks far back. Every key a head may weight lies
inside its window, so the windows change nothing but the work: the native kernel and
``chunked`` walk only the tiles they reach.

Loss: :meth:`AdaptiveSpan.extra_loss` is ``penalty * mean_h z_h`` (spans in positions, one
term per layer, summed over layers by :func:`attnlab.mechanisms.extra_loss`, added by the
trainer to the mean cross-entropy in nats): an L1 penalty on the spans.

Masks: causal only (the span counts keys before the query): the mask must hide every key
after its query (``causal()``, ``causal() & padding``, ...); a single query against its keys
(decoding) needs none. Any additive bias combines with the span's (a relative bias function,
ALiBi or T5, stays on the native kernel). No weights.

Time O(B N (D + Dv) sum_h w_h) with ``w_h = min(M, window of head h)``; memory O(B H (N + M) D) plus the
``(H, N + M - 1)`` table of the bias.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries, ``M``
keys, ``D`` head dim, ``Dv`` value dim, ``S`` max span, ``R`` ramp, ``w`` window.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..exact import attention, make_call
from ..exact.call import BiasFn
from ..exact.registry import get_backend
from ..masks import Mask, as_mask, sliding_window
from ..utils import positive_int
from .base import Cost, Mechanism, reason, register_mechanism

__all__ = ["AdaptiveSpan", "hides_future", "span_mask"]


def span_mask(distance: Tensor, span: Tensor, ramp: float) -> Tensor:
    """The soft mask ``m_z(x) = clamp((R + z - x) / R, 0, 1)`` (broadcasting ``distance`` and ``span``)."""
    return ((ramp + span - distance) / ramp).clamp(0.0, 1.0)


def _log_mask(m: Tensor) -> Tensor:
    """``log m``, ``-inf`` where ``m = 0`` (with a zero gradient there, not NaN)."""
    tiny = torch.finfo(m.dtype).tiny
    return torch.where(m > 0, m.clamp_min(tiny).log(), torch.full_like(m, -math.inf))


def _windowed(user: Mask | None, window: int | None) -> Mask | None:
    """``user & sliding_window(window)`` (``window`` None: the user's mask alone)."""
    if window is None:
        return user
    win = sliding_window(window, 0)
    return win if user is None else user & win


def hides_future(mask: Mask | None, n_q: int, n_k: int, device=None) -> bool:
    """True when ``mask`` lets no query see a key after its own (bottom-right aligned) position.

    Read from the mask's row intervals when it has them, else from its dense form. No mask
    hides the future only for a single query (position ``M - 1`` sees every key).
    """
    if mask is None:
        return n_q <= 1
    p = torch.arange(n_q, device=device) + (n_k - n_q)  # (N,) query positions
    iv = mask.row_interval(n_q, n_k, device)
    if iv is not None:
        lo, hi = (t.clamp(0, n_k) for t in iv)  # (B'|1, N) each: row i sees keys lo <= j < hi
        return bool(((hi <= p + 1) | (hi <= lo)).all())
    allowed = mask.dense(n_q, n_k, device=device)  # (B|1, H|1, N, M)
    after = torch.arange(n_k, device=device).view(1, -1) > p.view(-1, 1)  # (N, M)
    return not bool((allowed & after).any())


@register_mechanism
class AdaptiveSpan(Mechanism):
    """Causal attention whose heads each learn a span ``z_h``: a soft ramp mask and an L1 penalty.

    Args:
        max_span: the largest span ``S`` (positions); spans are ``z_h = S * fraction_h``.
        heads: number of query heads, one span each (None: one span shared by every head).
            Models fill it in from their config.
        ramp: length ``R`` of the mask's linear fall from 1 to 0 (positions; the paper's 32).
        init: initial fraction ``z_h / S`` of every head, in ``[0, 1]`` (the paper starts at 0:
            the spans grow as the loss needs them).
        penalty: weight of the span penalty ``penalty * mean_h z_h`` (per layer, spans in
            positions); 0 turns it off.
        window_multiple: the skipped-key window ``ceil(max z + R)`` is rounded up to a multiple
            of this (the kernel's tile is 64 keys).
        backend: exact-attention backend (``"auto"`` or a name from :func:`attnlab.exact.backends`).
    """

    name = "adaptive-span"
    masks_supported = "causal masks (every key after its query hidden), with any additive bias; no weights"
    padding_variant = None

    def __init__(self, max_span: int = 1024, heads: int | None = None, ramp: int = 32, init: float = 0.0,
                 penalty: float = 5e-7, window_multiple: int = 64, backend: str = "auto"):
        super().__init__()
        positive_int(max_span, "adaptive-span: max_span")
        positive_int(heads, "adaptive-span: heads", allow_none=True)
        positive_int(ramp, "adaptive-span: ramp")
        positive_int(window_multiple, "adaptive-span: window_multiple")
        if not isinstance(init, (int, float)) or isinstance(init, bool) or not 0.0 <= init <= 1.0:
            raise ValueError(f"adaptive-span: init must be a fraction of max_span in [0, 1], got {init!r}")
        if not isinstance(penalty, (int, float)) or isinstance(penalty, bool) or not penalty >= 0.0:
            raise ValueError(f"adaptive-span: penalty must be a number >= 0, got {penalty!r}")
        if backend != "auto":
            get_backend(backend)  # raises ValueError naming the known backends
        self.max_span, self.heads, self.ramp, self.init = max_span, heads, ramp, float(init)
        self.penalty, self.window_multiple, self.backend = float(penalty), window_multiple, backend
        self.fraction = nn.Parameter(torch.full((heads or 1,), float(init)))  # (H|1,) z_h / S

    # -- the spans -------------------------------------------------------------------------
    def spans(self) -> Tensor:
        """Each head's current span in positions, ``(H|1,)``, differentiable (``S * clamp(fraction, 0, 1)``)."""
        return self.max_span * self.fraction.clamp(0.0, 1.0)

    @property
    def current_spans(self) -> list[float]:
        """Each head's span in positions now (for logs and pictures)."""
        return [round(float(z), 3) for z in self.spans().detach().cpu()]

    def window(self, n_keys: int) -> int | None:
        """How many keys before its own a query may weight now (``sliding_window(w)``), None: all ``n_keys``.

        ``ceil(max_h z_h + R)`` rounded up to a multiple of ``window_multiple``: every key with
        ``m > 0`` (distance below ``z + R``) lies within it.
        """
        return self._window_of(float(self.spans().detach().max()), n_keys)

    def head_windows(self, n_keys: int) -> list[int | None]:
        """Each head's window now (as :meth:`window` for that head's span alone), ``H`` entries (1 when shared)."""
        return [self._window_of(float(z), n_keys) for z in self.spans().detach().cpu()]

    #: :meth:`groups_pay`'s threshold: the heads' keys as a share of the widest window's for all heads
    group_share: float = 0.6

    def groups_pay(self, windows: list[int | None], n_keys: int) -> bool:
        """Whether one call per window is worth it: the heads' keys then at most ``group_share`` of the widest's.

        Keys of a window ``w``: ``w`` plus one tile for the diagonal (``window_multiple``), at most
        ``n_keys``. The threshold comes from ``scripts/span_groups_speed.py`` (docs/dynamic.md): with
        windows alike, the copies and the extra call cost what the narrower windows save.
        """
        if len(set(windows)) == 1:
            return False
        keys = [n_keys if w is None else min(n_keys, w + self.window_multiple) for w in windows]
        return sum(keys) <= self.group_share * len(keys) * max(keys)

    def _window_of(self, span: float, n_keys: int) -> int | None:
        need = math.ceil(span + self.ramp)
        w = math.ceil(need / self.window_multiple) * self.window_multiple
        return None if w >= n_keys - 1 else w

    def _clamp_(self) -> None:
        """Keep the stored fractions in ``[0, 1]`` (the paper clamps after each optimizer step)."""
        with torch.no_grad():
            f = self.fraction
            if bool((f < 0).any() | (f > 1).any()):
                f.clamp_(0.0, 1.0)

    def _head_spans(self, heads: int) -> Tensor:
        z = self.spans()  # (H|1,)
        if z.shape[0] not in (1, heads):
            raise ValueError(f"adaptive-span was built with heads={self.heads}, but the call has {heads} query heads")
        return z.expand(heads)  # (H,)

    def bias_fn(self, n_q: int, n_k: int, heads: int, head_index: Tensor | None = None) -> BiasFn:
        """The span's score bias ``log m_z(x)`` as a relative function ``(b, h, q_idx, kv_idx) -> bias``.

        Index tensors broadcast as :func:`attnlab.attention` passes them; the result has their
        broadcast shape and the spans' dtype, and carries the gradient to the spans.
        ``head_index`` (int64 ``(H',)``): the function is for a call over those heads only (its
        head ``h`` is head ``head_index[h]`` of the layer).
        """
        z, off, ramp = self._head_spans(heads), n_k - n_q, float(self.ramp)
        if head_index is not None:
            z = z[head_index]  # (H',)

        def adaptive_span_bias(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            x = (torch.as_tensor(q_idx) + off - torch.as_tensor(kv_idx)).to(z.dtype)  # distance back, (.., N, M)
            return _log_mask(span_mask(x, z[torch.as_tensor(h, device=z.device)], ramp))

        adaptive_span_bias.relative = True  # a function of the head and of the distance alone (kernels tabulate it)
        return adaptive_span_bias

    def dense_bias(self, n_q: int, n_k: int, heads: int) -> Tensor:
        """The span's bias as a tensor ``(1, H, N, M)`` (the reference the relative path equals)."""
        dev = self.fraction.device
        h = torch.arange(heads, device=dev).view(1, -1, 1, 1)
        qi = torch.arange(n_q, device=dev).view(1, 1, -1, 1)
        ki = torch.arange(n_k, device=dev).view(1, 1, 1, -1)
        return self.bias_fn(n_q, n_k, heads)(torch.zeros_like(h), h, qi, ki)  # (1, H, N, M)

    # -- attention -------------------------------------------------------------------------
    def call_mask(self, mask, n_q: int, n_k: int) -> Mask | None:
        """The mask of the exact call: the user's (causal) mask ``&`` the current (widest) window."""
        return _windowed(as_mask(mask, "mask"), self.window(n_k))

    def _check(self, q: Tensor, k: Tensor, v: Tensor, mask, bias, return_weights: bool) -> None:
        """Raise ValueError for what :meth:`forward` cannot serve (the reasons :meth:`supports` gives)."""
        call = make_call(q, k, v, mask=mask, bias=bias)
        if call.mask is not None:
            call.mask.validate(call.N, call.M)
        if return_weights:
            raise ValueError("adaptive-span: return_weights=True is not supported (use Exact with "
                             "bias=mech.dense_bias(N, M, H))")
        if self.fraction.shape[0] not in (1, call.H):
            raise ValueError(f"adaptive-span was built with heads={self.heads}, but the call has {call.H} query heads")
        if not hides_future(call.mask, call.N, call.M, q.device):
            raise ValueError(f"adaptive-span: needs a causal mask (its span counts keys before the query), "
                             f"got mask {call.mask!r} for {call.N} queries over {call.M} keys; pass masks.causal()")

    def _combined_bias(self, bias, n_q: int, n_k: int, heads: int, head_index: Tensor | None = None):
        """The span's bias plus the caller's: a relative function when both are functions, else a tensor.

        ``head_index``: for a call over those heads of the layer only (the caller's bias is read at them).
        """
        own = self.bias_fn(n_q, n_k, heads, head_index)
        if bias is None:
            return own
        if callable(bias):
            def summed(b, h, q_idx, kv_idx):
                layer_h = h if head_index is None else head_index[torch.as_tensor(h, device=head_index.device)]
                return own(b, h, q_idx, kv_idx) + bias(b, layer_h, q_idx, kv_idx)

            summed.relative = bool(getattr(bias, "relative", False))
            return summed
        dense = self.dense_bias(n_q, n_k, heads)  # (1, H, N, M)
        if head_index is None:
            return dense + bias  # (B|1, H, N, M)
        theirs = bias.index_select(-3, head_index.to(bias.device)) if bias.ndim >= 3 and bias.shape[-3] > 1 else bias
        return dense.index_select(1, head_index) + theirs  # (B|1, H', N, M)

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        """``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)``."""
        self._check(q, k, v, mask, bias, return_weights)
        if self.training:
            self._clamp_()
        N, M, H = q.shape[2], k.shape[2], q.shape[1]
        windows = self.head_windows(M)
        user = as_mask(mask, "mask")
        per_head_mask = user is not None and (user.num_heads or 1) > 1
        if per_head_mask or not self.groups_pay(windows, M):  # one call over the widest window
            return attention(q, k, v, mask=_windowed(user, self.window(M)), bias=self._combined_bias(bias, N, M, H),
                             backend=self.backend)
        return self._grouped(q, k, v, user, bias, windows)

    def _grouped(self, q: Tensor, k: Tensor, v: Tensor, user: Mask | None, bias, windows: list[int | None]) -> Tensor:
        """One exact call per group of heads that share a window; the outputs back in head order."""
        N, M, H, Hkv = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
        groups: dict[int | None, list[int]] = {}
        for h, w in enumerate(windows):
            groups.setdefault(w, []).append(h)
        outs, order = [], []
        for w, heads in groups.items():
            idx = torch.tensor(heads, device=q.device)  # (H',) the layer's heads in this call
            kv_idx = idx // (H // Hkv)  # (H',) their key/value heads (one each: no grouping inside the call)
            outs.append(attention(q.index_select(1, idx), k.index_select(1, kv_idx), v.index_select(1, kv_idx),
                                  mask=_windowed(user, w), bias=self._combined_bias(bias, N, M, H, idx),
                                  backend=self.backend))  # (B, H', N, Dv)
            order += heads
        inverse = torch.empty(H, dtype=torch.long, device=q.device)
        inverse[torch.tensor(order, device=q.device)] = torch.arange(H, device=q.device)
        return torch.cat(outs, 1).index_select(1, inverse)  # (B, H, N, Dv)

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None for a causal mask (or one query), any bias and no weights; else the reason."""
        why = reason(self._check, q, k, v, mask, bias, return_weights)
        if why is None and self.backend != "auto":
            call = make_call(q, k, v, mask=self.call_mask(mask, q.shape[2], k.shape[2]),
                             bias=self._combined_bias(bias, q.shape[2], k.shape[2], q.shape[1]))
            why = get_backend(self.backend).verdict(call)
        return why

    # -- training hooks --------------------------------------------------------------------
    @classmethod
    def model_settings(cls, heads: int, max_len: int) -> dict:
        """One span per head of the model, up to its longest sequence."""
        return {"heads": heads, "max_span": max_len}

    def extra_loss(self) -> Tensor | None:
        """``penalty * mean_h z_h`` (positions), None when ``penalty`` is 0."""
        return None if self.penalty == 0.0 else self.penalty * self.spans().mean()

    def log_values(self) -> dict[str, list[float]]:
        """``{"spans": [z_0, ..., z_{H-1}]}`` in positions."""
        return {"spans": self.current_spans}

    # -- the grid and the cost -------------------------------------------------------------
    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        """Spans reaching every key: exact causal attention."""
        return {"max_span": n, "init": 1.0}

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        return {"max_span": max(1, n // 2), "ramp": 2, "init": 0.5, "window_multiple": 1}

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        windows = self.head_windows(n_keys)
        if not self.groups_pay(windows, n_keys):
            windows = [self.window(n_keys)]  # one call over the widest window
        keys = sum(n_keys if w is None else min(n_keys, w + 1) for w in windows) * heads / len(windows)
        flops = 2.0 * batch * n_queries * keys * 2 * head_dim
        mem = 4.0 * batch * heads * (n_queries + n_keys) * head_dim * 2 + 4.0 * heads * (n_queries + n_keys)
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return (f"max_span={self.max_span}, heads={self.heads}, ramp={self.ramp}, penalty={self.penalty}, "
                f"window_multiple={self.window_multiple}, backend={self.backend!r}")
