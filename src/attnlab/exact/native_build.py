"""Build, load and check attnlab's native CPU attention kernel (``native_attn.cpp``).

The kernel is compiled on first use (or ahead of it by :func:`build`) with the C++ compiler
and PyTorch's own headers and libraries, the include and library paths
``torch.utils.cpp_extension`` gives, into a cache directory:
``$ATTNLAB_NATIVE_CACHE`` or ``~/.cache/attnlab/native``, one folder per hash of the
source, the torch version, the brgemm header, the compiler, the flags and this CPU's
model and flags (``-march=native`` code must not run on another CPU, so another machine
builds its own). The compile is an ordinary subprocess in this environment, never an
isolated pip build (that would fetch another torch); a lock file serializes concurrent
first uses and the library is renamed into place when complete.

Flags: ``-O3 -march=native -fopenmp`` (compile and link: without OpenMP the kernel's
``at::parallel_for`` runs on one thread). ``ATTNLAB_NATIVE_DEBUG=1`` builds with bounds
checks in every loop (``-DATTNLAB_NATIVE_DEBUG``, ``-O1 -g``); ``ATTNLAB_NATIVE_ASAN=1``
also with AddressSanitizer (run Python with ``libasan.so`` and ``libstdc++.so`` in ``LD_PRELOAD``;
docs/native.md has the command).
``ATTNLAB_NATIVE=0`` turns the kernel off. ``ATTNLAB_NATIVE_ISA=avx2`` builds the variant an
AVX2-only CPU gets (``-mno-avx512f``, and :func:`vec_capability`'s defines: the softmax on at::vec's
8-lane AVX2 ``Vectorized`` instead of its AVX-512 intrinsics), in its own cache folder, so it is tested
on an AVX-512 machine too.

A failed compile is recorded in its folder (``build_failed``, the reason, beside ``build.log``):
later processes (spawned workers, DDP ranks, bench children) report it instead of compiling again,
until an input changes (a new folder) or the record is deleted. A library that links another
OpenMP runtime than torch's (``ldd`` of both) is refused with the two paths.

At its first use on this machine the loaded kernel is checked against the float64 formula
(:func:`self_check`: every mask input, grouped-query heads, empty rows, forward and
gradients); a pass is recorded beside the library (``self_check_passed``, the library's
SHA-256), so later processes load it without checking again. :func:`status` is None when the
kernel is in use, else the one-line reason it is not (no compiler, no float32 brgemm in this
torch's ``ATen/native/CPUBlas.h``, a failed compile, a failed check), which ``attnlab.explain``
and ``attnlab info`` show;
attnlab then runs the fused path it used before the kernel existed.

bfloat16 calls have a verdict of their own, :func:`bf16_status`: None when this CPU has
``avx512_bf16`` (its flags in ``/proc/cpuinfo``), the library was built with it (``info()``
says ``bf16 avx512_bf16``) and the kernel's bfloat16 path passes its own check against the
float64 formula at bfloat16 tolerance (:func:`attnlab.exact.native_check.self_check_bf16`, run
at the first bfloat16 call, its pass recorded as ``self_check_bf16_passed``); else the reason,
and bfloat16 calls take the path they took before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..utils import cpu_model

__all__ = ["bf16_status", "build", "build_seconds", "cache_dir", "cpu_has_bf16", "library", "set_native_enabled",
           "status"]

SOURCE = Path(__file__).with_name("native_attn.cpp")
_LIB_NAME = "attnlab_native.so"
#: the record of a failed build in its folder (the folder's name hashes every input, so a change retries)
_FAILED = "build_failed"
#: beside the library, per self-check: the SHA-256 of the library that passed it (later processes skip it)
_CHECKED = {"float32": "self_check_passed", "bfloat16": "self_check_bf16_passed"}
_forced_off = False
_build_seconds: float | None = None
#: the library this process loaded (a later check reuses it, even if the source changed since)
_loaded: Path | None = None


def set_native_enabled(enabled: bool) -> None:
    """Turn the native kernel off (``False``) or back on for this process (comparisons, tests of the fallback)."""
    global _forced_off
    _forced_off = not enabled


def cache_dir() -> Path:
    """Where built kernels live: ``$ATTNLAB_NATIVE_CACHE`` or ``~/.cache/attnlab/native``."""
    root = os.environ.get("ATTNLAB_NATIVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "attnlab",
                                                                  "native")
    return Path(root)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _header() -> Path:
    from torch.utils import cpp_extension

    return Path(cpp_extension.include_paths()[0]) / "ATen" / "native" / "CPUBlas.h"


def brgemm_signature() -> str | None:
    """None when this torch's ``CPUBlas.h`` declares the float32 brgemm the kernel calls, else why not."""
    try:
        text = _header().read_text()
    except OSError as e:
        return f"torch {torch.__version__} ships no ATen/native/CPUBlas.h ({e.strerror})"
    fp32 = re.search(r"brgemm\(\s*int64_t M,\s*int64_t N,\s*int64_t K,\s*int64_t ld_a,\s*int64_t ld_b,\s*"
                     r"int64_t ld_c,\s*const bool add_C,\s*const float\* A,\s*const float\* B,\s*float\* C", text)
    if fp32 is None or "CPUBLAS_BRGEMM_F32F32F32" not in text:
        return f"torch {torch.__version__}'s ATen/native/CPUBlas.h has no float32 cpublas::brgemm(M, N, K, ld_a, " \
               "ld_b, ld_c, add_C, A, B, C)"
    return None


def isa_request() -> str:
    """``$ATTNLAB_NATIVE_ISA``: ``native`` (default: everything this CPU has) or ``avx2`` (no AVX-512 code)."""
    isa = os.environ.get("ATTNLAB_NATIVE_ISA", "native").strip().lower() or "native"
    if isa not in ("native", "avx2"):
        raise ValueError(f"ATTNLAB_NATIVE_ISA must be 'native' or 'avx2', got {isa!r}")
    return isa


def vec_capability() -> list[str]:
    """The defines that pick at::vec's AVX2 ``Vectorized`` for the softmax loops (``ATen/cpu/vec`` reads
    ``CPU_CAPABILITY_AVX2``, and ``CPU_CAPABILITY`` names its inline namespace) when the build targets AVX2
    without AVX-512: ``ATTNLAB_NATIVE_ISA=avx2``, or a CPU with AVX2 but no AVX-512. Nothing on an
    AVX-512 CPU's default build (its softmax is AVX-512 intrinsics) or a CPU without AVX2, FMA and F16C
    (what torch's own AVX2 code is built for): at::vec's portable default there."""
    flags = set(_cpu_flags().split())
    if {"avx2", "fma", "f16c"} <= flags and (isa_request() == "avx2" or "avx512f" not in flags):
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return []


def _omp_runtimes(path: Path) -> dict[str, str]:
    """``{soname: resolved path}`` of the OpenMP runtimes (libgomp, libiomp, libomp) ``path`` links, by ``ldd``."""
    try:
        text = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in text.splitlines():
        m = re.match(r"\s*(lib(?:g|i|)omp[^\s]*)\s*=>\s*(\S+)", line)
        if m:
            found[m.group(1)] = os.path.realpath(m.group(2))
    return found


def openmp_mismatch(lib: Path) -> str | None:
    """None when ``lib`` links the OpenMP runtime torch links (or ldd is missing), else why not: two runtimes
    in one process oversubscribe the cores or crash."""
    if shutil.which("ldd") is None:
        return None
    torch_lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    ours, theirs = _omp_runtimes(lib), _omp_runtimes(torch_lib) if torch_lib.is_file() else {}
    if not ours or not theirs:  # static or no runtime on one side: nothing to compare
        return None
    if set(ours.values()) != set(theirs.values()):
        return (f"the native kernel links the OpenMP runtime {', '.join(sorted(ours.values()))} but torch links "
                f"{', '.join(sorted(theirs.values()))} (two runtimes in one process)")
    return None


def _mode() -> str:
    if os.environ.get("ATTNLAB_NATIVE_ASAN") == "1":
        return "asan"
    return "debug" if os.environ.get("ATTNLAB_NATIVE_DEBUG") == "1" else "release"


def _command(compiler: str, out: Path) -> list[str]:
    """The compile-and-link command line for ``native_attn.cpp`` against this torch."""
    from torch.utils import cpp_extension

    mode = _mode()
    # 512-bit vectors for the softmax loops where the CPU has them (GCC's default prefers 256); ATTNLAB_NATIVE_ISA=avx2
    # builds the variant an AVX2-only CPU gets (no AVX-512 code of ours; oneDNN's brgemm picks its own at run time)
    isa = ["-mno-avx512f", "-mprefer-vector-width=256"] if isa_request() == "avx2" else ["-mprefer-vector-width=512"]
    isa += vec_capability()
    opt = ["-O3", "-march=native", *isa] if mode == "release" else ["-O1", "-g", "-march=native", *isa,
                                                                       "-DATTNLAB_NATIVE_DEBUG"]
    if mode == "asan":
        opt += ["-fsanitize=address", "-fno-omit-frame-pointer"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = cpp_extension.library_paths()
    link = [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    return [compiler, *opt, "-fopenmp", "-std=c++20", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-Wno-c++20-extensions", *includes, str(SOURCE), "-o", str(out), *link]


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _key(compiler: str) -> str:
    h = hashlib.sha256()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    for part in (SOURCE.read_bytes(), _header().read_bytes(), torch.__version__.encode(), version.encode(),
                 " ".join(_command(compiler, Path("x"))).encode(), cpu_model().encode(), _cpu_flags().encode(),
                 sys.version.encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


@contextlib.contextmanager
def _locked(folder: Path):
    """Hold ``folder/lock`` (one build at a time; where ``fcntl`` is missing the atomic rename alone guards)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(folder / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build() -> tuple[Path | None, str | None]:
    """``(library path, None)``, building it when this machine has none yet, else ``(None, why not)``.

    A failed compile is recorded (``build_failed`` beside the log) and not retried by later processes
    until an input changes; a library that links another OpenMP runtime than torch is refused.
    """
    why = brgemm_signature()
    if why is not None:
        return None, why
    compiler = _compiler()
    if compiler is None:
        return None, "no C++ compiler on PATH (c++, g++ or clang++; or set CXX)"
    folder = cache_dir() / _key(compiler)
    lib = folder / _LIB_NAME
    failed = folder / _FAILED
    with _locked(folder):
        if not lib.is_file():
            if failed.is_file():  # a build of these exact inputs failed before: not retried until an input changes
                return None, f"{failed.read_text().strip()} (recorded in {failed}: delete it to retry)"
            why = _compile(compiler, folder, lib)
            if why is not None:
                failed.write_text(why + "\n")
                return None, why
    why = openmp_mismatch(lib)
    return (None, why) if why is not None else (lib, None)


def _compile(compiler: str, folder: Path, lib: Path) -> str | None:
    """Compile into ``lib`` (renamed into place when complete); None, or why it failed."""
    global _build_seconds
    tmp = folder / f"{_LIB_NAME}.{os.getpid()}.tmp"
    t0 = time.perf_counter()
    try:
        done = subprocess.run(_command(compiler, tmp), capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.SubprocessError) as e:
        return f"compiling native_attn.cpp failed: {e}"
    if done.returncode != 0:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[-200:])
        (folder / "build.log").write_text(done.stderr)
        return f"compiling native_attn.cpp failed ({first.strip()[:160]}; log in {folder / 'build.log'})"
    _build_seconds = time.perf_counter() - t0
    (folder / "build_seconds").write_text(f"{_build_seconds:.1f}\n")
    os.replace(tmp, lib)
    return None


def build_seconds() -> float | None:
    """Seconds the compile took in this process (None: the library came from the cache)."""
    return _build_seconds


@functools.lru_cache(maxsize=1)
def _load() -> tuple[object | None, str | None]:
    """``(torch.ops.attnlab_native, None)`` when built, loaded and checked; else ``(None, why not)``."""
    if os.environ.get("ATTNLAB_NATIVE") == "0":
        return None, "the native kernel is turned off (ATTNLAB_NATIVE=0)"
    global _loaded
    lib, why = build()
    if lib is None:
        return None, why
    try:
        if _loaded is None:  # a process registers the op namespace once: a second library would abort it
            torch.ops.load_library(str(lib))
            _loaded = lib
            with contextlib.suppress(RuntimeError, AttributeError):  # eager use needs none (compile would name them)
                _register_fakes()
        ops = torch.ops.attnlab_native
    except (OSError, RuntimeError) as e:
        return None, f"loading {lib} failed: {str(e).splitlines()[0][:160]}"
    return (ops, None) if (why := _checked(ops, lib)) is None else (None, why)


def _checked(ops, lib: Path, dtype: str = "float32") -> str | None:
    """The verdict of the self-check of ``dtype`` (``float32``: :func:`~attnlab.exact.native_check.self_check`,
    ``bfloat16``: ``self_check_bf16``) on the loaded library ``lib``: run once per library on this machine.

    A pass is recorded beside the library with the library's SHA-256, so later processes (each bench
    case, every test worker, each DDP rank) load it without checking again (the check imports
    autograd's symbolic-shape machinery and took seconds per process); a failure is never recorded.
    """
    from . import native_check

    digest = hashlib.sha256(lib.read_bytes()).hexdigest()
    record = lib.parent / _CHECKED[dtype]
    with contextlib.suppress(OSError):
        if record.read_text().strip() == digest:
            return None
    why = native_check.self_check(ops) if dtype == "float32" else native_check.self_check_bf16(ops)
    if why is None:
        with contextlib.suppress(OSError):  # a read-only cache only costs the next process the check
            tmp = record.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(digest + "\n")
            os.replace(tmp, record)
    return why


def _register_fakes() -> None:
    """Shape-only (fake, meta) kernels of the two ops, so ``torch.compile`` and ``torch.export`` trace them.

    They allocate what the C++ ops return, on the inputs' device: ``forward`` ``(out (B, H, N, Dv),
    lse (B, H, N))``; ``backward`` ``(dq, dk, dv)`` shaped as ``q, k, v`` (contiguous) and ``drel``
    ``(rel heads, N + M - 1)`` when ``rel_grad``, else ``(0,)``; ``lse`` and ``drel`` float32 whatever
    q's dtype (bfloat16 too).
    """

    @torch.library.register_fake("attnlab_native::forward")
    def _forward_fake(q, k, v, lo, hi, tiles, bits, dense, bias, rel, scale, block_q, block_k):
        B, H, N = q.shape[0], q.shape[1], q.shape[2]
        return q.new_empty((B, H, N, v.shape[3])), q.new_empty((B, H, N), dtype=torch.float32)

    @torch.library.register_fake("attnlab_native::backward")
    def _backward_fake(dout, q, k, v, out, lse, lo, hi, tiles, bits, dense, bias, rel, rel_grad, scale, block_q,
                       block_k):
        f32 = torch.float32
        drel = q.new_empty((rel.shape[0], q.shape[2] + k.shape[2] - 1), dtype=f32) if rel_grad else \
            q.new_empty((0,), dtype=f32)
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), drel


#: whether this process has loaded (or failed to load) the kernel once
_first_load_done = False


def _loaded_status() -> str | None:
    global _first_load_done
    if not _first_load_done:  # build and check on real tensors, even when the first use is inside a trace
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch._C.DisableTorchFunction():  # no fake, proxy or export modes
            _load()
        _first_load_done = True
    return _load()[1]


# torch.compile calls it once while tracing and keeps the answer (no tracing into the build and the
# self-check); set_native_enabled's flag, read outside it, stays a guard of the compiled code. The
# attribute is what torch.compiler.assume_constant_result sets (without importing torch._dynamo here).
_loaded_status._dynamo_marked_constant = True  # type: ignore[attr-defined]


def library():
    """``torch.ops.attnlab_native`` when the kernel is in use, else None (see :func:`status`)."""
    if _forced_off or _loaded_status() is not None:
        return None
    return torch.ops.attnlab_native


def status() -> str | None:
    """None when the native kernel is built, loaded and verified; else the one-line reason it is not used."""
    if _forced_off:
        return "the native kernel is turned off (set_native_enabled(False))"
    return _loaded_status()


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 products natively (``avx512_bf16`` among its flags)."""
    return "avx512_bf16" in _cpu_flags().split()


#: per loaded library: the verdict of its bfloat16 path (None: in use)
_bf16_verdicts: dict[Path, str | None] = {}


def bf16_status() -> str | None:
    """None when the kernel also serves bfloat16 calls here; else the one-line reason it does not.

    The CPU needs ``avx512_bf16`` (without it oneDNN's bfloat16 products are emulated, slower than
    float32), the library must have been built with it, and its bfloat16 path must pass
    :func:`attnlab.exact.native_check.self_check_bf16` (at the first bfloat16 call; a pass is recorded
    beside the library like the float32 check's).
    """
    return status() or _bf16_verdict()


def _bf16_verdict() -> str | None:
    """:func:`bf16_status` of the loaded library (the kernel itself in use)."""
    if not cpu_has_bf16():
        return f"bfloat16 on the native kernel needs a CPU with avx512_bf16 ({cpu_model()} has none)"
    if _loaded not in _bf16_verdicts:
        ops = torch.ops.attnlab_native
        if "bf16 avx512_bf16" not in ops.info():
            why = f"the native kernel was built without avx512_bf16 code (ATTNLAB_NATIVE_ISA={isa_request()})"
        else:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes(), torch._C.DisableTorchFunction():  # real tensors, even inside a trace
                why = _checked(ops, _loaded, "bfloat16")
        _bf16_verdicts[_loaded] = why
    return _bf16_verdicts[_loaded]


# as _loaded_status: a constant to torch.compile (status() above it stays the guard)
_bf16_verdict._dynamo_marked_constant = True  # type: ignore[attr-defined]
