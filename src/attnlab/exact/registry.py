"""The registry of exact attention backends.

A backend computes exactly ``softmax(q k^T * scale + bias, masked) v`` (the function
the ``math`` backend spells out). It has a ``name``, a ``supports(call)`` that
returns ``None`` or the reason in words why it cannot serve a call, an
``estimate(call)`` of its relative cost that ``backend="auto"`` minimizes, a
``note(call)`` with what a caller should know when it serves (compile cost, a slow
fallback kernel), and a ``forward(call)`` returning ``(out, weights_or_None)``. New
backends enroll with the class decorator :func:`register_backend` and appear in dispatch, ``attnlab info`` and the
conformance grid (``tests/test_conformance.py``: every backend x mask kind x dtype
against the float64 reference). The registry is an :class:`attnlab.registry.Registry`:
``REGISTRY.why_not(name, call)`` is the backend's :meth:`Backend.verdict`.
"""

from __future__ import annotations

from torch import Tensor

from ..registry import Registry
from .call import AttentionCall


class Backend:
    """Base class of exact attention backends."""

    name: str = ""
    #: one line for ``attnlab info``
    summary: str = ""
    #: whether ``auto`` may choose it (the reference oracle opts out)
    in_auto: bool = True

    def available(self) -> str | None:
        """None when this backend can run in this environment at all, else why not."""
        return None

    def supports(self, call: AttentionCall) -> str | None:
        """None when this backend computes ``call`` exactly, else the reason in words."""
        raise NotImplementedError

    def estimate(self, call: AttentionCall) -> float:
        """Relative cost (arbitrary units, comparable across backends) for ``auto``."""
        raise NotImplementedError

    def note(self, call: AttentionCall) -> str | None:
        """What ``explain`` adds when this backend serves ``call`` (compile cost, fallbacks), or None."""
        return None

    def forward(self, call: AttentionCall) -> tuple[Tensor, Tensor | None]:
        """Compute the attention output ``(B, H, N, Dv)`` and, if asked and able, weights."""
        raise NotImplementedError

    def verdict(self, call: AttentionCall) -> str | None:
        """``available()`` then ``supports()``: None when the call can be served."""
        why = self.available()
        if why is not None:
            return why
        return self.supports(call)


#: every registered backend (instances), by name; ``why_not(name, call)`` asks ``verdict(call)``
REGISTRY: Registry[Backend] = Registry("backend", check=lambda backend, call: backend.verdict(call), base=Backend,
                                       instance=True)

#: class decorator: enroll one instance of a :class:`Backend` subclass under ``cls.name``
#: (:meth:`attnlab.registry.Registry.register`; an entry of that name is replaced)
register_backend = REGISTRY.register


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``."""
    if name not in REGISTRY:
        raise ValueError(f"backend must be 'auto' or one of {sorted(REGISTRY.names())}, got {name!r}")
    return REGISTRY.get(name)


def backends() -> dict[str, Backend]:
    """All registered backends by name, in registration order."""
    return REGISTRY.entries()
