"""Contract checks for attention: weights that are a distribution, masks that hold.

* :func:`check_attention` inspects a weight tensor ``(..., N, M)``: finite,
  non-negative, each row summing to 1 where the mask allows some key and to 0 where
  it allows none, and no weight on a disallowed key. Time and memory O(B H N M).
* :func:`leak_test` is the behavioural mask test of DESIGN.md for *any* attention
  callable ``attn_fn(q, k, v, mask) -> out``: it perturbs the keys and values a query
  may not see and asserts that query's output does not move. It runs one forward per
  distinct "hidden keys" pattern and trial (one per query row for a causal mask, one
  in all for key padding), so it suits small inputs.

Both raise :class:`AttentionCheckError` (a ``ValueError``) naming the offending
positions. Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads,
``N`` queries, ``M`` keys, ``D`` head dim, ``Dv`` value head dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..exact.call import check_qkv
from ..masks import Mask, as_mask

__all__ = ["AttentionCheckError", "AttentionReport", "check_attention", "leak_test"]

#: default tolerance of :func:`leak_test` per dtype (outputs of unperturbed queries)
_LEAK_ATOL = {torch.float64: 1e-10, torch.float32: 1e-5}
#: how many offending positions an error message lists
_SHOW = 8


class AttentionCheckError(ValueError):
    """An attention tensor or callable broke its contract (the message says where)."""


@dataclass(frozen=True)
class AttentionReport:
    """What :func:`check_attention` measured on weights that passed.

    Attributes:
        rows: number of query rows checked (product of all but the last dimension).
        empty_rows: rows where the mask allows no key (their weights must be 0).
        max_row_sum_error: largest ``|sum(row) - expected|`` (expected 1, or 0 for empty rows).
        max_masked_weight: largest ``|weight|`` on a disallowed key (0.0 without a mask).
        min_weight: smallest weight anywhere.
    """

    rows: int
    empty_rows: int
    max_row_sum_error: float
    max_masked_weight: float
    min_weight: float


def _positions(where: Tensor) -> str:
    """The first few indices where ``where`` is True, and how many there are."""
    idx = where.nonzero().tolist()
    shown = ", ".join(str(tuple(i)) for i in idx[:_SHOW])
    more = f" and {len(idx) - _SHOW} more" if len(idx) > _SHOW else ""
    return f"{shown}{more}"


def _allowed(mask, shape: torch.Size, device) -> Tensor | None:
    """``mask`` as a bool tensor expanded to ``shape`` (``(..., N, M)``), or None."""
    m = as_mask(mask, "mask")
    if m is None:
        return None
    n, mk = shape[-2], shape[-1]
    batch = shape[0] if len(shape) == 4 else None
    heads = shape[1] if len(shape) == 4 else None
    d = m.dense(n, mk, device=device, batch=batch, heads=heads)  # (B'|1, H'|1, N, M)
    while d.ndim > len(shape) and d.shape[0] == 1:
        d = d.squeeze(0)  # drop leading size-1 dims for weights of lower rank
    try:
        return d.expand(shape)
    except RuntimeError as e:
        raise ValueError(f"mask of dense shape {tuple(d.shape)} does not broadcast to the weights' shape {tuple(shape)}") from e


def check_attention(weights: Tensor, mask: Mask | Tensor | None = None, atol: float = 1e-5) -> AttentionReport:
    """Check that attention weights form a distribution over the allowed keys.

    Args:
        weights: ``(..., N, M)``, typically ``(B, H, N, M)`` from
            ``attnlab.attention(..., return_weights=True)``.
        mask: where attention is allowed (a Mask or a bool tensor broadcastable to
            the weights), or None when every key is allowed.
        atol: tolerance on row sums, on weights at disallowed keys and on negativity.

    Returns:
        An :class:`AttentionReport` of the measured errors.

    Raises:
        AttentionCheckError: on NaN/Inf, a negative weight, a row that does not sum to
            1 (0 where the mask allows no key), or weight on a disallowed key; the
            message lists the offending positions.
        ValueError: when ``weights`` is not a floating tensor with at least 2 dims or
            the mask does not fit it.
    """
    if not isinstance(weights, Tensor) or not weights.dtype.is_floating_point or weights.ndim < 2:
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(f"weights must be a floating tensor (..., N, M), got {shape}")
    w = weights.detach().to(torch.float64)
    bad = ~torch.isfinite(w)
    if bad.any():
        raise AttentionCheckError(f"weights hold NaN/Inf at {_positions(bad)}")
    if (w < -atol).any():
        raise AttentionCheckError(f"weights are negative at {_positions(w < -atol)} (min {w.min().item():.3g})")
    allowed = _allowed(mask, w.shape, w.device)
    row_any = torch.ones(w.shape[:-1], dtype=torch.bool, device=w.device) if allowed is None else allowed.any(-1)
    masked_max = 0.0
    if allowed is not None:
        leak = (w.abs() > atol) & ~allowed
        if leak.any():
            raise AttentionCheckError(
                f"nonzero weight on disallowed keys at (..., query, key) {_positions(leak)} "
                f"(max {w.masked_fill(allowed, 0.0).abs().max().item():.3g}, atol {atol:g})"
            )
        masked_max = float(w.masked_fill(allowed, 0.0).abs().max()) if w.numel() else 0.0
    err = (w.sum(-1) - row_any.to(w.dtype)).abs()  # (..., N)
    off = err > atol
    if off.any():
        which = "1 (0 where no key is allowed)" if allowed is not None else "1"
        raise AttentionCheckError(
            f"rows do not sum to {which} at (..., query) {_positions(off)} (max error {err.max().item():.3g}, atol {atol:g})"
        )
    return AttentionReport(
        rows=int(err.numel()),
        empty_rows=int((~row_any).sum()),
        max_row_sum_error=float(err.max()) if err.numel() else 0.0,
        max_masked_weight=masked_max,
        min_weight=float(w.min()) if w.numel() else 0.0,
    )


def leak_test(
    attn_fn: Callable[[Tensor, Tensor, Tensor, Mask | Tensor | None], Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor,
    trials: int = 3,
    atol: float | None = None,
    queries: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
) -> float:
    """Perturb what each query may not see; its output must not move.

    For every distinct pattern of hidden keys (keys that no query head sharing a
    key/value head may see at that query row), the keys and values at the hidden
    positions are replaced by large random values and ``attn_fn`` is run again; the
    outputs of the query rows with that pattern must stay within ``atol``.

    Args:
        attn_fn: any attention ``(q, k, v, mask) -> out (B, H, N, Dv)``; it receives
            ``mask`` exactly as given here.
        q: ``(B, H, N, D)``; k: ``(B, Hkv, M, D)``; v: ``(B, Hkv, M, Dv)``.
        mask: where attention is allowed (a Mask or a bool tensor broadcastable to
            ``(B, H, N, M)``).
        trials: independent random perturbations per pattern.
        atol: largest allowed change of a guarded output (default 1e-5 for float32,
            1e-10 for float64, 1e-2 otherwise).
        queries: restrict the test to these query rows (default all).
        generator: source of the perturbations (default: a fixed seed).

    Returns:
        The largest change observed on a guarded output (0.0 when nothing was hidden).

    Raises:
        AttentionCheckError: naming the ``(batch, head, query)`` positions that moved.
        ValueError: on inputs whose shapes do not fit together.
    """
    check_qkv(q, k, v, who="leak_test")
    B, H, N, _ = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if atol is None:
        atol = _LEAK_ATOL.get(q.dtype, 1e-2)
    gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(0)
    allowed = _allowed(mask, torch.Size((B, H, N, M)), q.device)  # (B, H, N, M)
    hidden = ~allowed.view(B, Hkv, H // Hkv, N, M).any(2)  # (B, Hkv, N, M): hidden from the whole group
    rows = torch.arange(N) if queries is None else torch.as_tensor(list(queries), dtype=torch.long)
    if rows.numel() and (rows.min() < 0 or rows.max() >= N):
        raise ValueError(f"queries must lie in [0, {N}), got {rows.tolist()}")
    patterns = hidden[:, :, rows].permute(2, 0, 1, 3).reshape(rows.numel(), -1)  # (rows, B*Hkv*M)
    uniq, inverse = torch.unique(patterns.cpu(), dim=0, return_inverse=True)

    with torch.no_grad():
        base = attn_fn(q, k, v, mask)  # (B, H, N, Dv)
        kscale = 4.0 * (1.0 + float(k.detach().abs().max()))
        vscale = 4.0 * (1.0 + float(v.detach().abs().max()))
        worst = 0.0
        leaked: list[tuple[int, int, int]] = []
        for p in range(uniq.shape[0]):
            sel = uniq[p].view(B, Hkv, M).to(q.device)  # (B, Hkv, M) keys to perturb
            if not sel.any():
                continue
            guard = rows[inverse == p].to(q.device)  # query rows with this pattern
            for _ in range(trials):
                nk = torch.randn(k.shape, generator=gen, dtype=torch.float32).to(k.device, k.dtype) * kscale
                nv = torch.randn(v.shape, generator=gen, dtype=torch.float32).to(v.device, v.dtype) * vscale
                k2 = torch.where(sel.unsqueeze(-1), nk, k)  # (B, Hkv, M, D)
                v2 = torch.where(sel.unsqueeze(-1), nv, v)  # (B, Hkv, M, Dv)
                out = attn_fn(q, k2, v2, mask)  # (B, H, N, Dv)
                diff = (out[:, :, guard].float() - base[:, :, guard].float()).abs()  # (B, H, rows, Dv)
                diff = diff.nan_to_num(nan=float("inf")).amax(-1)  # (B, H, rows)
                worst = max(worst, float(diff.max()))
                for b, h, r in (diff > atol).nonzero().tolist():
                    leaked.append((b, h, int(guard[r])))
    if leaked:
        uniq_leaks = sorted(set(leaked))
        shown = ", ".join(map(str, uniq_leaks[:_SHOW]))
        more = f" and {len(uniq_leaks) - _SHOW} more" if len(uniq_leaks) > _SHOW else ""
        raise AttentionCheckError(
            f"mask leak: outputs at (batch, head, query) {shown}{more} moved by up to {worst:.3g} "
            f"(atol {atol:g}) when keys/values they may not see were perturbed"
        )
    return worst
