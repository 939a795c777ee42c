"""The ``flex`` backend: ``torch.nn.attention.flex_attention`` (FlexAttention).

The mask becomes FlexAttention's ``mask_mod`` and ``BlockMask`` (the mask's own
``allows``), a bias tensor or function its ``score_mod``. Where it runs: CUDA
(forward and backward) and, on PyTorch builds that support it, CPU forward only (its
backward is not implemented there). No dropout, no weights. Computes the function of
the ``math`` backend; fully masked rows give zeros.

Compilation. The kernel is ``torch.compile(flex_attention, fullgraph=True)``: a graph
break (which would run the unfused, O(N·M) eager path) raises instead of degrading
silently.

* On CPU it compiles once per shape (``dynamic=False``). torch 2.13's CPU template
  breaks under dynamic shapes: after the first masked shape of a process, the C++ it
  generates for a second one uses undeclared variables (``cur_qSplitSize1``) and
  fails to compile. Static shapes compile every shape on its own (about 2.5 s each
  on a 2-core CPU once inductor's cache is warm).
* On CUDA torch decides (``dynamic=None``): without a mask or bias the second length
  recompiles with dynamic shapes and later lengths reuse it; a mask or bias function
  reads the lengths as Python integers, so each new ``(N, M)`` with a mask compiles once.

The oracle's contract is that a backend ``explain`` accepts returns the right answer,
so the backend keeps a record of the compiled signatures (:func:`signature`: device,
dtype, shapes, mask structure, bias kind). A call whose signature is new once
:data:`RECOMPILE_LIMIT` signatures have been compiled in this process is refused in
``supports()`` (with that reason), and a compile that fails anyway is answered by the
``chunked`` backend (the same function), with a warning, and its signature refused from
then on with the compiler's reason. ``auto``'s estimate adds the compile time
(:data:`COMPILE_SECONDS`) for a signature not compiled yet. Block masks are cached per
(mask, shape, device) (:data:`BLOCK_MASK_CACHE` entries), so a model that passes the
same mask every step builds its ``BlockMask`` once.
"""

from __future__ import annotations

import functools
import warnings
from collections import OrderedDict

import torch
from torch import Tensor

from ..masks import Mask
from .call import AttentionCall
from .registry import Backend, register_backend

#: compiled signatures of the FlexAttention kernel per process; a new one past this is refused in supports()
RECOMPILE_LIMIT = 128
#: seconds one compile of a new signature takes, for auto's estimate (2.5-3 s measured on a 2-core CPU with a
#: warm inductor cache, 15 s cold; about 1 s on CUDA)
COMPILE_SECONDS = {"cpu": 3.0, "cuda": 1.0}
#: block masks kept (least recently used dropped first)
BLOCK_MASK_CACHE = 32
#: FlexAttention's CUDA kernels tile the head dim in steps of 16
MIN_CUDA_HEAD_DIM = 16
#: captured tensors that require grad (T5's learned bias table) get gradients from this torch on
GRAD_BIAS_TORCH = (2, 6)


@functools.lru_cache(maxsize=1)
def _flex_api():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:  # pragma: no cover - depends on the torch build
        return None, f"this torch ({torch.__version__}) has no FlexAttention: {e}"
    return (flex_attention, create_block_mask), None


@functools.lru_cache(maxsize=2)
def _compiled(static: bool):
    """The compiled kernel: ``static`` compiles once per shape (``dynamic=False``), else torch's automatic dynamism."""
    api, _ = _flex_api()
    return torch.compile(api[0], dynamic=False if static else None, fullgraph=True)


def torch_version() -> tuple[int, int]:
    """``(major, minor)`` of the running torch."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def captures_grad(fn) -> bool:
    """True when a bias function closes over a tensor or module that requires grad.

    Looks at the closure cells, a bound method's ``self`` and a ``functools.partial``'s
    arguments (T5's ``bias_fn`` closes over its module, whose table is learned).
    """
    seen = []
    if isinstance(fn, functools.partial):
        seen += [fn.func, *fn.args, *fn.keywords.values()]
        fn = fn.func
    seen += [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _cell_set(c)]
    if getattr(fn, "__self__", None) is not None:
        seen.append(fn.__self__)
    for obj in seen:
        if isinstance(obj, Tensor) and obj.requires_grad:
            return True
        if isinstance(obj, torch.nn.Module) and any(p.requires_grad for p in obj.parameters()):
            return True
    return False


def _cell_set(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises ValueError on an empty cell
    except ValueError:
        return False
    return True


# -- block-mask cache -----------------------------------------------------------------
_block_masks: OrderedDict[tuple, object] = OrderedDict()


def mask_key(mask: Mask) -> tuple:
    """A key equal for structurally equal masks: class, plain attributes, tensors by identity and version.

    Tensor attributes count by identity (and in-place version), so two ``padding``
    masks built from different tensors are different keys even with equal lengths;
    the cache holds each key's mask, so an identity is never reused while cached.
    """
    parts: list = [type(mask).__qualname__]
    for name, val in sorted(vars(mask).items()):
        if isinstance(val, Mask):
            parts.append((name, mask_key(val)))
        elif isinstance(val, Tensor):
            parts.append((name, "tensor", id(val), _version(val), str(val.device)))
        elif isinstance(val, (int, float, str, bool, type(None))):
            parts.append((name, val))
        else:
            parts.append((name, "object", id(val)))
    return tuple(parts)


def _version(t: Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter (and cannot be modified in place)
        return -1


def block_mask_for(call: AttentionCall):
    """The FlexAttention ``BlockMask`` of ``call.mask`` (None without a mask), cached."""
    if call.mask is None:
        return None
    m = call.mask
    n_q, n_k = call.N, call.M
    bm_b = call.B if "b" in m.depends else None
    bm_h = call.H if "h" in m.depends else None
    key = (mask_key(m), bm_b, bm_h, n_q, n_k, str(call.device))
    hit = _block_masks.get(key)
    if hit is not None:
        _block_masks.move_to_end(key)
        return hit[1]
    (_, create_block_mask), _ = _flex_api()

    def mask_mod(b, h, q_idx, kv_idx):
        return m.allows(b, h, q_idx, kv_idx, n_q, n_k)

    block_mask = create_block_mask(mask_mod, bm_b, bm_h, n_q, n_k, device=call.device)
    _block_masks[key] = (m, block_mask)  # the mask kept alive: its tensors' ids stay unique
    while len(_block_masks) > BLOCK_MASK_CACHE:
        _block_masks.popitem(last=False)
    return block_mask


def clear_block_masks() -> None:
    """Forget every cached block mask."""
    _block_masks.clear()


# -- compiled signatures ----------------------------------------------------------------
#: signatures compiled in this process (insertion order) and those whose compile failed, with the reason
_compiled_signatures: OrderedDict[tuple, None] = OrderedDict()
_failed_signatures: dict[tuple, str] = {}


def _structure(mask: Mask | None) -> tuple:
    """What of a mask decides the compiled code: its classes and plain attributes, tensors by shape."""
    if mask is None:
        return ()
    parts: list = [type(mask).__qualname__]
    for name, val in sorted(vars(mask).items()):
        if isinstance(val, Mask):
            parts.append((name, _structure(val)))
        elif isinstance(val, Tensor):
            parts.append((name, tuple(val.shape), str(val.dtype)))
        elif isinstance(val, (int, float, str, bool, type(None))):
            parts.append((name, val))
    return tuple(parts)


def signature(call: AttentionCall) -> tuple:
    """What makes the kernel compile anew: device, dtype, q/k/v shapes, mask structure and bias kind."""
    bias = None if call.bias is None else ("tensor", tuple(call.bias.shape), str(call.bias.dtype))
    bias_fn = None if call.bias_fn is None else ("fn", getattr(call.bias_fn, "__qualname__", type(call.bias_fn).__name__))
    return (call.device.type, str(call.dtype), tuple(call.q.shape), tuple(call.k.shape), tuple(call.v.shape),
            _structure(call.mask), bias, bias_fn, call.scale)


def forget_compiled() -> None:
    """Forget the record of compiled and failed signatures (after ``torch._dynamo.reset()``)."""
    _compiled_signatures.clear()
    _failed_signatures.clear()


def _score_mod(call: AttentionCall):
    if not call.has_bias():
        return None
    bias_t, bias_fn = call.bias, call.bias_fn

    def score_mod(score, b, h, q_idx, kv_idx):
        if bias_t is not None:
            bb = bias_t[
                b if bias_t.shape[0] != 1 else 0,
                h if bias_t.shape[1] != 1 else 0,
                q_idx if bias_t.shape[2] != 1 else 0,
                kv_idx if bias_t.shape[3] != 1 else 0,
            ]
            score = score + bb
        if bias_fn is not None:
            score = score + bias_fn(b, h, q_idx, kv_idx)
        return score

    return score_mod


def _limit_settings() -> tuple[str, dict, type[BaseException]]:
    """The recompile-limit setting's name, the config patch and the exception raised when it is hit."""
    import torch._dynamo

    cfg, exc = torch._dynamo.config, torch._dynamo.exc
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # renamed in torch 2.6
    patch = {name: RECOMPILE_LIMIT}
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        patch["fail_on_recompile_limit_hit"] = True  # fullgraph=True raises as well
    return name, patch, getattr(exc, "FailOnRecompileLimitHit", exc.RecompileError)


def run_compiled(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with this kernel's recompile limit; hitting it raises RuntimeError naming it."""
    import torch._dynamo

    name, patch, limit_hit = _limit_settings()
    try:
        with torch._dynamo.config.patch(**patch):
            return fn(*args, **kwargs)
    except limit_hit as e:
        raise RuntimeError(
            f"FlexAttention hit torch._dynamo.config.{name} ({RECOMPILE_LIMIT} compiled variants, "
            "raised for this kernel by attnlab.exact.flex.RECOMPILE_LIMIT): every new (N, M) with a mask "
            "or bias compiles once. Pad lengths to a few buckets, raise the limit, or use backend='chunked' "
            "or 'sdpa' (attnlab does not fall back to the unfused kernel)"
        ) from e


@register_backend
class FlexBackend(Backend):
    """The ``flex`` backend: PyTorch's FlexAttention, compiled per mask (CUDA; forward only on CPU)."""

    name = "flex"
    summary = "torch FlexAttention, compiled (CUDA; CPU forward only)"

    def available(self) -> str | None:
        return _flex_api()[1]

    def supports(self, call: AttentionCall) -> str | None:
        if call.return_weights:
            return "does not return the weights (return_weights=True needs 'math')"
        if call.dropout_p > 0:
            return "FlexAttention has no dropout"
        if call.device.type == "cpu" and call.needs_grad:
            return "FlexAttention on cpu runs forward only (its backward is not implemented on cpu)"
        if call.device.type not in ("cpu", "cuda"):
            return f"FlexAttention does not run on {call.device.type}"
        if call.dtype == torch.float64:
            return "FlexAttention's compiled kernels do not take float64"
        if call.N < 16 or call.M < 16:
            return f"FlexAttention's compiled kernels need at least 16 queries and keys (N={call.N}, M={call.M})"
        if call.device.type == "cuda":
            why = self._cuda_reason(call)
            if why is not None:
                return why
        return self._signature_reason(signature(call))

    @staticmethod
    def _signature_reason(sig: tuple) -> str | None:
        if sig in _failed_signatures:
            return f"FlexAttention failed to compile this shape earlier in this process ({_failed_signatures[sig]})"
        if sig not in _compiled_signatures and len(_compiled_signatures) >= RECOMPILE_LIMIT:
            return (f"FlexAttention compiled {RECOMPILE_LIMIT} shapes in this process "
                    "(attnlab.exact.flex.RECOMPILE_LIMIT); pad lengths to a few buckets or use another backend")
        return None

    def _cuda_reason(self, call: AttentionCall) -> str | None:
        if min(call.D, call.Dv) < MIN_CUDA_HEAD_DIM:
            return (f"FlexAttention's CUDA kernels need head dims >= {MIN_CUDA_HEAD_DIM}, "
                    f"got D={call.D}, Dv={call.Dv}")
        if call.needs_grad and torch_version() < GRAD_BIAS_TORCH:
            grad_bias = (call.bias is not None and call.bias.requires_grad) or (
                call.bias_fn is not None and captures_grad(call.bias_fn))
            if grad_bias:
                need = ".".join(map(str, GRAD_BIAS_TORCH))
                return (f"FlexAttention in torch {torch.__version__} has no gradient for a learned bias "
                        f"(T5 relative bias, a bias tensor that requires grad); needs torch >= {need}")
        return None

    def estimate(self, call: AttentionCall) -> float:
        from .calibration import DEFAULT_SECONDS_PER_UNIT
        from .chunked import plan_tiles

        frac = 1.0 if call.mask is None else max(plan_tiles(call, 128, 128).computed_fraction, 1e-3)
        # compiled, the CPU template ran at 0.8-1.8x SDPA's time on the tiles it computes (N = 1K-4K, fp32,
        # forward; scripts/flex_cpu_speed.py); on CUDA about 1.5x faster than the dense flops suggest
        work = call.flops() * frac * (1.3 if call.device.type == "cpu" else 1 / 1.5)
        if signature(call) not in _compiled_signatures:  # the first call of a shape pays its compile
            work += COMPILE_SECONDS.get(call.device.type, 3.0) / DEFAULT_SECONDS_PER_UNIT
        return work

    def note(self, call: AttentionCall) -> str | None:
        if call.device.type == "cpu":
            when = "for each new shape (static shapes on CPU)"
        else:
            when = ("for each new (N, M)" if (call.mask is not None or call.has_bias())
                    else "on first use and once more, with dynamic shapes, at a second length")
        cost = "tens of seconds on a CPU" if call.device.type == "cpu" else "seconds"
        return (f"compiles with torch.compile {when} ({cost}); repeated shapes reuse it; "
                f"refuses new shapes after {RECOMPILE_LIMIT} compiled ones instead of running unfused")

    def forward(self, call: AttentionCall):
        import torch._dynamo.exc

        sig = signature(call)
        try:
            out = run_compiled(
                _compiled(call.device.type == "cpu"), call.q, call.k, call.v, score_mod=_score_mod(call),
                block_mask=block_mask_for(call), scale=call.scale, enable_gqa=call.G > 1,
            )  # (B, H, N, Dv)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # inductor's C++/Triton compile failed
            why = str(e).strip().splitlines()[0][:200]
            _failed_signatures[sig] = why
            warnings.warn(f"FlexAttention failed to compile this shape ({why}); the chunked backend computed the "
                          "call instead, and flex refuses this shape from now on", RuntimeWarning, stacklevel=3)
            from .registry import get_backend

            return get_backend("chunked").forward(call)
        _compiled_signatures[sig] = None
        return out, None
