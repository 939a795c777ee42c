"""The flex backend without compiling a kernel: CUDA gating (head dims below 16, a learned
bias on an old torch) with mocked CUDA calls, the block-mask cache, the recompile limit that
raises instead of falling back, the compile note ``explain`` shows; and, compiling for real on
CPU, two shapes in one process (torch 2.13's CPU template broke on the second under dynamic
shapes), the signature limit, the compile-failure fallback and the compile cost in ``auto``'s
estimate."""

from __future__ import annotations

import functools

import pytest
import torch

from attnlab import masks
from attnlab.exact import attention as attnlab_attention
from attnlab.exact import explain, get_backend, make_call
from attnlab.exact import flex as flex_mod
from attnlab.positional import ALiBi, T5RelativeBias

needs_flex = pytest.mark.skipif(flex_mod._flex_api()[1] is not None, reason="this torch has no FlexAttention")


@pytest.mark.parametrize("D,Dv,serves", [(8, 8, False), (16, 8, False), (16, 16, True), (40, 40, True)])
def test_cuda_head_dims_below_16_decline(cuda_call, D, Dv, serves):
    why = get_backend("flex").supports(cuda_call(D=D, Dv=Dv, mask=masks.causal()))
    if serves:
        assert why is None
    else:
        assert "head dims >= 16" in why and f"D={D}" in why


def test_learned_bias_with_grad_declines_on_old_torch(monkeypatch, cuda_call):
    backend = get_backend("flex")
    t5 = T5RelativeBias(4)
    alibi = ALiBi(4)
    learned = torch.zeros(1, 4, 64, 64, requires_grad=True)
    monkeypatch.setattr(flex_mod, "torch_version", lambda: (2, 5))
    why = backend.supports(cuda_call(bias_fn=t5.bias_fn(64, 64), grad=True))
    assert "T5" in why and "2.6" in why
    assert "2.6" in backend.supports(cuda_call(bias=learned, grad=True))
    assert backend.supports(cuda_call(bias_fn=alibi.bias_fn(64, 64), grad=True)) is None  # nothing learned
    assert backend.supports(cuda_call(bias_fn=t5.bias_fn(64, 64), grad=False)) is None  # inference
    monkeypatch.setattr(flex_mod, "torch_version", lambda: (2, 6))
    assert backend.supports(cuda_call(bias_fn=t5.bias_fn(64, 64), grad=True)) is None


def test_captures_grad():
    w = torch.zeros(3, requires_grad=True)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    assert flex_mod.captures_grad(lambda b, h, q, k: w[h])
    slopes = torch.ones(3)
    assert not flex_mod.captures_grad(lambda b, h, q, k: slopes[h])
    assert flex_mod.captures_grad(functools.partial(lambda t, b, h, q, k: t[h], w))
    assert flex_mod.captures_grad(torch.nn.Linear(2, 2).forward)  # a bound method of a learned module
    assert not flex_mod.captures_grad(frozen.forward)


def test_torch_version_is_major_minor():
    major, minor = flex_mod.torch_version()
    assert (major, minor) >= (2, 4)


def _call(N=32, M=32, mask=None):
    q = torch.randn(1, 2, N, 16)
    k = torch.randn(1, 2, M, 16)
    return make_call(q, k, k, mask=mask)


@needs_flex
def test_block_masks_are_cached_per_mask_shape_and_device():
    flex_mod.clear_block_masks()
    a = flex_mod.block_mask_for(_call(mask=masks.causal()))
    assert flex_mod.block_mask_for(_call(mask=masks.causal())) is a  # a new but equal mask object
    assert flex_mod.block_mask_for(_call(N=16, mask=masks.causal())) is not a  # another shape
    assert flex_mod.block_mask_for(_call(mask=masks.sliding_window(4))) is not a  # another mask
    assert flex_mod.block_mask_for(_call(mask=masks.sliding_window(5))) is not flex_mod.block_mask_for(
        _call(mask=masks.sliding_window(4)))
    assert flex_mod.block_mask_for(_call()) is None


@needs_flex
def test_block_mask_cache_follows_tensor_identity_and_in_place_changes():
    flex_mod.clear_block_masks()
    lengths = torch.tensor([20])
    a = flex_mod.block_mask_for(_call(mask=masks.padding(lengths)))
    assert flex_mod.block_mask_for(_call(mask=masks.padding(lengths))) is a  # same tensor
    assert flex_mod.block_mask_for(_call(mask=masks.padding(torch.tensor([20])))) is not a
    lengths[0] = 10  # an in-place change must not return the stale block mask
    b = flex_mod.block_mask_for(_call(mask=masks.padding(lengths)))
    assert b is not a


@needs_flex
def test_block_mask_cache_is_bounded(monkeypatch):
    flex_mod.clear_block_masks()
    monkeypatch.setattr(flex_mod, "BLOCK_MASK_CACHE", 3)
    first = flex_mod.block_mask_for(_call(mask=masks.sliding_window(1)))
    for w in range(2, 6):
        flex_mod.block_mask_for(_call(mask=masks.sliding_window(w)))
    assert len(flex_mod._block_masks) == 3
    assert flex_mod.block_mask_for(_call(mask=masks.sliding_window(1))) is not first  # evicted, rebuilt
    flex_mod.clear_block_masks()


def test_recompile_limit_raises_naming_it(monkeypatch):
    import torch._dynamo

    def scaled(x, n):
        return x * n

    compiled = torch.compile(scaled, backend="eager", dynamic=False)
    monkeypatch.setattr(flex_mod, "RECOMPILE_LIMIT", 2)
    try:
        with pytest.raises(RuntimeError, match=r"recompile_limit \(2 compiled variants"):
            for n in range(5):  # an int argument specializes: one compile per value
                flex_mod.run_compiled(compiled, torch.ones(2), n)
    finally:
        torch._dynamo.reset()


@needs_flex
def test_explain_mentions_compile_cost():
    q = torch.randn(1, 2, 32, 16)
    by = {v.backend: v for v in explain(q, q, q, mask=masks.causal())}
    assert by["flex"].serves and "torch.compile" in by["flex"].note and "each new shape" in by["flex"].note
    assert by["math"].note is None


@needs_flex
def test_two_shapes_in_one_process_on_cpu_equal_the_oracle():
    """The second masked shape of a process compiled to broken C++ under dynamic shapes (torch 2.13)."""
    g = torch.Generator().manual_seed(3)
    for N, M, mask in ((64, 64, masks.causal()), (33, 47, masks.sliding_window(7, 3))):
        q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (N, M, M))
        out = attnlab_attention(q, k, v, mask=mask, backend="flex")
        want = attnlab_attention(q.double(), k.double(), v.double(), mask=mask, backend="reference")
        torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=2e-6)


@needs_flex
def test_signature_limit_refuses_new_shapes_in_supports(monkeypatch):
    backend = get_backend("flex")
    seen = _call(N=40, M=40, mask=masks.causal())
    monkeypatch.setattr(flex_mod, "_compiled_signatures", {flex_mod.signature(seen): None})
    monkeypatch.setattr(flex_mod, "RECOMPILE_LIMIT", 1)
    assert backend.supports(seen) is None  # compiled already: still served
    why = backend.supports(_call(N=48, M=48, mask=masks.causal()))
    assert "compiled 1 shapes" in why and "RECOMPILE_LIMIT" in why


@needs_flex
def test_a_failed_compile_is_answered_by_chunked_and_refused_after(monkeypatch):
    import torch._dynamo.exc

    def broken(*args, **kwargs):
        raise torch._dynamo.exc.BackendCompilerFailed(lambda: None, RuntimeError("C++ compile error"), None)

    monkeypatch.setattr(flex_mod, "run_compiled", broken)
    monkeypatch.setattr(flex_mod, "_failed_signatures", {})
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
    with pytest.warns(RuntimeWarning, match="chunked backend computed the call"):
        out = attnlab_attention(q, k, v, mask=masks.causal(), backend="flex")
    torch.testing.assert_close(out, attnlab_attention(q, k, v, mask=masks.causal(), backend="math"))
    by = {v_.backend: v_ for v_ in explain(q, k, v, mask=masks.causal())}
    assert not by["flex"].serves and "failed to compile this shape" in by["flex"].reason


@needs_flex
def test_auto_estimate_counts_the_compile_of_a_new_shape(monkeypatch):
    backend = get_backend("flex")
    call = _call(N=64, M=64, mask=masks.causal())
    monkeypatch.setattr(flex_mod, "_compiled_signatures", {})
    first = backend.estimate(call)
    flex_mod._compiled_signatures[flex_mod.signature(call)] = None
    again = backend.estimate(call)
    from attnlab.exact.calibration import DEFAULT_SECONDS_PER_UNIT

    assert first - again == pytest.approx(flex_mod.COMPILE_SECONDS["cpu"] / DEFAULT_SECONDS_PER_UNIT)
