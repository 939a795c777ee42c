"""ONNX export of attnlab models, verified at once with ONNX Runtime.

:func:`export_onnx` traces each graph of the model's kind (:mod:`attnlab.deploy.graphs`)
with ``torch.export`` (dynamo, strict) and dynamic batch and sequence axes, converts it
with ``torch.onnx.export(..., dynamo=True)``, writes ``DIR/NAME.onnx`` and
``DIR/export.json``, and runs every graph in ONNX Runtime on held-out inputs
(:mod:`attnlab.deploy.verify`). A difference to the eager model above the tolerance
(1e-4 max abs in float32) raises :class:`ExportMismatchError` with the measured numbers.

How attention exports. Exact attention is traced through the ``math`` backend: the
mask (causal, key padding, sliding window, ...) is materialized as a boolean ``(B|1,
1, N, M)`` tensor from index comparisons, then ``masked_fill``, ``softmax`` and two
matmuls, all plain ONNX ops. The other exact backends cannot be traced with dynamic
shapes: ``sdpa`` decides how to treat fully masked rows by reading ``row_any.all()``
(a data-dependent branch ``torch.export`` refuses), ``chunked`` and ``flex`` plan
their tiles from the concrete lengths, and ``auto`` chooses by the lengths. So for the
trace every :class:`~attnlab.mechanisms.Exact` layer is switched to ``math`` and back
afterwards; the numbers are those of the model's own backend within float rounding,
which the verification measures. Approximate mechanisms export when they trace; those
that cannot (:data:`NOT_EXPORTABLE`) are refused up front with the reason.

Time: one ``torch.export`` trace, ONNX conversion and a few held-out runs per graph
(seconds for tiny models, about a minute for MiniLM on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..mechanisms import Exact, Mechanism
from ..models import Bert, from_pretrained
from ..positional import SinusoidalPositional
from ..train.checkpoint import resolve_checkpoint
from .deps import require
from .graphs import Check, kind_of
from .verify import ExportMismatchError, verify_export

__all__ = ["NOT_EXPORTABLE", "ExportMismatchError", "ExportReport", "MANIFEST", "check_out_dir", "export_onnx",
           "exportable", "load_model"]

#: the manifest written beside the graphs
MANIFEST = "export.json"
#: default tolerance of the ONNX Runtime check (max abs difference, float32)
TOLERANCE = 1e-4

#: what tracing each mechanism measured (tiny classifier / CausalLM, torch 2.13, onnxscript 0.7):
#: exact (every positional kind, grouped-query heads), bidirectional linear and nystrom export and
#: match eager; these do not, and :func:`export_onnx` names them in its error
NOT_EXPORTABLE: dict[str, str] = {
    "reformer": "its LSH bucketing builds Python objects from the hashed keys while tracing",
    "bigbird": "its random block pattern is drawn as a Python object while tracing",
    "longformer": "its sliding-window tiling fixes the sequence length while tracing",
    "performer": "its random-feature map has an op the ONNX converter cannot translate",
}


@dataclass
class ExportReport:
    """What :func:`export_onnx` wrote and measured.

    Attributes:
        out: the output directory.
        model_type: the exported model class.
        files: graph name -> ``.onnx`` path.
        checks: every compared output of the held-out runs.
        tolerance: the max abs difference allowed.
    """

    out: Path
    model_type: str
    files: dict[str, Path] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    tolerance: float = TOLERANCE

    @property
    def max_abs(self) -> float:
        """Largest absolute difference of ONNX Runtime to eager over every check."""
        return max((c.max_abs for c in self.checks), default=0.0)

    def summary(self) -> str:
        """One line per graph: file and its largest difference."""
        lines = []
        for name, path in self.files.items():
            worst = max((c.max_abs for c in self.checks if c.graph == name), default=0.0)
            n = sum(c.graph == name for c in self.checks)
            lines.append(f"{path} ({path.stat().st_size / 1e6:.1f} MB): onnxruntime = eager within {worst:.2e} "
                         f"max abs over {n} held-out outputs (tolerance {self.tolerance:g})")
        return "\n".join(lines)


def load_model(source: str | Path) -> nn.Module:
    """``"minilm"`` (all-MiniLM-L6-v2), a ``save_pretrained`` directory, or a run directory (its latest checkpoint).

    Raises:
        ValueError: when ``source`` is none of them.
        ImportError: when the MiniLM weights are requested but not installed (with the pip line).
    """
    if str(source).lower() in ("minilm", "all-minilm-l6-v2"):
        return Bert.from_minilm().eval()
    d = Path(source)
    if not d.is_dir():
        raise ValueError(f"model must be 'minilm', a directory written by save_pretrained or a run directory of "
                         f"'attnlab train', not found: {d}")
    if not (d / "config.json").is_file():
        d = resolve_checkpoint(d)
    return from_pretrained(d).eval()


def check_out_dir(out: str | Path, force: bool) -> Path:
    """``out`` as a Path, refusing an existing non-empty directory unless ``force`` (which empties it).

    Raises:
        ValueError: when ``out`` is a file, or a non-empty directory and ``force`` is False.
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out must be a directory, got the file {path}")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise ValueError(f"out directory {path} exists and is not empty; pass --force (force=True) to overwrite it")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_mechanisms(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, Mechanism) and module.name in NOT_EXPORTABLE:
            raise ValueError(f"mechanism {module.name!r} cannot be exported to ONNX: {NOT_EXPORTABLE[module.name]}; "
                             f"export a model with exact attention (or linear, nystrom)")


def _not_traced(model: nn.Module, graph: str, step: str, e: BaseException) -> ValueError:
    """The one-line error of a graph that did not trace or convert, naming the model's mechanisms."""
    mechs = sorted({m.name for m in model.modules() if isinstance(m, Mechanism)})
    other = [m for m in mechs if m != "exact"]
    who = f"mechanism {other[0]!r}" if len(other) == 1 else f"mechanisms {mechs}"
    return ValueError(f"{who} of {type(model).__name__} could not be exported to ONNX ({step} of the {graph} graph "
                      f"failed: {_first_line(e)})")


def _max_positions(model: nn.Module) -> int:
    cfg = model.config
    return int(getattr(cfg, "max_len", None) or 512)


@contextlib.contextmanager
def exportable(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, ``model`` is traceable with dynamic lengths.

    Every exact-attention layer runs the ``math`` backend, and every sinusoidal table
    is grown to the model's ``max_len`` first: the table grows by doubling to a size
    computed from the length (``bit_length``), a branch on the length that would fix it
    at the traced value, so the graph holds the ``max_len`` rows as a constant instead.
    """
    for module in model.modules():
        if isinstance(module, SinusoidalPositional):
            module.table(_max_positions(model))
    swapped = []
    for module in model.modules():
        if isinstance(module, Exact) and module.backend != "math":
            swapped.append((module, module.backend))
            module.backend = "math"
    try:
        yield model
    finally:
        for module, backend in swapped:
            module.backend = backend


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return next((line for line in text if line.strip()), type(e).__name__)


def export_onnx(model: nn.Module | str | Path, out: str | Path, *, force: bool = False,
                tolerance: float = TOLERANCE, opset: int | None = None, seed: int = 0) -> ExportReport:
    """Export ``model`` to ONNX in ``out`` and verify every graph with ONNX Runtime.

    Args:
        model: an attnlab model (Bert, CausalLM, EncoderDecoder, SequenceClassifier, ViT),
            or what :func:`load_model` accepts (``"minilm"``, a checkpoint or run directory).
        out: output directory (created); must be empty or absent unless ``force``.
        force: replace the contents of a non-empty ``out``.
        tolerance: largest absolute difference (float32) of ONNX Runtime to eager allowed.
        opset: ONNX opset (default: the exporter's).
        seed: seed of the held-out inputs.

    Returns:
        An :class:`ExportReport` (also written to ``out/export.json``).

    Raises:
        ValueError: for a non-empty ``out`` without ``force``, a model class with no
            export, or a mechanism ONNX cannot express (naming it).
        ExportMismatchError: (a ValueError) when ONNX Runtime differs from eager by more
            than ``tolerance``, with the measured differences.
        ImportError: when onnx, onnxscript or onnxruntime is missing (with the pip line).
    """
    if not isinstance(tolerance, (int, float)) or not tolerance > 0:
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module, "ONNX export")
    path = check_out_dir(out, force)
    if isinstance(model, (str, Path)):
        model = load_model(model)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an attnlab model or a path, got {type(model).__name__}")
    kind = kind_of(model)
    _check_mechanisms(model)
    model = model.eval().float().cpu()
    report = ExportReport(path, type(model).__name__, tolerance=float(tolerance))
    with exportable(model), torch.no_grad():
        for g in kind.graphs(model):
            try:
                ep = torch.export.export(g.module.eval(), g.example, dynamic_shapes=_by_argument(g),
                                         strict=True)
            except Exception as e:  # torch.export raises many classes; one line names the mechanism and graph
                raise _not_traced(model, g.name, "torch.export", e) from e
            try:
                program = torch.onnx.export(ep, (), input_names=list(g.inputs), output_names=list(g.outputs),
                                            dynamo=True, opset_version=opset, verbose=False)
            except Exception as e:
                raise _not_traced(model, g.name, "ONNX conversion", e) from e
            file = path / f"{g.name}.onnx"
            program.save(str(file))
            report.files[g.name] = file
    report.checks = verify_export(model, kind, report.files, seed=seed)
    _write_manifest(model, report)
    if report.max_abs > tolerance:
        raise ExportMismatchError(report.checks, tolerance, path)
    return report


def _by_argument(g) -> dict:
    """``dynamic_shapes`` keyed as ``torch.export`` wants: by argument name, a ``*past`` tuple as one entry."""
    code = g.module.forward.__code__
    fixed = code.co_argcount - 1  # named tensor arguments after self
    shapes = list(g.dynamic_shapes)
    if len(shapes) == fixed:
        return dict(zip(code.co_varnames[1:1 + fixed], shapes))
    star = code.co_varnames[code.co_argcount]  # the *past argument
    return {**dict(zip(code.co_varnames[1:1 + fixed], shapes[:fixed])), star: tuple(shapes[fixed:])}


def _write_manifest(model: nn.Module, report: ExportReport) -> None:
    import onnx
    import onnxruntime

    meta = {
        "format": "attnlab-onnx",
        "model_type": report.model_type,
        "config": model.config.to_dict() if hasattr(model.config, "to_dict") else None,
        "graphs": {name: path.name for name, path in report.files.items()},
        "verification": {"tolerance": report.tolerance, "max_abs": report.max_abs,
                         "checks": [c.to_dict() for c in report.checks]},
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__},
    }
    (report.out / MANIFEST).write_text(json.dumps(meta, indent=2))
