"""The oracle's contract: every backend that ``explain`` says serves a call returns the float64 answer.

Random shapes, masks and their combinations, drawn once with a fixed seed and run in one
process, so a backend that compiles per shape (``flex``) meets several shapes in a row, as a
user's program does. Forward only (the conformance grid covers gradients per backend).
"""

from __future__ import annotations

import pytest
import torch

from attnlab import masks
from attnlab.exact import attention, explain
from helpers import make_mask, reference, tol

_KINDS = ("none", "causal", "window", "padding", "global", "document", "prefix_lm", "key_mask", "random")


def _draws(count: int, seed: int = 11) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        B, H = int(torch.randint(1, 3, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        N = int(torch.randint(16, 90, (1,), generator=g))
        M = N if torch.rand(1, generator=g) < 0.5 else int(torch.randint(N, 120, (1,), generator=g))
        D = int(torch.tensor([16, 24, 40])[torch.randint(0, 3, (1,), generator=g)])
        kind = _KINDS[int(torch.randint(0, len(_KINDS), (1,), generator=g))]
        combine = kind in ("padding", "key_mask", "window") and bool(torch.rand(1, generator=g) < 0.5)
        out.append((B, H, N, M, D, kind, combine, int(torch.randint(0, 2**31, (1,), generator=g))))
    return out


def _params():
    """Six draws: the first three in the default run, the rest with ``-m slow`` (``flex`` compiles each shape)."""
    for i, d in enumerate(_draws(6)):
        yield pytest.param(d, marks=[pytest.mark.slow] if i >= 3 else [])


@pytest.mark.parametrize("draw", list(_params()), ids=lambda d: f"B{d[0]}H{d[1]}N{d[2]}M{d[3]}D{d[4]}-{d[5]}{'&causal' * d[6]}")
def test_every_backend_explain_accepts_is_right(draw):
    B, H, N, M, D, kind, combine, seed = draw
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (N, M, M))
    mask = make_mask(kind, B, H, N, M, g)
    if combine:
        mask = masks.as_mask(mask) & masks.causal()
    want = reference(q, k, v, mask=mask)
    served = [v_.backend for v_ in explain(q, k, v, mask=mask) if v_.serves]
    assert "math" in served and "chunked" in served
    for name in served:
        got = attention(q, k, v, mask=mask, backend=name)
        torch.testing.assert_close(got.double(), want, **tol(torch.float32), msg=lambda m, name=name: f"{name}: {m}")
