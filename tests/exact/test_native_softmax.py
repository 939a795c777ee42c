"""The native kernel's softmax loops (``row_max``, ``row_min``, ``exp_span`` in ``native_attn.cpp``) on
the raw op against the float64 formula.

Every span length from 1 to a whole tile at every offset (the vector loops' tails: 16 lanes in the
AVX-512 build, 8 in the AVX2 one), with the scale positive (the row maximum) and negative (the
minimum), with and without a dense mask (masked lanes inside a span); NaN and +inf scores (NaN rows
as in the formula; +inf times a negative scale is -inf, masked); rows whose maximum is far below 0
and whose other scores are far below it (2^x under -126 is exactly 0); and a NaN row's masked keys,
which stay out of dk and dv exactly.
The build this process loads is the one ``ATTNLAB_NATIVE_ISA`` asks for: the slow test in
``test_native.py`` runs this file again under ``ATTNLAB_NATIVE_ISA=avx2``.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.exact import native_build
from helpers import tol

pytestmark = pytest.mark.skipif(
    native_build.brgemm_signature() is not None or native_build._compiler() is None,
    reason="no C++ compiler or no float32 brgemm in this torch: the kernel cannot be built here",
)

BLOCK = 64  # the kernel's tile (query rows x keys) in these calls


def _ops():
    assert native_build.status() is None, native_build.status()
    return native_build.library()


def _formula(q, k, v, allowed, bias, scale):
    """float64 ``out (B, H, N, Dv)`` and ``lse (B, H, N)``; ``allowed`` and ``bias`` (B, H, N, M)."""
    s = (q @ k.transpose(-1, -2)) * scale + bias
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None]) @ v, lse


def _call(q, k, v, lo, hi, dense, bias, scale, do):
    """The raw op's ``out, lse, dq, dk, dv``."""
    ops = _ops()
    out, lse = ops.forward(q, k, v, lo, hi, None, None, dense, bias, None, scale, BLOCK, BLOCK)
    dq, dk, dv, _ = ops.backward(
        do, q, k, v, out, lse, lo, hi, None, None, dense, bias, None, False, scale, BLOCK, BLOCK
    )
    return out, lse, dq, dk, dv


def _spans(N: int, M: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i sees keys [lo, lo + 1 + i % 64): every length 1..64 at offsets 0..63 (mod 16 all met), some spans
    across the tile boundary."""
    i = torch.arange(N)
    lo = (i * 7) % BLOCK
    hi = (lo + 1 + i % BLOCK).clamp(max=M)
    return lo.int().view(1, N), hi.int().view(1, N)


def test_the_softmax_path_is_the_one_this_build_asks_for():
    info = _ops().info()
    flags = native_build._cpu_flags().split()
    if native_build.vec_capability():
        assert "softmax avx2 (at::vec)" in info, info
    elif native_build.isa_request() == "native" and "avx512f" in flags:
        assert "softmax avx512" in info, info
    else:
        assert "softmax default (at::vec)" in info, info


@pytest.mark.parametrize("data", ["randn", "nan_inf", "spread"])
@pytest.mark.parametrize("scale", [0.37, -0.37])
@pytest.mark.parametrize("dense", [False, True])
def test_every_span_length_and_offset_equals_the_formula(data, scale, dense):
    B, H, N, M, D = 1, 2, 256, 2 * BLOCK, 32
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (N, M, M))
    if data == "nan_inf":
        k[0, 0, 37, 5] = float("nan")  # the rows of head 0 that see key 37 are NaN
        q[0, 1, :, 0] = q[0, 1, :, 0].abs() + 0.1
        k[0, 1, 70, 0] = float("inf")  # head 1's rows that see key 70: +inf (NaN rows), or -inf (masked) if scale < 0
    lo, hi = _spans(N, M)
    if data == "spread":  # row i's key j scores -(30 (j - lo_i) + 400) after the scale's sign: a row maximum far
        # below 0 (a maximum taken as 0, as a tail's zero lanes would give, underflows every p), most lanes under 2^-126
        sign = 1.0 if scale > 0 else -1.0
        q[..., 0], q[..., 1], q[..., 2] = 1.0, 30.0 * sign * lo.view(N).float(), -400.0 * sign
        k[..., 0], k[..., 1:3] = -30.0 * sign * torch.arange(M).float(), 1.0
        k[..., 3:] *= 0.01  # the rest of the score is small, so float32's rounding of it stays within tolerance
    keys = torch.arange(M)
    allowed = ((keys >= lo.view(N, 1)) & (keys < hi.view(N, 1))).expand(B, H, N, M)
    mask = None
    if dense:
        keep = torch.rand(B, H, N, M, generator=g) > 0.3
        allowed = allowed & keep
        mask = keep.view(torch.uint8)
    do = torch.randn(B, H, N, D, generator=g)
    out, lse, *grads = _call(q, k, v, lo, hi, mask, None, scale, do)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want_o, want_l = _formula(q64, k64, v64, allowed, torch.zeros(()), scale)
    if data == "nan_inf":  # the case has NaN rows in head 0, and in head 1 only when +inf is not masked
        assert bool(torch.isnan(want_o[0, 0]).any()) and bool(torch.isnan(want_o[0, 1]).any()) == (scale > 0)
    torch.testing.assert_close(out.double(), want_o, equal_nan=True, **tol(torch.float32))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_l))
    real = ~torch.isnan(want_o).any(-1)  # lse of the rows the formula gives an output (a +inf row's is not said)
    torch.testing.assert_close(lse.double()[real], want_l[real], **tol(torch.float32))
    if data == "spread":  # the backward's p = 2^(s - lse) carries float32's rounding of lse (about -150) into
        return  # every gradient beyond the tolerance: the forward (the same exponent pass) is this case's check
    want_g = torch.autograd.grad(want_o, (q64, k64, v64), do.double())
    # a +inf score's row has lse NaN in the kernel (+inf in the formula): its backward gives NaN to every key the
    # row sees, where the formula's gives 0 to the finite ones; so head 1's gradients count only when it is masked
    heads = slice(0, 1) if data == "nan_inf" and scale > 0 else slice(0, H)
    for got, want in zip(grads, want_g):  # every finite gradient of the formula's is the kernel's
        got, want = got[:, heads], want[:, heads]
        fin = torch.isfinite(want)
        assert not torch.isnan(got[fin]).any()
        torch.testing.assert_close(got.double()[fin], want[fin], **tol(torch.float32, loose=True))


def test_a_nan_rows_masked_keys_stay_out_of_dk_and_dv():
    """Row r's bias is NaN at one key it sees (in a tile's tail lanes): its out and lse are NaN, and the keys
    its dense mask hides get exactly nothing from it (2^(-inf - NaN) is 0), so their dk and dv are the
    formula's over the other rows."""
    B, H, N, M, D, r = 1, 2, 70, 77, 24, 9
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (N, M, M))
    keep = torch.rand(B, H, N, M, generator=g) > 0.3
    keep[0, 0, r, 75] = True
    bias = torch.randn(B, H, N, M, generator=g)
    bias[0, 0, r, 75] = float("nan")  # key 75: column 11 of the second tile, past its first 8 lanes
    do = torch.randn(B, H, N, D, generator=g)
    out, lse, dq, dk, dv = _call(q, k, v, None, None, keep.view(torch.uint8), bias, 0.37, do)
    assert bool(torch.isnan(out[0, 0, r]).all()) and bool(torch.isnan(lse[0, 0, r]))
    rows = torch.arange(N) != r  # the formula without row r of head 0
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    o0, _ = _formula(q64[:, :1, rows], k64[:, :1], v64[:, :1], keep[:, :1, rows], bias[:, :1, rows].double(), 0.37)
    want_dq, want_dk, want_dv = torch.autograd.grad(o0, (q64, k64, v64), do[:, :1, rows].double())
    torch.testing.assert_close(out[0, 0, rows].double(), o0[0, 0], **tol(torch.float32))
    hidden = ~keep[0, 0, r]  # (M,): the keys row r may not see
    assert int(hidden.sum()) > 5
    torch.testing.assert_close(dk[0, 0, hidden].double(), want_dk[0, 0, hidden], **tol(torch.float32, loose=True))
    torch.testing.assert_close(dv[0, 0, hidden].double(), want_dv[0, 0, hidden], **tol(torch.float32, loose=True))
    assert bool(torch.isnan(dv[0, 0, ~hidden]).all(-1).all())  # the keys it sees get its NaN
    torch.testing.assert_close(dq[0, 0, rows].double(), want_dq[0, 0, rows], **tol(torch.float32, loose=True))
    o1, _ = _formula(q64[:, 1:], k64[:, 1:], v64[:, 1:], keep[:, 1:], bias[:, 1:].double(), 0.37)
    torch.testing.assert_close(out[:, 1:].double(), o1, **tol(torch.float32))  # the other head is untouched
