"""INT8 and bf16 of a model, each to be measured before it is chosen.

* :func:`quantize_onnx` - dynamic INT8 of an exported graph with ONNX Runtime
  (``onnxruntime.quantization.quantize_dynamic``): the weights of MatMul/Gemm are stored
  as int8 with one scale per output channel, activations are quantized per call from
  their observed range (no calibration data); attention's own products (``q k^T``,
  ``weights v``, two activations) stay float32. Per-channel scales are the default
  because per-tensor ones cost MiniLM too much: on 96 review sentences, mean cosine to
  fp32 0.951 (min 0.847, Spearman 0.948) per tensor against 0.9905 (min 0.975, Spearman
  0.991) per channel, at about the same speed.
* :func:`quantize_eager_int8` - INT8 of the eager model with torchao's
  int8-dynamic-activation / int8-weight config on every ``nn.Linear`` (torch.ao's
  ``quantize_dynamic`` is deprecated in favour of torchao). Attention itself stays in
  float32.
* :func:`native_cpu_bf16` / :func:`bf16_choice` - bf16 inference on the CPU only where
  the CPU computes bf16 natively (AMX or AVX512-BF16) *and* a measured forward is
  faster than float32, as the trainer decides for training
  (:mod:`attnlab.train.precision`).

Quality is not assumed either: ``attnlab bench deploy`` reports the cosine and rank
agreement of each variant with float32 (:mod:`attnlab.bench.deploy`).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .deps import require

__all__ = ["bf16_choice", "native_cpu_bf16", "quantize_eager_int8", "quantize_onnx"]


def quantize_onnx(src: str | Path, dst: str | Path, *, per_channel: bool = True) -> Path:
    """Write the dynamic-INT8 version of the ONNX graph ``src`` to ``dst``.

    Args:
        src: an ``.onnx`` file (from :func:`attnlab.deploy.export_onnx`).
        dst: the output ``.onnx`` file.
        per_channel: one weight scale per output channel (default) instead of per tensor.

    Raises:
        ValueError: when ``src`` is missing or ``dst`` equals it.
        ImportError: when onnxruntime is missing (with the pip line).
    """
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ValueError(f"src must be an .onnx file, not found: {src}")
    if src.resolve() == dst.resolve():
        raise ValueError(f"dst must differ from src, got {dst} for both")
    require("onnxruntime", "INT8 quantization of an ONNX graph")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst.parent.mkdir(parents=True, exist_ok=True)
    # MatMulConstBOnly: only products with a weight; the activation x activation ones of attention stay float
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                     extra_options={"MatMulConstBOnly": True})
    return dst


def _int8_config():
    """torchao's int8 dynamic-activation / int8-weight config, under its current or its older name."""
    require("torchao", "INT8 of the eager model")
    import torchao.quantization as tq

    if hasattr(tq, "Int8DynamicActivationInt8WeightConfig"):
        return tq.Int8DynamicActivationInt8WeightConfig()
    return tq.int8_dynamic_activation_int8_weight()  # torchao < 0.9


def quantize_eager_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` layers run int8 dynamic activations and int8 weights (torchao).

    The copy is for inference (eval mode, CPU, float32 elsewhere); ``model`` is unchanged.

    Raises:
        ValueError: when ``model`` has no ``nn.Linear`` layer.
        ImportError: when torchao is missing (with the pip line).
    """
    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ValueError(f"model must have nn.Linear layers to quantize, {type(model).__name__} has none")
    config = _int8_config()
    from torchao.quantization import quantize_

    q = copy.deepcopy(model).eval().float().cpu()
    quantize_(q, config)
    return q


def native_cpu_bf16() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively (AMX-BF16 or AVX512-BF16), and the sentence saying so.

    Read from the CPU flags (``/proc/cpuinfo``); without native support bf16 matmuls are
    emulated through float32 and run several times slower.
    """
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return False, "cannot read /proc/cpuinfo to find the CPU's bf16 support; bf16 not chosen"
    native = sorted(flags & {"amx_bf16", "avx512_bf16"})
    cap = torch.backends.cpu.get_cpu_capability()
    if native:
        return True, f"this CPU computes bf16 natively ({', '.join(native)}; torch capability {cap})"
    return False, f"this CPU has no native bf16 (no amx_bf16 or avx512_bf16 flag; torch capability {cap})"


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.no_grad()
def bf16_choice(model: nn.Module, inputs: Callable[[nn.Module], object], *,
                repeats: int = 3) -> tuple[nn.Module | None, str]:
    """A bf16 copy of ``model`` if this CPU has native bf16 and a measured forward is at least 10% faster.

    Args:
        model: a float32 eval-mode model.
        inputs: runs one forward of the model it is given (the timed step).
        repeats: timed repeats of each precision (best taken), after one warm-up.

    Returns:
        ``(bf16 model or None, the sentence with the detection and the measurement)``.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    native, why = native_cpu_bf16()
    if not native:
        return None, why
    low = copy.deepcopy(model).to(torch.bfloat16).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs(model), inputs(low)  # warm up both
        t32, t16 = _best_seconds(lambda: inputs(model), repeats), _best_seconds(lambda: inputs(low), repeats)
    faster = t16 < 0.9 * t32
    text = f"{why}; measured a forward: fp32 {t32 * 1e3:.1f} ms, bf16 {t16 * 1e3:.1f} ms -> {'bf16' if faster else 'fp32'}"
    return (low if faster else None), text
