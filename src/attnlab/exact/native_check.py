"""The native kernel's first-use check: its raw op against the float64 formula, forward and gradients.

Two small calls at the kernel's block sizes, so every code path of the loops runs: one
with every mask input at once (per-row intervals with empty rows, a tile table with FULL,
EMPTY and bit tiles, a dense mask, a bias), grouped-query heads, a value head dim unlike
the query's, N and M not multiples of the tiles; and one causal-shaped call (rows whose
intervals end on the diagonal, the case the kernel splits into row runs) with a relative
bias table and its gradient and a single key/value head (its keys split in chunks); and a decoding
call (3 queries, 150 keys: the few-queries path). Any difference
above 1e-4 (the fused op's check uses the same bound) is the reason the kernel is not used.

:func:`self_check_bf16` runs the same calls in bfloat16 (inputs rounded to bfloat16, the formula in
float64 on the rounded inputs) with a bound of 2% of each output's largest magnitude (at least 1):
the kernel's error there is about 0.5% (P and dS are rounded to bfloat16 for their products,
out and the gradients on output), plain bfloat16 PyTorch's about 2%.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .native_layout import BLOCK_K, BLOCK_Q

__all__ = ["self_check", "self_check_bf16"]


def _formula(q, k, v, allowed, bias, scale):
    """float64 ``(out, lse)`` by the formula; ``allowed (B, H, N, M)``; grouped heads by repetition."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale + bias
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])
    return p @ v, lse


def _bits_allowed(tiles: Tensor, bits: Tensor, B: int, H: int, N: int, M: int) -> Tensor:
    """The ``(B, H, N, M)`` bool mask a tile table and its bit tiles say."""
    nqb, nkb = tiles.shape[2], tiles.shape[3]
    unpacked = ((bits.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).bool()  # (P, BQ, BK/8, 8)
    unpacked = unpacked.reshape(bits.shape[0], BLOCK_Q, BLOCK_K)
    out = torch.zeros(B, H, nqb * BLOCK_Q, nkb * BLOCK_K, dtype=torch.bool)
    t = tiles.expand(B, H, nqb, nkb)
    for b in range(B):
        for h in range(H):
            for i in range(nqb):
                for j in range(nkb):
                    x = int(t[b, h, i, j])
                    tile = out[b, h, i * BLOCK_Q:(i + 1) * BLOCK_Q, j * BLOCK_K:(j + 1) * BLOCK_K]
                    tile[:] = True if x == -1 else (False if x == -2 else unpacked[x])
    return out[:, :, :N, :M]


def _case_masked(g: torch.Generator):
    B, H, Hkv, N, M, D, Dv = 2, 4, 2, 70, 150, 24, 16
    q, k, v = torch.randn(B, H, N, D, generator=g), torch.randn(B, Hkv, M, D, generator=g), \
        torch.randn(B, Hkv, M, Dv, generator=g)
    lo = torch.randint(-5, 60, (B, N), generator=g, dtype=torch.int32)
    hi = lo + torch.randint(-3, 120, (B, N), generator=g, dtype=torch.int32)  # some rows empty, some past M
    nqb, nkb = -(-N // BLOCK_Q), -(-M // BLOCK_K)
    tiles = torch.randint(-2, 3, (B, 1, nqb, nkb), generator=g, dtype=torch.int32)
    bits = torch.randint(0, 256, (3, BLOCK_Q, BLOCK_K // 8), generator=g, dtype=torch.uint8)
    dense = torch.rand(B, 1, N, M, generator=g) > 0.2
    bias = torch.randn(1, H, N, M, generator=g)
    keys = torch.arange(M)
    allowed = (keys >= lo[..., None].clamp(0, M)) & (keys < hi[..., None].clamp(0, M))  # (B, N, M)
    allowed = allowed[:, None] & dense & _bits_allowed(tiles, bits, B, H, N, M)
    args = dict(lo=lo, hi=hi, tiles=tiles, bits=bits, dense=dense.expand(B, H, N, M).view(torch.uint8),
                bias=bias.expand(B, H, N, M))
    return (q, k, v), args, allowed, bias


def _diagonal_sums(grad: Tensor, heads: int) -> Tensor:
    """``(heads, N + M - 1)``: a ``(B, H, N, M)`` bias gradient summed along each relative position."""
    B, H, N, M = grad.shape
    idx = (torch.arange(M).view(1, -1) - torch.arange(N).view(-1, 1) + N - 1).expand(B, H, N, M)
    out = torch.zeros(B, H, N + M - 1, dtype=grad.dtype).scatter_add_(2, idx.reshape(B, H, -1),
                                                                      grad.reshape(B, H, -1))
    out = out.sum(0)  # (H, N + M - 1)
    return out.sum(0, keepdim=True) if heads == 1 else out


def _case_causal(g: torch.Generator):
    """Causal rows (the diagonal's row runs), a relative bias per head, and one key/value head."""
    B, H, N, D = 2, 2, 130, 8
    q, k, v = torch.randn(B, H, N, D, generator=g), torch.randn(B, 1, N, D, generator=g), \
        torch.randn(B, 1, N, D, generator=g)
    hi = torch.arange(1, N + 1, dtype=torch.int32).view(1, N)
    allowed = torch.ones(N, N, dtype=torch.bool).tril().expand(B, H, N, N)
    rel = torch.randn(H, 2 * N - 1, generator=g)
    idx = torch.arange(N).view(1, -1) - torch.arange(N).view(-1, 1) + N - 1  # (N, M): rel index of each pair
    bias = rel[:, idx].unsqueeze(0)  # (1, H, N, N)
    return (q, k, v), dict(lo=torch.zeros_like(hi), hi=hi, rel=rel), allowed, bias


def _case_decode(g: torch.Generator):
    """A few queries against many keys (decoding with a KV cache: the kernel's K Q^T path), a key interval
    per row and a bias, grouped heads."""
    B, H, Hkv, N, M, D = 1, 4, 2, 3, 150, 16
    q, k, v = torch.randn(B, H, N, D, generator=g), torch.randn(B, Hkv, M, D, generator=g), \
        torch.randn(B, Hkv, M, D, generator=g)
    hi = torch.arange(M - N + 1, M + 1, dtype=torch.int32).view(1, N)  # causal, bottom-right
    lo = torch.tensor([[0, 40, 149]], dtype=torch.int32)
    keys = torch.arange(M)
    allowed = ((keys >= lo[..., None]) & (keys < hi[..., None]))[:, None].expand(B, H, N, M)
    bias = torch.randn(1, H, N, M, generator=g)
    return (q, k, v), dict(lo=lo, hi=hi, bias=bias.expand(B, H, N, M)), allowed, bias


def _compare(ops, qkv, args, allowed, bias, scale: float, g: torch.Generator,
             dtype: torch.dtype = torch.float32) -> str | None:
    qkv = tuple(x.to(dtype) for x in qkv)
    q, k, v = qkv
    empty = dict(lo=None, hi=None, tiles=None, bits=None, dense=None, bias=None)
    a = {**empty, **{n: x for n, x in args.items() if n != "rel"}}
    order = ("lo", "hi", "tiles", "bits", "dense", "bias")
    rel = args.get("rel")
    out, lse = ops.forward(q, k, v, *(a[n] for n in order), rel, scale, BLOCK_Q, BLOCK_K)
    do = torch.randn(out.shape, generator=g).to(dtype)
    dq, dk, dv, drel = ops.backward(do, q, k, v, out, lse, *(a[n] for n in order), rel, rel is not None, scale,
                                    BLOCK_Q, BLOCK_K)
    q64, k64, v64 = (x.double().requires_grad_() for x in qkv)
    b64 = bias.double().requires_grad_()
    o64, l64 = _formula(q64, k64, v64, allowed, b64, scale)
    g64 = torch.autograd.grad(o64, (q64, k64, v64, b64), do.double())
    checks = [("out", out, o64), ("lse", lse, l64), ("dq", dq, g64[0]), ("dk", dk, g64[1]), ("dv", dv, g64[2])]
    if rel is not None:  # the bias came from the table: its gradient is the sum over each diagonal
        checks.append(("rel's gradient", drel, _diagonal_sums(torch.nan_to_num(g64[3]), rel.shape[0])))
    kind = "" if dtype == torch.float32 else f" in {str(dtype).removeprefix('torch.')}"
    for what, got, want in checks:
        want = want.detach()
        fin = torch.isfinite(want)
        if not torch.equal(torch.isfinite(got), fin):
            return f"the native kernel's {what}{kind} differs from the formula on rows that see no key"
        seen = bool(fin.any())
        err = float((got.double()[fin] - want[fin]).abs().max()) if seen else 0.0
        bound = 1e-4 if dtype == torch.float32 else 2e-2 * max(1.0, float(want[fin].abs().max()) if seen else 0.0)
        if not err <= bound:
            return f"the native kernel's {what}{kind} differs from the formula by {err:.2e}"
    return None


def self_check(ops, dtype: torch.dtype = torch.float32) -> str | None:
    """None when the loaded kernel ``ops`` equals the float64 formula on the check's calls, else why not."""
    g = torch.Generator().manual_seed(0)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            for case in (_case_masked, _case_causal, _case_decode):
                qkv, args, allowed, bias = case(g)
                why = _compare(ops, qkv, args, allowed, bias, 0.37, g, dtype)
                if why is not None:
                    return why
    except RuntimeError as e:
        return f"the native kernel failed its {'' if dtype == torch.float32 else 'bfloat16 '}check: " \
               f"{str(e).splitlines()[0][:160]}"
    return None


def self_check_bf16(ops) -> str | None:
    """:func:`self_check` of the kernel's bfloat16 path, at bfloat16 tolerance (see the module docstring)."""
    return self_check(ops, torch.bfloat16)
