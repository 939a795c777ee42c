"""Running exported graphs in ONNX Runtime and comparing them with the eager model.

:func:`session` opens one ``.onnx`` file on the CPU; :func:`verify_export` runs each
graph of a kind on its held-out inputs (:meth:`attnlab.deploy.graphs.Kind.check`:
batch sizes and lengths other than the traced ones, padded rows, decoding steps fed
with the graph's own KV presents) and returns every compared output with its largest
absolute difference. :class:`ExportMismatchError` reports the ones above tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .deps import require
from .graphs import Check, Kind

__all__ = ["ExportMismatchError", "session", "verify_export"]


class ExportMismatchError(ValueError):
    """ONNX Runtime's outputs differ from the eager model's by more than the tolerance.

    Attributes:
        checks: the compared outputs over the tolerance, worst first.
        tolerance: the max abs difference allowed.
    """

    def __init__(self, checks: list[Check], tolerance: float, out: Path | None = None):
        self.checks = sorted((c for c in checks if c.max_abs > tolerance), key=lambda c: -c.max_abs)
        self.tolerance = tolerance
        worst = "; ".join(f"{c.graph} {c.output} on {c.case}: {c.max_abs:.3g}" for c in self.checks[:3])
        where = f" (the graphs are left in {out} for inspection)" if out is not None else ""
        super().__init__(f"onnxruntime differs from eager by more than the tolerance {tolerance:g} max abs in "
                         f"{len(self.checks)} outputs, worst: {worst}{where}")


def session(path: str | Path, *, threads: int | None = None):
    """An ``onnxruntime.InferenceSession`` of ``path`` on the CPU (all graph optimizations on).

    Args:
        path: the ``.onnx`` file.
        threads: intra-op threads (default: ONNX Runtime's, one per physical core).
    """
    ort = require("onnxruntime", "running an exported model")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def runner(sess) -> callable:
    """``feeds (name -> tensor) -> outputs (name -> tensor)`` over an ONNX Runtime session."""
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}

    def run(feeds: dict[str, Tensor]) -> dict[str, Tensor]:
        arrays = {k: np.ascontiguousarray(v.detach().cpu().numpy()) for k, v in feeds.items() if k in wanted}
        return {n: torch.from_numpy(a) for n, a in zip(names, sess.run(names, arrays))}

    return run


def verify_export(model: nn.Module, kind: Kind, files: dict[str, Path], *, seed: int = 0) -> list[Check]:
    """Run every exported graph in ONNX Runtime on held-out inputs; the compared outputs with their differences."""
    runs = {name: runner(session(path)) for name, path in files.items()}
    gen = torch.Generator().manual_seed(seed)
    return kind.check(model, lambda name, feeds: runs[name](feeds), gen)
