"""Measuring one operation honestly: time, peak memory, machine description, ceilings; and the
inputs of a case (masks, seeded q/k/v, a seeded random CausalLM and its prompt) with the float64
oracle its output is checked against.

Shape legend: ``B`` batch, ``H`` heads, ``N`` queries, ``M`` keys, ``D`` head dim.

Peak memory on CPU is read from the kernel: writing ``5`` to ``/proc/self/clear_refs``
resets the resident-set high-water mark (``VmHWM``); the peak of an operation is
``VmHWM`` after it minus ``VmRSS`` before it, so inputs built beforehand are not
counted and everything the operation allocates (outputs, saved activations,
gradients) is. For that figure to be exact, glibc must hand large blocks back to the
kernel when they are freed; :func:`honest_malloc` pins its mmap threshold for the
memory run, :func:`fast_malloc` restores heap reuse for the timed runs. On CUDA the
peak is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, both
read on the device the case's tensors live on (``cuda:1`` when the case says so), not
on whatever device happens to be current.

Timing is the median of a few calls after a warm-up, each call synchronized on CUDA;
the number of threads is left at PyTorch's default.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from .. import masks
from ..models import CausalLM, CausalLMConfig
from ..utils import cpu_model

T = TypeVar("T")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class Unsupported(Exception):  # noqa: N818 - it is a verdict, not a failure
    """Raised while preparing a case that this backend/mechanism cannot serve; the message is the reason."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``float32``, ``bfloat16``, ``float16``, ``float64``)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}") from None


# -- /proc memory counters ----------------------------------------------------------------------


def _status_bytes(key: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or None where there is no procfs."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0). True when it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mem_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _mallopt(param: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(param, value))
    except (OSError, AttributeError):
        return False


#: blocks glibc maps apart during a measured call (:func:`honest_malloc`)
HONEST_MMAP_BYTES = 64 * 1024
#: ... during a whole training run: every block that far apart would cost a page-zeroing mmap per tensor and slow
#: training 1.7x (the arena's exact model at N = 512 on this machine: 0.51 against 0.30 s per step), while blocks
#: of 4 MiB or more (attention matrices, activations) still are, and a fresh process has no heap that hides smaller ones
TRAINING_MMAP_BYTES = 4 * 1024 * 1024


def honest_malloc(threshold: int = HONEST_MMAP_BYTES) -> bool:
    """Make glibc map every block of ``threshold`` bytes or more separately and unmap it on free."""
    return _mallopt(_M_MMAP_THRESHOLD, threshold) and _mallopt(_M_TRIM_THRESHOLD, 128 * 1024)


def fast_malloc() -> bool:
    """Let glibc keep freed blocks below 32 MiB on its heap (its warmed-up default behaviour)."""
    return _mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024) and _mallopt(_M_TRIM_THRESHOLD, 128 * 1024 * 1024)


def limit_address_space(fraction: float = 0.8) -> int | None:
    """Cap this process's address space at its current size plus ``fraction`` of free RAM.

    An allocation beyond the cap then fails with an exception (recorded as ``oom``)
    instead of summoning the kernel's OOM killer on a shared machine. Returns the
    number of extra bytes allowed, or None when it could not be set.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    avail, size = mem_available(), _status_bytes("VmSize")
    if avail is None or size is None:
        return None
    extra = int(avail * fraction)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (size + extra, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        return None
    return extra


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` says memory ran out (CPU allocator, CUDA, or Python)."""
    if isinstance(exc, MemoryError):
        return True
    if hasattr(torch.cuda, "OutOfMemoryError") and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return "out of memory" in msg or "can't allocate memory" in msg or "cannot allocate memory" in msg


# -- timing and peak memory of one operation -------------------------------------------------


def cuda_device(device: str | torch.device) -> torch.device | None:
    """The CUDA device a case's tensors live on (``"cuda"`` is the current one), or None off CUDA."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def sync(device: str | torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op off CUDA)."""
    dev = cuda_device(device)
    if dev is not None:
        torch.cuda.synchronize(dev)



def peak_memory(fn: Callable[[], T], device: str,
                mmap_threshold: int = HONEST_MMAP_BYTES) -> tuple[T, int | None, str]:
    """Call ``fn()`` once and measure the peak memory it allocated beyond what was held before.

    On CPU, glibc is pinned by :func:`honest_malloc` (blocks of ``mmap_threshold`` bytes or more
    mapped apart; :data:`TRAINING_MMAP_BYTES` for a whole training run) for the call and restored
    by :func:`fast_malloc` after it; on CUDA the call is synchronized.

    Returns:
        ``(fn's result, peak bytes or None when the kernel offers no counter, method)``:
        ``method`` names how the peak was read.
    """
    dev = cuda_device(device)
    if dev is not None:
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        out = fn()
        sync(dev)
        return out, torch.cuda.max_memory_allocated(dev) - before, f"torch.cuda.max_memory_allocated({dev})"
    honest = honest_malloc(mmap_threshold)
    try:
        ok = reset_peak_rss()
        before = _status_bytes("VmRSS")
        out = fn()
        after = _status_bytes("VmHWM")
    finally:
        if honest:
            fast_malloc()
    if ok and before is not None and after is not None:
        pinned = "" if mmap_threshold == HONEST_MMAP_BYTES else f", blocks of {mmap_threshold >> 20} MiB or more mapped apart"
        return out, max(0, after - before), "VmHWM-VmRSS" + (pinned if honest else " (malloc not pinned)")
    return out, None, "unavailable (no /proc/self/clear_refs)"


def timed_calls(call: Callable[[], object], repeats: int, budget_s: float,
                device: str | torch.device = "cpu") -> list[float]:
    """Seconds of successive ``call()``s (each waited for on ``device``): at least one, at most ``repeats``,
    fewer once they total ``budget_s``."""
    times: list[float] = []
    while len(times) < max(1, repeats):
        t0 = time.perf_counter()
        call()
        sync(device)
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return times


#: calls slower than this (seconds) are timed on the memory-measured call alone
SLOW_CALL_S = 30.0


def measure_op(op: Callable[[], object], device: str, repeats: int, budget_s: float) -> dict:
    """Time and peak memory of ``op()``.

    One warm-up call, one call whose peak memory is measured, then timed calls: at
    least one, at most ``repeats``, fewer once their total passes ``budget_s``. When
    the warm-up alone takes longer than ``budget_s``, the memory-measured call is the
    only timing sample.

    Returns:
        ``{"time_s": median, "times_s": [...], "peak_bytes": int | None, "peak_method": str}``.
    """
    if not device.startswith("cuda"):
        honest_malloc()  # already for the warm-up, so that the measured call finds no freed heap to reuse
    t0 = time.perf_counter()
    op()  # warm-up: lazy initialization, compilation, caches
    sync(device)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, peak, method = peak_memory(op, device)
    first = time.perf_counter() - t0
    if warm > budget_s and warm > SLOW_CALL_S:
        # a very slow call: another one would double the cost; the memory-measured call
        # (run with the allocator returning memory, so it pays extra page faults) is the
        # timing sample, and the record says so
        return {"time_s": first, "times_s": [first], "peak_bytes": peak,
                "peak_method": method + "; timed on the memory-measured call"}
    if warm > budget_s:
        # one timed call under the normal allocator settings
        t0 = time.perf_counter()
        op()
        sync(device)
        t = time.perf_counter() - t0
        return {"time_s": t, "times_s": [t], "peak_bytes": peak, "peak_method": method}
    if first < 0.5:
        op()  # second warm-up under the timing allocator settings
        sync(device)
    times = timed_calls(op, repeats, budget_s, device)
    return {"time_s": statistics.median(times), "times_s": times, "peak_bytes": peak, "peak_method": method}


# -- the operation of a mode --------------------------------------------------------------------

#: what a kernel or mechanism case times: the forward alone, or forward and backward
MODES = ("fwd", "fwd_bwd")


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


# -- the machine ---------------------------------------------------------------------------------


def physical_cores() -> int | None:
    """Distinct (physical id, core id) pairs in ``/proc/cpuinfo``, or None."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return None
    pairs = set()
    for block in text.strip().split("\n\n"):
        phys = re.search(r"^physical id\s*:\s*(\d+)", block, re.M)
        core = re.search(r"^core id\s*:\s*(\d+)", block, re.M)
        if phys and core:
            pairs.add((phys.group(1), core.group(1)))
    return len(pairs) or None


def machine_info(device: str) -> dict:
    """Everything about this machine and software a reader needs to judge the figures."""
    from .. import __version__ as attnlab_version

    info = {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count() or 0,
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "attnlab": attnlab_version,
        "device": device,
        "device_name": cpu_model(),
    }
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M)
        if m:
            info["memory_total_bytes"] = int(m.group(1)) * 1024
    except OSError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info["device_name"] = props.name
        info["device_memory_bytes"] = int(props.total_memory)
        info["cuda"] = torch.version.cuda
    return info


def _onednn_gflops(a: torch.Tensor, b: torch.Tensor, budget_s: float) -> float | None:
    """GFLOP/s of oneDNN's float32 GEMM (``torch._C._nn.mkldnn_linear`` on oneDNN tensors), or None."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        am, bm = a.to_mkldnn(), b.to_mkldnn()
        r = measure_op(lambda: torch._C._nn.mkldnn_linear(am, bm), "cpu", repeats=5, budget_s=budget_s)
    except (RuntimeError, AttributeError):  # not built with oneDNN, or the op changed
        return None
    return 2.0 * a.shape[0] ** 3 / r["time_s"] / 1e9


def ceilings(device: str, dtypes: list[str], size: int = 2048, copy_mb: int = 256, budget_s: float = 1.0) -> dict:
    """This machine's ceilings: square matmul GFLOP/s per dtype and large-copy GB/s.

    The matmul is ``size x size`` (float32 at ``size``; other dtypes at ``size // 2``
    on CPU, where they are often emulated and slow). On CPU float32 is measured twice,
    ``torch.mm`` (MKL here; its generic path on AMD CPUs) and oneDNN's GEMM (the micro-kernel
    family attnlab's native attention kernel uses), both kept in ``matmul_paths``; the
    ceiling is the faster. The copy moves ``copy_mb`` MiB each way; bandwidth counts read
    plus write.
    """
    out: dict = {"matmul_gflops": {}, "matmul_size": {}, "matmul_paths": {}, "copy_gbps": None, "copy_bytes": None}
    for name in dict.fromkeys(["float32", *dtypes]):
        dt = torch_dtype(name)
        n = size if (name == "float32" or device.startswith("cuda")) else size // 2
        try:
            a = torch.randn(n, n, device=device).to(dt)
            b = torch.randn(n, n, device=device).to(dt)
            r = measure_op(lambda a=a, b=b: torch.matmul(a, b), device, repeats=5, budget_s=budget_s)
            out["matmul_gflops"][name] = 2.0 * n**3 / r["time_s"] / 1e9
            out["matmul_size"][name] = n
            if name == "float32" and not device.startswith("cuda"):
                onednn = _onednn_gflops(a, b, budget_s)
                out["matmul_paths"][name] = {"torch.mm": out["matmul_gflops"][name], "onednn": onednn}
                out["matmul_gflops"][name] = max(out["matmul_gflops"][name], onednn or 0.0)
        except (RuntimeError, TypeError) as e:  # dtype not implemented on this device
            out["matmul_gflops"][name] = None
            out["matmul_size"][name] = f"failed: {e}"[:200]
    numel = copy_mb * 1024 * 1024 // 4
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    r = measure_op(lambda: dst.copy_(src), device, repeats=5, budget_s=budget_s)
    out["copy_gbps"] = 2.0 * src.numel() * 4 / r["time_s"] / 1e9
    out["copy_bytes"] = src.numel() * 4
    return out


def alternate(ops: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each op over ``repeats`` rounds, the ops' calls alternated within a
    round (after one warm-up call each), so that a change of load hits every op alike."""
    for fn in ops.values():
        fn()
    ts: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(repeats):
        for name, fn in ops.items():
            t = time.perf_counter()
            fn()
            ts[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


# -- the inputs of a case and their float64 oracle ------------------------------------------------

#: the mask kinds of the kernels suite
MASK_KINDS = ("none", "causal", "sliding_window", "padding")
#: the window of the ``sliding_window`` kind (keys at most this far to the left)
WINDOW = 256
#: rows of the output checked against the float64 oracle at large N
ORACLE_ROWS = 128
#: largest N at which the NumPy ``reference`` backend is the oracle on every row (above it: float64 torch on
#: ORACLE_ROWS rows; the NumPy formula on every row took seconds per case at N = 1024)
REFERENCE_MAX_N = 512


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


def make_inputs(case: Any, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded random ``q, k, v`` of shape ``(B, H, N, D)`` in the case's dtype and device (read from its
    attributes of those names: a suite's typed case)."""
    g = torch.Generator().manual_seed(seed)
    B, H, N, D = case.B, case.H, case.N, case.D
    dt = torch_dtype(case.dtype)
    return tuple(torch.randn(B, H, N, D, generator=g).to(case.device, dt) for _ in range(3))  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class CausalLMSizes:
    """The sizes of a random CausalLM and of its greedy run (:func:`random_causal_lm`), as the fields of a
    suite's case (the generate and deploy suites' cases subclass it; ``dim / heads`` is the head dim).

    Attributes:
        layers, dim, heads, vocab_size: the model.
        prompt_len, new_tokens: ``P`` prompt tokens, then ``T`` new ones.
    """

    layers: int
    dim: int
    heads: int
    vocab_size: int
    prompt_len: int
    new_tokens: int


@dataclass(frozen=True, kw_only=True)
class CausalLMSizeOptions:
    """:class:`CausalLMSizes` as a suite's options (the generate and deploy suites' subclass it): None
    where the run takes the suite's default or its profile's."""

    layers: int | None = None
    dim: int | None = None
    heads: int | None = None
    vocab_size: int | None = None
    prompt_len: int | None = None
    new_tokens: int | None = None


def random_causal_lm(vocab_size: int, dim: int, heads: int, layers: int, prompt_len: int, new_tokens: int,
                     batch: int = 1, positional: str = "sinusoidal", seed: int = 0, device: str = "cpu",
                     dtype: str = "float32") -> tuple[torch.nn.Module, Tensor]:
    """A seeded random :class:`~attnlab.models.CausalLM` (eval mode, room for ``prompt_len + new_tokens``) and a
    random prompt ``(batch, prompt_len)``: the same in every process."""
    torch.manual_seed(seed)
    cfg = CausalLMConfig(vocab_size=vocab_size, dim=dim, heads=heads, layers=layers, positional=positional,
                         max_len=prompt_len + new_tokens)
    model = CausalLM(cfg).to(device=device, dtype=torch_dtype(dtype)).eval()
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab_size, (batch, prompt_len), generator=g)
    return model, prompt.to(device)  # (B, P)


def token_digest(tokens: Tensor) -> str:
    """A short hex digest of a token tensor (its shape and int64 values): two generations compare by it."""
    t = tokens.detach().to("cpu", torch.int64).contiguous()
    h = hashlib.sha256(repr(tuple(t.shape)).encode())
    h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


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
