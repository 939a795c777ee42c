"""Renamed arguments that keep working for one release, with a ``DeprecationWarning``.

A renamed keyword is accepted under its old spelling for one release: the call runs
exactly as if the new name had been given, after a ``DeprecationWarning`` that names the
new spelling. The warning is attributed to the first frame outside attnlab and torch
(so ``layer(x, need_weights=True)`` points at that line, not at ``nn.Module.__call__``),
and ``python -W error::DeprecationWarning`` stops at the caller that needs the change.

This lives in :mod:`attnlab.layers`, the lowest package with renamed arguments; models,
tasks and train import it from here.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["renamed_keywords", "warn_deprecated"]

F = TypeVar("F", bound=Callable[..., Any])

# Frames from these directories are skipped when attributing a warning to its caller.
_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # attnlab/
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,  # torch/ (Module.__call__, checkpoint)
)


def warn_deprecated(message: str) -> None:
    """Issue ``DeprecationWarning(message)`` attributed to the first caller outside attnlab and torch."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level if frame is not None else 2)


def _where(fn: Callable) -> str:
    """``MultiHeadAttention`` for a constructor, ``Encoder.forward`` for a method."""
    name = fn.__qualname__
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Decorator: accept the old keyword of each ``old="new"`` pair for one release.

    A call that passes ``old=`` runs as ``new=`` after a ``DeprecationWarning`` naming
    ``new=``; passing both is a ``TypeError``. The wrapped function keeps its signature
    (``inspect.signature`` shows the new names only).
    """

    def decorate(fn: F) -> F:
        where = _where(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{where}() got both {old}= and {new}=; pass only {new}= ({old}= is deprecated)"
                        )
                    warn_deprecated(
                        f"{where}({old}=...) is deprecated and will be removed in the next release; use {new}= instead"
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
