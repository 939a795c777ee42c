"""The optional packages of :mod:`attnlab.deploy`, imported when first needed.

``onnx``, ``onnxruntime``, ``onnxscript`` (the exporter's ONNX builder) and ``torchao``
are the ``deploy`` extra (``pip install "attnlab[deploy]"``); importing attnlab never
imports them. :func:`require` imports one and, when it is missing, raises an
ImportError that names the ``pip install`` line fixing it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["PIP", "require"]

#: module -> the requirement that provides it (the versions of the ``deploy`` extra)
PIP = {
    "onnx": "onnx>=1.16",
    "onnxruntime": "onnxruntime>=1.18",
    "onnxscript": "onnxscript>=0.3",
    "torchao": "torchao>=0.10",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (a key of :data:`PIP`) or raise ImportError with the pip line.

    Args:
        module: ``"onnx"``, ``"onnxruntime"``, ``"onnxscript"`` or ``"torchao"``.
        purpose: what needs it, for the message ("ONNX export", "INT8 of the eager model").
    """
    if module not in PIP:
        raise ValueError(f"module must be one of {sorted(PIP)}, got {module!r}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{purpose} needs {module}, which is not installed; run: pip install '{PIP[module]}' "
            f"(or pip install 'attnlab[deploy]' for every deploy dependency)"
        ) from e
