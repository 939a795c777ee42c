"""Deployment: ONNX export verified with ONNX Runtime, INT8 and bf16 measured.

* :func:`export_onnx` - trace a model (MiniLM, Bert, CausalLM prefill + decode step,
  EncoderDecoder encoder + decoder step, classifier, ViT) with dynamic batch and
  sequence axes, write ``.onnx`` graphs and check each with ONNX Runtime on held-out
  inputs (:mod:`attnlab.deploy.export`, :mod:`attnlab.deploy.graphs`).
* :func:`quantize_onnx` (ONNX Runtime dynamic INT8), :func:`quantize_eager_int8`
  (torchao int8 dynamic activations and weights), :func:`bf16_choice` (bf16 eager
  where this CPU computes it natively) in :mod:`attnlab.deploy.quantize`.

The heavy packages (onnx, onnxruntime, onnxscript, torchao) are the ``deploy`` extra,
imported only when a function needs them (:mod:`attnlab.deploy.deps`).
"""

from .export import NOT_EXPORTABLE, ExportReport, check_out_dir, export_onnx, exportable, load_model
from .graphs import Check, kinds
from .quantize import bf16_choice, native_cpu_bf16, quantize_eager_int8, quantize_onnx
from .verify import ExportMismatchError, session, verify_export

__all__ = ["NOT_EXPORTABLE", "Check", "ExportMismatchError", "ExportReport", "bf16_choice", "check_out_dir",
           "export_onnx", "exportable", "kinds", "load_model", "native_cpu_bf16", "quantize_eager_int8", "quantize_onnx",
           "session", "verify_export"]
