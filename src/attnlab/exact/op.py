"""``attention()``: the one exact entry point, and ``explain()``: why each backend serves or not."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from . import native
from .calibration import predict
from .call import AttentionCall, make_call
from .registry import backends, get_backend


@dataclass(frozen=True)
class Verdict:
    """One backend's answer for one call."""

    backend: str
    reason: str | None  # None = serves the call
    estimate: float | None  # relative cost when it serves (lower is faster)
    chosen: bool = False
    note: str | None = None  # what to know when it serves (compile cost, a slow fallback kernel)

    @property
    def serves(self) -> bool:
        return self.reason is None


def _verdicts(call: AttentionCall) -> list[Verdict]:
    out = []
    for name, b in backends().items():
        why = b.verdict(call)
        est, note = None, None
        if why is None:
            est, note = b.estimate(call), b.note(call)
        out.append(Verdict(name, why, est, note=note))
    return out


def _choose(call: AttentionCall) -> tuple[str, list[Verdict]]:
    """Pick the cheapest backend that serves the call (auto candidates only)."""
    verdicts = _verdicts(call)
    candidates = [v for v in verdicts if v.serves and backends()[v.backend].in_auto]
    if not candidates:
        reasons = "; ".join(f"{v.backend}: {v.reason}" for v in verdicts if not v.serves)
        raise ValueError(f"no backend serves this call ({reasons})")
    # estimates are cost models in shared units; a calibration measured on this machine turns
    # each into predicted seconds (attnlab bench calibrate), else the shipped defaults do
    best = min(candidates, key=lambda v: predict(v.backend, v.estimate, call.needs_grad))
    return best.backend, [Verdict(v.backend, v.reason, v.estimate, v.backend == best.backend, v.note) for v in verdicts]


def _fast_path(call: AttentionCall) -> str | None:
    """Skip costing when SDPA is the obvious choice (no mask or a square causal one, and no native CPU kernel)."""
    if call.return_weights or call.has_bias() or call.dropout_p > 0:
        return None
    if call.mask is not None and not call.mask.is_causal(call.N, call.M):
        return None
    if native.call_reason(call) is None:  # the native kernel competes with SDPA on these calls: cost them
        return None
    bs = backends()
    flash = bs.get("flash")
    if call.device.type == "cuda" and flash is not None and flash.verdict(call) is None:
        return "flash"
    sdpa = bs.get("sdpa")
    if sdpa is not None and sdpa.supports(call) is None:
        return "sdpa"
    return None


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask=None,
    bias=None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Exact scaled dot-product attention: ``softmax(q k^T * scale + bias, masked) v``.

    Args:
        q: queries ``(B, H, N, D)``.
        k: keys ``(B, Hkv, M, D)``; ``H`` must be a multiple of ``Hkv`` (grouped-query
            attention: query head ``h`` reads key/value head ``h // (H // Hkv)``).
        v: values ``(B, Hkv, M, Dv)``.
        mask: where attention is allowed: an :class:`attnlab.masks.Mask` or a bool
            tensor broadcastable to ``(B, H, N, M)`` (True = may attend).
        bias: additive score bias: a float tensor broadcastable to ``(B, H, N, M)``,
            or a function ``bias(b, h, q_idx, kv_idx)`` of broadcastable index tensors
            that tiled backends evaluate per tile (ALiBi, relative position biases).
        scale: multiplier of ``q @ k^T``; default ``1 / sqrt(D)``.
        dropout_p: probability of dropping each attention weight (applied whenever
            > 0: pass 0.0 at evaluation time).
        return_weights: also return the softmax weights ``(B, H, N, M)`` (before
            dropout); served by the ``math`` and ``reference`` backends.
        backend: ``"auto"`` (the cheapest backend that serves the call) or a name
            from :func:`attnlab.exact.backends`.

    Returns:
        The output ``(B, H, N, Dv)``, or ``(output, weights)`` with ``return_weights``.
        A query row whose keys are all masked yields zeros (and zero gradients).

    Raises:
        ValueError: on malformed input (naming the argument and the shapes seen), an
            unknown backend, or a backend that cannot serve the call (with its reason).
    """
    call = make_call(q, k, v, mask=mask, bias=bias, scale=scale, dropout_p=dropout_p, return_weights=return_weights)
    if backend == "auto":
        name = _fast_path(call) or _choose(call)[0]
    else:
        name = backend
    b = get_backend(name)
    if backend != "auto":
        why = b.verdict(call)
        if why is not None:
            raise ValueError(f"backend {name!r} cannot serve this call: {why}")
    out, weights = b.forward(call)
    if return_weights:
        return out, weights
    return out


def explain(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> list[Verdict]:
    """Every backend's verdict for the call ``attention(q, k, v, **kwargs)``.

    Returns one :class:`Verdict` per registered backend: its reason when it cannot
    serve the call, its cost estimate (and a note such as a compile cost or a slow
    fallback kernel) when it can, and which one ``auto`` picks.
    """
    kwargs.pop("backend", None)
    call = make_call(q, k, v, **kwargs)
    name = _fast_path(call)
    chosen, verdicts = _choose(call)
    chosen = name or chosen
    return [Verdict(v.backend, v.reason, v.estimate, v.backend == chosen, v.note) for v in verdicts]


def choose_backend(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> str:
    """Name of the backend ``auto`` uses for this call."""
    return next(v.backend for v in explain(q, k, v, **kwargs) if v.chosen)
