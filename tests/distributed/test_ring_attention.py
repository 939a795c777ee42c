"""Ring attention on 2 and 4 gloo ranks equals the single-process op on the same full inputs.

Every mask kind at global positions, both layouts (and a fine granule, so chunks hold
several tiles), N not divisible by P, fully masked rows, grouped-query heads, bias
functions (ALiBi; T5 with its table's gradient summed over ranks), float64. Forward
within 1e-5 and gradients within 5e-5 in float32 (the targets), 1e-10 in float64.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import reference, run_ranks, shard

import attnlab
from attnlab import masks
from attnlab.distributed import SequenceLayout, gather_sequence, ring_attention
from attnlab.positional import ALiBi, T5RelativeBias

F32 = {"out": 1e-5, "lse": 1e-5, "grad": 5e-5}
F64 = {"out": 1e-10, "lse": 1e-10, "grad": 1e-10}


def _mask(kind: str, B: int, N: int, g: torch.Generator):
    """The global mask of a case (None for no mask)."""
    if kind == "none":
        return None
    if kind == "causal":
        return masks.causal()
    if kind == "window":
        return masks.sliding_window(5)
    if kind == "window_sym":
        return masks.sliding_window(4, 4)
    if kind == "padding":  # batch row 1 is all padding: every row of it is fully masked
        return masks.padding([N - 3, 0][:B])
    if kind == "document":
        return masks.document(torch.randint(0, 4, (B, N), generator=g).sort(-1).values)
    if kind == "document_causal":
        return masks.document(torch.randint(0, 3, (B, N), generator=g).sort(-1).values) & masks.causal()
    if kind == "prefix":
        return masks.prefix_lm(N // 3)
    if kind == "causal_padding":
        return masks.causal() & masks.padding([N, N // 2][:B])
    if kind == "empty_rows":  # the first 4 queries see no key (their only keys are blocked)
        keep = torch.ones(B, N, dtype=torch.bool)
        keep[:, :4] = False
        return masks.causal() & masks.key_mask(keep)
    raise AssertionError(kind)


MASKS = ("none", "causal", "window", "window_sym", "padding", "document", "document_causal", "prefix",
         "causal_padding", "empty_rows")


def _check(rank, world, layout, got, want, tol, what):
    out, lse, grads = got
    ref_out, ref_lse, ref_grads = want
    cut = lambda x: shard(x, rank, world, layout)  # noqa: E731
    torch.testing.assert_close(out, cut(ref_out), atol=tol["out"], rtol=0, msg=lambda m: f"{what} out: {m}")
    torch.testing.assert_close(lse, cut(ref_lse), atol=tol["lse"], rtol=0, msg=lambda m: f"{what} lse: {m}")
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        torch.testing.assert_close(a, cut(b), atol=tol["grad"], rtol=0, msg=lambda m, n=name: f"{what} {n}: {m}")


def _run_case(rank, world, *, mask_kind="causal", layout="zigzag", N=37, H=4, Hkv=2, D=8, bias=None,
              dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    B = 2
    q = torch.randn(B, H, N, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, N, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, N, D + 1 if dtype == torch.float64 else D, generator=g, dtype=dtype)
    dout = torch.randn(B, H, N, v.shape[-1], generator=g, dtype=dtype)
    mask = _mask(mask_kind, B, N, g)
    lay = layout if isinstance(layout, str) else SequenceLayout(layout[0], world, N, granule=layout[1])
    fn = None
    if bias is not None:
        fn = bias.bias_fn(N, N)
    want = reference(q, k, v, dout, mask=mask, bias=fn)
    ql, kl, vl = (shard(t, rank, world, lay).to(device).requires_grad_() for t in (q, k, v))
    if mask is not None:
        mask = mask.to(device)
    out, lse = ring_attention(ql, kl, vl, mask=mask, bias=fn, layout=lay, return_lse=True)
    out.backward(shard(dout, rank, world, lay).to(device))
    what = f"P={world} mask={mask_kind} layout={layout} N={N} H={H}/{Hkv} bias={type(bias).__name__} {dtype}"
    got = (out.cpu(), lse.cpu(), (ql.grad.cpu(), kl.grad.cpu(), vl.grad.cpu()))
    _check(rank, world, lay, got, want,
           F64 if dtype == torch.float64 else F32, what)


def _parity(rank, world):
    # every mask on the default layout, and on the contiguous one or a fine granule (chunks of several tiles)
    for i, mask_kind in enumerate(MASKS):
        for layout in ("zigzag", ("contiguous", 3) if i % 2 else ("zigzag", 3)):
            _run_case(rank, world, mask_kind=mask_kind, layout=layout)
    for N in (world, 2 * world * 4, 61):  # shortest possible, divisible, and not
        _run_case(rank, world, mask_kind="causal", N=N, H=3, Hkv=1)
    _run_case(rank, world, mask_kind="document_causal", dtype=torch.float64, layout=("zigzag", 2))
    _run_case(rank, world, mask_kind="none", H=2, Hkv=2, D=16)
    # gather_sequence puts every rank's shard back in global order, on every rank
    full = torch.randn(2, 3, 61, 5, generator=torch.Generator().manual_seed(7))
    for layout in ("zigzag", "contiguous"):
        assert torch.equal(gather_sequence(shard(full, rank, world, layout), layout=layout), full)


def _biases(rank, world):
    torch.manual_seed(0)
    alibi = ALiBi(4)
    _run_case(rank, world, mask_kind="causal", bias=alibi)
    _run_case(rank, world, mask_kind="window_sym", bias=ALiBi(4, symmetric=True), layout=("contiguous", 4))
    # T5: a learned table; each rank's gradient is its share, the sum over ranks the whole
    t5 = T5RelativeBias(4, num_buckets=8, max_distance=16, bidirectional=False)
    N = 29
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 4, N, 8, generator=g) for _ in range(4))
    fn = t5.bias_fn(N, N)
    want = reference(q, k, v, dout, mask=masks.causal(), bias=fn)
    (want_table,) = torch.autograd.grad(
        attnlab.attention(q, k, v, mask=masks.causal(), bias=fn, backend="math"),
        (t5.embedding.weight,), dout)
    ql, kl, vl = (shard(t, rank, world, "zigzag").requires_grad_() for t in (q, k, v))
    out, lse = ring_attention(ql, kl, vl, mask=masks.causal(), bias=fn, return_lse=True)
    out.backward(shard(dout, rank, world, "zigzag"))
    _check(rank, world, "zigzag", (out, lse, (ql.grad, kl.grad, vl.grad)), want, F32, "T5")
    table = t5.embedding.weight.grad.clone()
    torch.distributed.all_reduce(table)
    torch.testing.assert_close(table, want_table, atol=5e-5, rtol=0)


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks on 2 cores: slow, and 2 rings already
def test_ring_matches_single_process(world):
    run_ranks(_parity, world)


def test_ring_bias_functions():
    run_ranks(_biases, 2)


def _parity_cuda(rank, world):
    for mask_kind in ("none", "causal", "document_causal", "empty_rows"):
        _run_case(rank, world, mask_kind=mask_kind, device=f"cuda:{rank}")
    _run_case(rank, world, mask_kind="causal", bias=ALiBi(4), device=f"cuda:{rank}")


def _cpu_on_nccl(rank, world):
    x = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="group uses backend 'nccl', which moves cuda tensors, but q is on cpu"):
        ring_attention(x, x, x)


def _cuda_on_gloo(rank, world):
    x = torch.randn(1, 2, 8, 4, device="cuda")
    with pytest.raises(ValueError, match="group uses backend 'gloo', which moves cpu tensors, but q is on cuda:0"):
        ring_attention(x, x, x)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_ring_over_nccl_matches_single_process(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices")
    run_ranks(_parity_cuda, world, backend="nccl")
    run_ranks(_cpu_on_nccl, world, backend="nccl")


@pytest.mark.gpu
def test_cuda_tensors_on_a_gloo_group_are_a_clear_error():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    run_ranks(_cuda_on_gloo, 2)
