"""attnlab.exact.native in bfloat16: bf16 products with float32 accumulation, where the CPU has avx512_bf16.

Forward and gradients against float64 autograd on the same bf16-rounded inputs, judged against
plain bfloat16 PyTorch's error (the textbook formula in bf16, :func:`helpers.naive_attention`):
at most twice it. Masks as intervals (causal, sliding window), bit tiles (window | global
tokens), a dense mask, a bias tensor, a relative bias (ALiBi), grouped-query heads, an odd head
dim, lengths that are not multiples of the 64-wide tiles, a few queries (the decoding path).
Where the CPU lacks avx512_bf16 those tests skip, and the fallback test (which runs everywhere)
checks that ``explain`` gives the reason and the call still computes the right function.
"""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.exact import explain, make_call, native, native_build
from helpers import assert_low_precision_error, naive_attention, rand_qkv

buildable = native_build.brgemm_signature() is None and native_build._compiler() is not None
pytestmark = pytest.mark.skipif(not buildable, reason="no C++ compiler or no brgemm in this torch: no native kernel")
needs_bf16 = pytest.mark.skipif(
    not native_build.cpu_has_bf16() or native_build.isa_request() == "avx2",
    reason="this CPU has no avx512_bf16, or the kernel is built without it (ATTNLAB_NATIVE_ISA=avx2): "
    "it serves no bfloat16 call here",
)

#: (B, H, Hkv, N, M, D, Dv): tails on both lengths, grouped heads, an odd head dim, value dim unlike the query's
SHAPES = {
    "tails": (2, 4, 2, 97, 130, 64, 64),
    "odd_dim": (1, 3, 3, 70, 70, 59, 40),
    "square": (1, 2, 1, 200, 200, 32, 32),
    "few_queries": (2, 4, 2, 3, 150, 16, 16),
}


def _mask(kind: str, N: int, M: int):
    return {
        "none": None,
        "causal": masks.causal(),
        "window": masks.sliding_window(40),
        "bit_tiles": masks.sliding_window(20) | masks.global_tokens([0, 5]),  # not an interval: bit tiles
        "dense": masks.dense(torch.rand(N, M, generator=torch.Generator().manual_seed(N + M)) > 0.3),
    }[kind]


def _allowed(mask, B: int, N: int, M: int):
    return None if mask is None else mask.dense(N, M, batch=B)


def _check(q64, k64, v64, mask, bias=None, bias64=None, plain_bias=None):
    """The kernel's out and gradients against float64 autograd, within twice plain bf16 torch's error."""
    B, N, M = q64.shape[0], q64.shape[2], k64.shape[2]
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in (q64, k64, v64))
    assert native.call_reason(make_call(q, k, v, mask=mask, bias=bias)) is None
    out = attnlab.attention(q, k, v, mask=mask, bias=bias, backend="native")
    assert out.dtype == torch.bfloat16 and out.shape == (B, q.shape[1], N, v.shape[3])
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    got = torch.autograd.grad((out.double() * w).sum(), (q, k, v))
    assert all(g.dtype == torch.bfloat16 for g in got)
    qr, kr, vr = (t.detach().to(torch.bfloat16).double().requires_grad_() for t in (q64, k64, v64))
    ref = attnlab.attention(qr, kr, vr, mask=mask, bias=bias64, backend="math")  # float64 on the rounded inputs
    want = torch.autograd.grad((ref * w).sum(), (qr, kr, vr))
    ql, kl, vl = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q64, k64, v64))
    allowed = _allowed(mask, B, N, M)
    if plain_bias is None:
        plain_out = naive_attention(ql, kl, vl, allowed)
    else:  # the textbook formula with the bias added to the scores, in bf16
        s = (ql @ kl.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) * q.shape[3] ** -0.5
        s = s + plain_bias.to(torch.bfloat16)
        s = s if allowed is None else s.masked_fill(~allowed, float("-inf"))
        plain_out = torch.softmax(s, -1) @ vl.repeat_interleave(q.shape[1] // k.shape[1], 1)
    assert_low_precision_error(out.detach(), plain_out.detach(), ref.detach())
    plain = torch.autograd.grad((torch.nan_to_num(plain_out.double(), nan=0.0) * w).sum(), (ql, kl, vl))
    for g, p, r in zip(got, plain, want):
        assert_low_precision_error(g, p, r)


@needs_bf16
def test_bfloat16_is_served_here():
    assert native_build.bf16_status() is None, native_build.bf16_status()
    assert "bf16 avx512_bf16" in native_build.library().info()
    q, k, v = rand_qkv(1, 8, 4096, 64, dtype=torch.bfloat16)
    verdicts = {x.backend: x for x in explain(q, k, v, mask=masks.causal())}
    assert verdicts["native"].serves
    assert verdicts["chunked"].note.startswith("native kernel")


@needs_bf16
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["none", "causal", "window", "bit_tiles", "dense"])
def test_bfloat16_forward_and_gradients_within_twice_plain_torch(kind, shape):
    B, H, Hkv, N, M, D, Dv = SHAPES[shape]
    q64, k64, v64 = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, Dv=Dv, seed=N + 3 * M + D)
    mask = _mask(kind, N, M)
    if kind == "bit_tiles":
        assert native.kernel_mask(mask, N, M).tiles is not None  # the case reaches the kernel as bit tiles
    _check(q64, k64, v64, mask)


@needs_bf16
@pytest.mark.parametrize("kind", ["none", "causal"])
def test_bfloat16_with_a_bias_tensor(kind):
    B, H, N, M, D = 2, 4, 97, 130, 64
    q64, k64, v64 = rand_qkv(B, H, N, D, M=M, Hkv=2, seed=21)
    bias = torch.randn(1, H, N, M, generator=torch.Generator().manual_seed(22))  # float32, read in place
    _check(q64, k64, v64, _mask(kind, N, M), bias=bias, bias64=bias.double(), plain_bias=bias)


@needs_bf16
def test_bfloat16_with_a_relative_bias():
    """ALiBi declares itself relative: its table is read along the tiles' diagonals in bf16 too."""
    from attnlab.positional import ALiBi

    B, H, N, M, D = 1, 4, 150, 150, 32
    alibi = ALiBi(H)
    q64, k64, v64 = rand_qkv(B, H, N, D, M=M, seed=5)
    fn = alibi.bias_fn(N, M)
    dense = native.rel_bias(native.relative_table(make_call(q64.float(), k64.float(), v64.float(), bias=fn)), N, M)
    _check(q64, k64, v64, masks.causal(), bias=fn, bias64=fn, plain_bias=dense.detach())


@needs_bf16
def test_bfloat16_one_and_two_threads_agree_bit_for_bit():
    q, k, v = rand_qkv(1, 2, 300, 64, M=300, Hkv=1, dtype=torch.bfloat16, seed=3, requires_grad=True)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = attnlab.attention(q, k, v, mask=masks.causal(), backend="native")
            results.append((out, *torch.autograd.grad(out.float().square().sum(), (q, k, v))))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_without_avx512_bf16_bfloat16_falls_back_and_says_why(monkeypatch):
    assert native.status() is None, native.status()
    monkeypatch.setattr(native_build, "cpu_has_bf16", lambda: False)
    q64, k64, v64 = rand_qkv(1, 4, 97, 32, M=97, Hkv=2, seed=8)
    q, k, v = (t.to(torch.bfloat16) for t in (q64, k64, v64))
    why = native.call_reason(make_call(q, k, v, mask=masks.causal()))
    assert why is not None and "needs a CPU with avx512_bf16" in why
    verdicts = {x.backend: x for x in explain(q, k, v, mask=masks.causal())}
    assert "avx512_bf16" in verdicts["native"].reason
    assert not verdicts["chunked"].note.startswith("native kernel")
    assert native.call_reason(make_call(q.float(), k.float(), v.float())) is None  # float32 is unaffected
    out = attnlab.attention(q, k, v, mask=masks.causal(), backend="auto")
    ref = attnlab.attention(*(t.double() for t in (q, k, v)), mask=masks.causal(), backend="reference")
    plain = naive_attention(q, k, v, _allowed(masks.causal(), 1, 97, 97))
    assert_low_precision_error(out, plain, ref)


@needs_bf16
def test_bfloat16_under_autocast_reaches_the_kernel(monkeypatch):
    """``attnlab train --precision bf16`` trains under CPU autocast: the attention's q, k, v arrive in bf16
    and ``auto`` (through ``chunked``) runs them on the kernel (512 tokens: at a few dozen SDPA's smaller
    fixed cost per call wins, in float32 too)."""
    from attnlab.models import CausalLM, CausalLMConfig

    seen = []
    real = native.native_attention

    def spy(call):
        seen.append(call.dtype)
        return real(call)

    monkeypatch.setattr(native, "native_attention", spy)
    lm = CausalLM(CausalLMConfig(vocab_size=50, dim=64, heads=4, layers=1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm(torch.randint(0, 50, (1, 512))).logits.float().logsumexp(-1).mean()
    loss.backward()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lm.parameters() if p.requires_grad)


@needs_bf16
def test_a_failed_bf16_check_is_the_reason_and_float32_stays_served(monkeypatch):
    from attnlab.exact import native_check

    monkeypatch.setattr(native_build, "_bf16_verdicts", {})  # forget this process's verdict
    monkeypatch.setitem(native_build._CHECKED, "bfloat16", "self_check_bf16_of_this_test")  # never passed
    monkeypatch.setattr(native_check, "self_check_bf16", lambda ops: "the kernel's out in bfloat16 differs by 1.0e+00")
    q, k, v = rand_qkv(1, 2, 97, 16, dtype=torch.bfloat16)
    assert native.call_reason(make_call(q, k, v)) == "the kernel's out in bfloat16 differs by 1.0e+00"
    assert native.call_reason(make_call(q.float(), k.float(), v.float())) is None
    out = attnlab.attention(q, k, v, mask=masks.causal(), backend="auto")  # served elsewhere, still right
    ref = attnlab.attention(*(t.double() for t in (q, k, v)), mask=masks.causal(), backend="reference")
    assert_low_precision_error(out, naive_attention(q, k, v, _allowed(masks.causal(), 1, 97, 97)), ref)
