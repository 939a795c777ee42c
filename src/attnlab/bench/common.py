"""Pieces shared by the suites: where the data is, inputs, the float64 oracle, operations per mode, masks.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys, ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import masks
from .measure import measure_op, torch_dtype

#: the mask kinds of the kernels suite
MASK_KINDS = ("none", "causal", "sliding_window", "padding")
#: the window of the ``sliding_window`` kind (keys at most this far to the left)
WINDOW = 256
#: rows of the output checked against the float64 oracle at large N
ORACLE_ROWS = 128
#: largest N at which the NumPy ``reference`` backend is the oracle on every row
REFERENCE_MAX_N = 1024
MODES = ("fwd", "fwd_bwd")


def make_mask(kind: str, n: int, batch: int) -> masks.Mask | None:
    """The mask of kind ``kind`` for ``n`` positions.

    ``padding`` keeps the first three quarters of the keys of every sequence (a little
    fewer for each further batch element).
    """
    if kind == "none":
        return None
    if kind == "causal":
        return masks.causal()
    if kind == "sliding_window":
        return masks.sliding_window(WINDOW, 0)
    if kind == "padding":
        return masks.padding([max(1, n - (b + 1) * n // (4 * batch)) for b in range(batch)])
    raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {kind!r}")


def allowed_pairs(mask: masks.Mask | None, batch: int, n: int, m: int) -> int:
    """Number of allowed (query, key) pairs summed over the batch (per head)."""
    if mask is None:
        return batch * n * m
    total = 0
    rows = max(1, (1 << 24) // max(1, m * batch))
    b = torch.arange(batch).view(-1, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    k = torch.arange(m).view(1, 1, 1, -1)
    for q0 in range(0, n, rows):
        q = torch.arange(q0, min(n, q0 + rows)).view(1, 1, -1, 1)
        total += int(mask.allows(b, h, q, k, n, m).expand(batch, 1, q.shape[2], m).sum())
    return total


def make_inputs(spec: dict, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded random ``q, k, v`` of shape ``(B, H, N, D)`` in the spec's dtype and device."""
    g = torch.Generator().manual_seed(seed)
    B, H, N, D = spec["B"], spec["H"], spec["N"], spec["D"]
    dt = torch_dtype(spec["dtype"])
    return tuple(torch.randn(B, H, N, D, generator=g).to(spec["device"], dt) for _ in range(3))  # type: ignore[return-value]


def oracle_rows(q: Tensor, k: Tensor, v: Tensor, mask: masks.Mask | None, rows: Tensor) -> Tensor:
    """Exact attention in float64 for the query ``rows`` only: ``(B, H, len(rows), D)``.

    Fully masked rows give zeros, as in :func:`attnlab.attention`.
    """
    B, H, N, D = q.shape
    M = k.shape[2]
    qs = q.detach()[:, :, rows.to(q.device)].double().cpu()  # (B, H, R, D)
    kd, vd = k.detach().double().cpu(), v.detach().double().cpu()  # (B, H, M, D)
    s = qs @ kd.transpose(-1, -2) / D**0.5  # (B, H, R, M)
    if mask is not None:
        allowed = mask.to("cpu").allows(
            torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1), rows.view(1, 1, -1, 1),
            torch.arange(M).view(1, 1, 1, -1), N, M,
        )  # (B|1, H|1, R, M)
        s = s.masked_fill(~allowed, float("-inf"))
    row_any = torch.isfinite(s).any(-1, keepdim=True)  # (B, H, R, 1)
    w = torch.softmax(s.masked_fill(~row_any, 0.0), dim=-1) * row_any  # (B, H, R, M)
    return w @ vd  # (B, H, R, D)


def check_rows(n: int) -> Tensor:
    """Indices of the rows checked against the oracle: spread out, first and last included."""
    if n <= ORACLE_ROWS:
        return torch.arange(n)
    return torch.linspace(0, n - 1, ORACLE_ROWS).round().long().unique()


def max_rel_error(out: Tensor, ref: Tensor) -> float:
    """``max |out - ref| / max |ref|`` (0 when both are zero)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    scale = float(ref.abs().max())
    err = float((out - ref).abs().max())
    return err / scale if scale > 0 else err


def fro_rel_error(out: Tensor, ref: Tensor) -> float:
    """``||out - ref||_F / ||ref||_F`` (0 when both are zero)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    scale = float(ref.norm())
    err = float((out - ref).norm())
    return err / scale if scale > 0 else err


def mode_op(
    fn: Callable[[Tensor, Tensor, Tensor], Tensor], q: Tensor, k: Tensor, v: Tensor, mode: str,
    params: list[Tensor] | None = None,
) -> Callable[[], None]:
    """The operation timed for ``mode``: the forward under ``no_grad`` (``fwd``), or
    forward then backward of a fixed random output gradient (``fwd_bwd``)."""
    if mode == "fwd":

        def op() -> None:
            with torch.no_grad():
                fn(q, k, v)

        return op
    if mode != "fwd_bwd":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    leaves = [t.requires_grad_(True) for t in (q, k, v)] + list(params or [])
    with torch.no_grad():
        g = torch.randn_like(fn(q, k, v))

    def op() -> None:
        out = fn(q, k, v)
        out.backward(g)
        for t in leaves:
            t.grad = None

    return op


def measure_mode(op: Callable[[], None], spec: dict) -> dict:
    """:func:`measure_op` with the spec's device, repeats and time budget."""
    return measure_op(op, spec["device"], spec.get("repeats", 3), spec.get("budget_s", 1.0))
