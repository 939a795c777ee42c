"""``attnlab export``: a thin parser over :func:`attnlab.deploy.export_onnx` (and its INT8 step).

    attnlab export --pretrained minilm --format onnx --out minilm-onnx
    attnlab export runs/lm --format onnx --out lm-onnx --int8
    attnlab export CHECKPOINT --format onnx --out DIR --force
"""

from __future__ import annotations

import argparse

__all__ = ["add_export_parser", "run_export"]


def run_export(args: argparse.Namespace) -> int:
    """Export the model in ``args``, verify it with ONNX Runtime, optionally add INT8 graphs; print what was written."""
    from .export import export_onnx
    from .quantize import quantize_onnx

    if (args.model is None) == (args.pretrained is None):
        raise ValueError("give MODEL (a checkpoint or run directory) or --pretrained minilm, not both")
    report = export_onnx(args.pretrained or args.model, args.out, force=args.force, tolerance=args.tolerance)
    print(report.summary())
    if args.int8:
        for name, path in report.files.items():
            dst = quantize_onnx(path, path.with_name(f"{name}.int8.onnx"))
            print(f"{dst} ({dst.stat().st_size / 1e6:.1f} MB): dynamic INT8 (onnxruntime.quantization)")
    return 0


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``export`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "export", help="export a model to ONNX, verified with ONNX Runtime on held-out inputs",
        description="Export MODEL (a save_pretrained/checkpoint directory or a run directory of 'attnlab train', or "
                    "--pretrained minilm) with dynamic batch and sequence axes; a CausalLM gets prefill and decode "
                    "graphs with the KV cache as inputs and outputs, an EncoderDecoder an encoder and a decoder step. "
                    "Every graph is run in ONNX Runtime at once and must equal eager within --tolerance.")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL", help="checkpoint or run directory")
    p.add_argument("--pretrained", choices=["minilm"], default=None, help="export all-MiniLM-L6-v2")
    p.add_argument("--format", choices=["onnx"], default="onnx", help="output format (onnx)")
    p.add_argument("--out", required=True, help="output directory (must be empty or absent unless --force)")
    p.add_argument("--force", action="store_true", help="replace the contents of a non-empty --out")
    p.add_argument("--int8", action="store_true", help="also write dynamic-INT8 graphs (NAME.int8.onnx)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest max-abs difference of ONNX Runtime to eager allowed (default 1e-4)")
    p.set_defaults(func=run_export)
    return p
