"""The GPU suite: every CUDA path against the float64 reference (``pytest -m gpu``).

Skipped without CUDA (and each flash test without a working flash-attn). Low-precision
results are judged against the float64 oracle relative to plain PyTorch's own error in
the same dtype (at most about 2x, with a small floor); float32 against fixed tolerances.
Covers flash (fp16/bf16, forward and gradients, causal N = M and N < M, windows with
N != M, grouped-query heads, head dims 40-256, dropout), flex (every mask kind, learned
bias tensors, T5, ALiBi, head dim 8 declined, N not a multiple of 128, fully masked rows,
bounded recompiles), sdpa/chunked/math, ``auto`` (every backend ``explain`` says serves
runs), fp16 and bf16 training, resume with dropout, and 2-GPU NCCL (with 2 GPUs).
``bash scripts/gpu_check.sh`` runs it on a GPU machine.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.exact import explain, get_backend, make_call
from attnlab.positional import ALiBi, T5RelativeBias
from helpers import rand_qkv

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[1]
CUDA = "cuda"
#: the smallest error a low-precision kernel is allowed, whatever plain torch achieves
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
F32 = dict(rtol=2e-3, atol=2e-3)  # float32 kernels may use TF32-like accumulation orders


# -- helpers ----------------------------------------------------------------------------
def oracle(q, k, v, **kw):
    """Output and (q, k, v) gradients of the float64 ``math`` backend on copies (checked against ``reference``)."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    kw = {key: (val.detach().double() if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
    out = attnlab.attention(q64, k64, v64, backend="math", **kw)
    out.backward(_cotangent(out))
    return out.detach(), [t.grad for t in (q64, k64, v64)]


def _cotangent(out):
    g = torch.Generator(device="cpu").manual_seed(99)
    return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype)


def run(q, k, v, backend, **kw):
    """Output and (q, k, v) gradients of ``backend``."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = attnlab.attention(q, k, v, backend=backend, **kw)
    out.backward(_cotangent(out))
    return out.detach(), [t.grad for t in (q, k, v)]


def plain(q, k, v, allowed, scale=None):
    """Plain PyTorch in the inputs' dtype (no empty rows): the yardstick of low-precision error."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ kk.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(s, -1) @ vv
    out.backward(_cotangent(out))
    return out.detach(), [t.grad for t in (q, k, v)]


def judge(got, base, want, dtype, what):
    err = (got.double() - want).abs().max().item()
    base_err = (base.double() - want).abs().max().item()
    limit = max(2.0 * base_err, FLOOR[dtype] * max(1.0, want.abs().max().item()))
    assert err <= limit, f"{what}: error {err:.3g} > {limit:.3g} (plain torch {base_err:.3g})"


def allowed_of(mask, B, H, N, M):
    return None if mask is None else mask.dense(N, M, device=CUDA, batch=B, heads=H)


def serves_or_skip(backend, q, k, v, **kw):
    why = get_backend(backend).verdict(make_call(q, k, v, **kw))
    if why is not None:
        pytest.skip(f"{backend}: {why}")


# -- flash ------------------------------------------------------------------------------
FLASH_CASES = {  # name: (N, M, mask)
    "causal-square": (128, 128, masks.causal()),
    "causal-decode": (61, 200, masks.causal()),
    "window-N<M": (97, 150, masks.sliding_window(16, 4)),
    "window-N>M": (150, 140, masks.sliding_window(32, 16)),
    "none": (77, 133, None),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [40, 64, 128, 256])
@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_matches_reference(dtype, D, case):
    N, M, mask = FLASH_CASES[case]
    B, H, Hkv = 2, 8, 2
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, dtype=dtype, seed=D + N, device=CUDA)
    serves_or_skip("flash", q, k, v, mask=mask)
    out, grads = run(q, k, v, "flash", mask=mask)
    base, base_grads = plain(q, k, v, allowed_of(mask, B, H, N, M))
    want, want_grads = oracle(q, k, v, mask=mask)
    judge(out, base, want, dtype, "out")
    for name, g, bg, wg in zip("qkv", grads, base_grads, want_grads):
        judge(g, bg, wg, dtype, f"d{name}")


def test_flash_dropout_smoke():
    q, k, v = rand_qkv(2, 8, 256, 64, M=256, Hkv=2, dtype=torch.float16, seed=5, device=CUDA)
    serves_or_skip("flash", q, k, v, mask=masks.causal())
    out, grads = run(q, k, v, "flash", mask=masks.causal(), dropout_p=0.2)
    clean = attnlab.attention(q, k, v, mask=masks.causal(), backend="flash")
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert not torch.equal(out, clean)
    assert (out.float() - clean.float()).abs().mean() < 0.5 * clean.float().abs().mean() + 0.1


def test_flash_is_what_auto_takes_for_half_precision_causal():
    q, k, v = rand_qkv(1, 8, 256, 64, M=256, Hkv=8, dtype=torch.bfloat16, device=CUDA)
    serves_or_skip("flash", q, k, v, mask=masks.causal())
    assert attnlab.choose_backend(q, k, v, mask=masks.causal()) == "flash"


# -- flex -------------------------------------------------------------------------------
def flex_mask(kind, B, N, M):
    g = torch.Generator().manual_seed(len(kind))
    if kind == "random":
        a = torch.rand(B, 1, N, M, generator=g) > 0.5
        a[:, :, :: max(1, N // 5)] = False  # fully masked rows
        return masks.dense(a.to(CUDA))
    return {
        "none": None,
        "causal": masks.causal(),
        "window": masks.sliding_window(37, 5),
        "padding": masks.padding(torch.tensor([M // 2, 0][:B], device=CUDA)),  # batch row 1 sees no key
        "global": masks.sliding_window(8, 8) | masks.global_tokens([0, M // 3]),
        "document": masks.document(torch.randint(0, 4, (B, M), generator=g).sort(-1).values.to(CUDA)) & masks.causal(),
        "prefix_lm": masks.prefix_lm(17),
        "key_mask": masks.key_mask((torch.rand(B, M, generator=g) > 0.3).to(CUDA)),
    }[kind]


FLEX_KINDS = ["none", "causal", "window", "padding", "global", "document", "prefix_lm", "key_mask", "random"]


@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_flex_every_mask_kind(kind):
    B, H, Hkv, N, M, D = 2, 4, 2, 200, 333, 64  # neither a multiple of 128
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, dtype=torch.float32, seed=len(kind), device=CUDA)
    mask = flex_mask(kind, B, N, M)
    serves_or_skip("flex", q, k, v, mask=mask)
    out, grads = run(q, k, v, "flex", mask=mask)
    want, want_grads = oracle(q, k, v, mask=mask)
    torch.testing.assert_close(out.double(), want, **F32)
    for name, g, wg in zip("qkv", grads, want_grads):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double(), wg, **F32, msg=lambda m, n=name: f"d{n}: {m}")
    if mask is not None:
        empty = ~mask.dense(N, M, device=CUDA, batch=B, heads=H).expand(B, H, N, M).any(-1)
        assert (out[empty] == 0).all()  # fully masked rows give zeros


def test_flex_learned_bias_tensor_gets_gradients():
    B, H, N, M, D = 1, 4, 130, 130, 32
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=H, dtype=torch.float32, device=CUDA)
    bias = (0.1 * torch.randn(1, H, N, M, device=CUDA)).requires_grad_(True)
    serves_or_skip("flex", q, k, v, bias=bias)
    out = attnlab.attention(q, k, v, bias=bias, backend="flex")
    out.backward(_cotangent(out))
    b64 = bias.detach().double().requires_grad_(True)
    ref = attnlab.attention(q.double(), k.double(), v.double(), bias=b64, backend="math")
    ref.backward(_cotangent(ref))
    torch.testing.assert_close(out.double(), ref.detach(), **F32)
    torch.testing.assert_close(bias.grad.double(), b64.grad, **F32)


def test_flex_t5_bias_gets_gradients():
    B, H, N, M, D = 1, 4, 150, 150, 32
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=H, dtype=torch.float32, device=CUDA)
    t5 = T5RelativeBias(H).to(CUDA)
    serves_or_skip("flex", *(t.requires_grad_(True) for t in (q, k, v)), bias=t5.bias_fn(N, M))
    out = attnlab.attention(q, k, v, bias=t5.bias_fn(N, M), backend="flex")
    out.backward(_cotangent(out))
    t5_64 = T5RelativeBias(H).to(CUDA).double()
    t5_64.load_state_dict(t5.state_dict())
    ref = attnlab.attention(q.double(), k.double(), v.double(), bias=t5_64.bias_fn(N, M), backend="math")
    ref.backward(_cotangent(ref))
    torch.testing.assert_close(out.double(), ref.detach(), **F32)
    torch.testing.assert_close(t5.embedding.weight.grad.double(), t5_64.embedding.weight.grad, **F32)


def test_flex_alibi():
    B, H, N, M, D = 2, 8, 100, 260, 32
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=2, dtype=torch.float32, device=CUDA)
    alibi = ALiBi(H).to(CUDA)
    serves_or_skip("flex", q, k, v, mask=masks.causal(), bias=alibi.bias_fn(N, M))
    out = attnlab.attention(q, k, v, mask=masks.causal(), bias=alibi.bias_fn(N, M), backend="flex")
    want = attnlab.attention(q.double(), k.double(), v.double(), mask=masks.causal(),
                             bias=alibi.double().bias_fn(N, M), backend="math")
    torch.testing.assert_close(out.double(), want, **F32)


def test_flex_declines_head_dim_8_with_a_reason():
    q, k, v = rand_qkv(1, 2, 64, 8, M=64, Hkv=2, dtype=torch.float16, device=CUDA)
    by = {x.backend: x for x in explain(q, k, v, mask=masks.causal())}
    assert not by["flex"].serves and ">= 16" in by["flex"].reason


def test_flex_recompiles_are_bounded():
    from torch._dynamo.utils import counters

    def graphs():
        return counters["stats"]["unique_graphs"]

    torch._dynamo.reset()
    start = graphs()
    for n in (128, 200, 256, 301, 384):  # no mask: dynamic shapes after the second length
        q, k, v = rand_qkv(1, 4, n, 64, M=n, Hkv=4, dtype=torch.float16, device=CUDA)
        attnlab.attention(q, k, v, backend="flex")
    assert graphs() - start <= 3, f"{graphs() - start} compiles for 5 lengths"
    q, k, v = rand_qkv(1, 4, 200, 64, M=200, Hkv=4, dtype=torch.float16, device=CUDA)
    attnlab.attention(q, k, v, mask=masks.causal(), backend="flex")
    once = graphs()
    for _ in range(4):  # the same masked shape again: cached block mask, no new compile
        attnlab.attention(q, k, v, mask=masks.causal(), backend="flex")
    assert graphs() == once


# -- sdpa, chunked, math ----------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "math"])
@pytest.mark.parametrize("kind", ["none", "causal", "window", "padding", "random"])
def test_dense_backends_on_cuda(backend, kind):
    B, H, Hkv, N, M, D = 2, 8, 2, 97, 150, 40
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, dtype=torch.float32, seed=len(kind), device=CUDA)
    mask = flex_mask(kind, B, N, M)
    out, grads = run(q, k, v, backend, mask=mask)
    want, want_grads = oracle(q, k, v, mask=mask)
    torch.testing.assert_close(out.double(), want, **F32)
    for name, g, wg in zip("qkv", grads, want_grads):
        torch.testing.assert_close(g.double(), wg, **F32, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sdpa_half_precision_with_gqa_and_a_mask_avoids_the_math_kernel(dtype):
    B, H, Hkv, N, M, D = 2, 8, 2, 128, 192, 64
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, dtype=dtype, device=CUDA)
    mask = masks.padding(torch.tensor([192, 100], device=CUDA))
    out, grads = run(q, k, v, "sdpa", mask=mask)
    assert get_backend("sdpa").last_kernel not in ("math", None), get_backend("sdpa").last_kernel
    base, base_grads = plain(q, k, v, allowed_of(mask, B, H, N, M))
    want, want_grads = oracle(q, k, v, mask=mask)
    judge(out, base, want, dtype, "out")
    for name, g, bg, wg in zip("qkv", grads, base_grads, want_grads):
        judge(g, bg, wg, dtype, f"d{name}")


def test_sdpa_runs_under_a_pinned_kernel():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = rand_qkv(1, 8, 64, 64, M=64, Hkv=2, dtype=torch.float16, device=CUDA)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        attnlab.attention(q, k, v, mask=masks.padding(torch.tensor([40], device=CUDA)), backend="sdpa")
    assert get_backend("sdpa").last_kernel == "efficient"


# -- auto -------------------------------------------------------------------------------
AUTO_CALLS = [
    (torch.float16, None, False), (torch.bfloat16, "causal", True), (torch.float32, "window", False),
    (torch.float16, "padding", True), (torch.float32, "global", False), (torch.bfloat16, "random", False),
]


@pytest.mark.parametrize("dtype,kind,grad", AUTO_CALLS)
def test_every_backend_explain_says_serves_runs(dtype, kind, grad):
    B, H, Hkv, N, M, D = 2, 8, 2, 160, 160, 64
    q, k, v = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, dtype=dtype, requires_grad=grad, device=CUDA)
    mask = flex_mask(kind or "none", B, N, M)
    want = oracle(q, k, v, mask=mask)[0]
    served = [x for x in explain(q, k, v, mask=mask) if x.serves and x.backend != "reference"]
    assert any(x.chosen for x in served)
    for x in served:
        out = attnlab.attention(q, k, v, mask=mask, backend=x.backend)
        tol = F32 if dtype == torch.float32 else dict(rtol=0.0, atol=4 * FLOOR[dtype])
        torch.testing.assert_close(out.double(), want, **tol, msg=lambda m, n=x.backend: f"{n}: {m}")


# -- training ---------------------------------------------------------------------------
def _spec(**train_kw):
    from attnlab.train import RunSpec

    tr = dict(precision="fp32", progress=False, log_every=1, eval_batches=1, final_eval=False, device="cuda")
    tr.update(train_kw)
    return RunSpec(task="copy", task_options={"length": 8}, model={"dim": 64, "heads": 4, "layers": 2, "ff_dim": 128},
                   train=tr)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_training_steps(tmp_path, precision):
    from attnlab.train import train

    if precision == "bf16" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("no native bf16 on this GPU")
    # log_every=3: on a GPU the loss is read back (and checked) every third step only
    res = train(_spec(steps=6, precision=precision, log_every=3), tmp_path, quiet=True)
    assert res.precision.startswith(precision)
    assert all(math.isfinite(x) for x in res.losses.values()) and sorted(res.losses) == [3, 6]


def test_auto_precision_picks_native_bf16(tmp_path):
    from attnlab.train import resolve_precision

    want = "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp16"
    assert resolve_precision("auto", torch.device("cuda", 0))[0] == want


def test_resume_with_dropout_matches_the_uninterrupted_run(tmp_path):
    from attnlab.train import RunSpec, train

    kw = dict(steps=8, save_every=4, warmup=2, seed=3)
    model = {"dim": 64, "heads": 4, "layers": 2, "ff_dim": 128, "dropout": 0.2, "attn_dropout": 0.1}

    def spec():
        s = _spec(**kw)
        return RunSpec(task=s.task, task_options=s.task_options, model=model, train=s.train)

    straight = train(spec(), tmp_path / "a", quiet=True)
    train(spec(), tmp_path / "b", stop_at=4, quiet=True)
    rest = train(spec(), tmp_path / "b", resume=True, quiet=True)
    for s in range(5, 9):
        torch.testing.assert_close(torch.tensor(rest.losses[s]), torch.tensor(straight.losses[s]), rtol=1e-4, atol=1e-5)


# -- two GPUs ---------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_nccl_training_and_resume(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def torchrun(steps: int, *extra: str) -> None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}", "-m", "attnlab.train.cli", "train", "copy", "--task-opt", "length=5",
               "--model", "dim=32,heads=2,layers=1,ff_dim=64,dropout=0.1", "--steps", str(steps), "--batch-size",
               "8", "--precision", "fp32", "--device", "cuda", "--quiet", "--eval-batches", "1", "--save-every", "3",
               "--out", str(tmp_path / "ddp"), *extra]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    torchrun(6)
    assert '"world_size": 2' in (tmp_path / "ddp" / "run.json").read_text()
    torchrun(9, "--resume")
    assert (tmp_path / "ddp" / "checkpoints" / "step_00000009").is_dir()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_edges_backend_and_gat_layer_on_cuda(dtype):
    """The edges kernel (cuSPARSE products, segment_reduce) against the CPU float64 oracle, and a GAT layer."""
    from attnlab.layers import GATConv
    from helpers import random_edges

    n = 300
    ei = random_edges(n, seed=3, isolated=2)
    mask = masks.graph(ei.to(CUDA), num_nodes=n)
    q, k, v = rand_qkv(2, 4, n, 32, dtype=dtype, seed=4, device=CUDA, requires_grad=True)
    out = attnlab.attention(q, k, v, mask=mask, backend="edges")
    ref = attnlab.attention(q.detach().double().cpu(), k.detach().double().cpu(), v.detach().double().cpu(),
                            mask=masks.graph(ei, num_nodes=n), backend="reference")
    tol = F32 if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(out.double().cpu(), ref, **tol)
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    conv = GATConv(16, 8, heads=4)
    x = torch.randn(n, 16)
    want = conv(x, ei)
    got = conv.to(CUDA)(x.to(CUDA), ei.to(CUDA))
    torch.testing.assert_close(got.cpu(), want, **F32)
