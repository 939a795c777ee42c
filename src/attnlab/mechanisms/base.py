"""What every attention mechanism is: an ``nn.Module`` mixing values, plus a cost model.

A mechanism maps ``q (B, H, N, D)``, ``k (B, Hkv, M, D)``, ``v (B, Hkv, M, Dv)`` and an
optional mask to ``out (B, H, N, Dv)``. Mechanisms are registered by name (an
:class:`attnlab.registry.Registry` of classes) so that layers, the CLI and the
benchmark can build them from strings (``create("performer", features=256)``), and
the conformance grid (``tests/test_conformance.py``) tests every one of them.

``mech.supports(q, k, v, mask, bias=..., return_weights=...)`` says, like a backend's
``supports``, whether the call can be served: None, or the reason in words that
``forward`` would raise as ValueError. ``why_not(name, q, k, v, mask, settings=...)``
asks the same of a registered name.

A mechanism that learns something beyond q, k and v (adaptive span's per-head spans) has
three hooks, all no-ops by default: :meth:`Mechanism.model_settings` (settings a model
fills in from its own config, such as the head count), :meth:`Mechanism.extra_loss` (a
term the trainer adds to the training loss: :func:`extra_loss` sums it over a model) and
:meth:`Mechanism.log_values` (numbers the trainer writes with each training log record:
:func:`log_values` gathers them over a model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..registry import Registry


@dataclass(frozen=True)
class Cost:
    """Estimated work of one forward call: floating-point operations and bytes of memory
    held at peak beyond the inputs (activations the call allocates)."""

    flops: float
    bytes: float


class Mechanism(nn.Module):
    """Base class. Subclasses set ``name`` and implement ``forward`` and ``cost``."""

    name: str = ""
    #: which masks it accepts, in words, for docs and ``attnlab info`` (:meth:`supports` decides)
    masks_supported: str = ""
    #: True when its output equals exact attention (no approximation)
    exact: bool = False
    #: why a padded batch does not equal its rows run alone (None: it does; the conformance grid checks it)
    padding_variant: str | None = None

    @classmethod
    def exact_settings(cls, n: int) -> dict | None:
        """Settings that make it compute exact attention on sequences of ``n`` (None: no such setting).

        The conformance grid checks that it then equals exact attention.
        """
        return {} if cls.exact else None

    @classmethod
    def test_settings(cls, n: int, head_dim: int) -> dict:
        """Settings for small calls on ``n`` positions of head dim ``head_dim`` (the conformance grid's).

        Override when the constructor needs sizes (Linformer's ``max_len``) or when the
        defaults would make the approximation exact at small ``n``.
        """
        return {}

    def supports(self, q: Tensor, k: Tensor, v: Tensor, mask=None, *, bias=None,
                 return_weights: bool = False) -> str | None:
        """None when ``forward`` with these arguments computes its output, else why not, in words.

        The base class checks what every call must satisfy (shapes, dtypes, the mask's
        indices against N and M: :func:`attnlab.exact.make_call`); subclasses add their
        own limits and keep this in agreement with what ``forward`` raises.
        """
        from ..exact import make_call

        def check() -> None:
            call = make_call(q, k, v, mask=mask, bias=bias)
            if call.mask is not None:
                call.mask.validate(call.N, call.M)  # indices and lengths against this call's N and M

        return reason(check)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, mask=None, *, bias=None, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Mix values: ``(B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv) -> (B, H, N, Dv)``.

        ``return_weights=True`` returns ``(out, weights (B, H, N, M))`` where the
        mechanism has weights, else raises ValueError. ``bias`` is an additive score
        bias for mechanisms that take one (raises ValueError otherwise).
        """
        raise NotImplementedError

    def cost(self, n_queries: int, n_keys: int, head_dim: int, heads: int, batch: int = 1) -> Cost:
        """Estimated FLOPs and bytes of one forward call at these sizes (float32)."""
        raise NotImplementedError

    @classmethod
    def model_settings(cls, heads: int, max_len: int) -> dict:
        """Settings a model fills in from its config (``heads`` per layer, ``max_len`` positions).

        The model's ``mechanism_settings`` override them. Default: none.
        """
        return {}

    def extra_loss(self) -> Tensor | None:
        """A scalar the trainer adds to the training loss (a penalty on the mechanism's own
        parameters), or None (the default): see :func:`extra_loss`."""
        return None

    def log_values(self) -> dict[str, Any]:
        """JSON-able numbers to record with each training log record (default: none): see :func:`log_values`."""
        return {}


def extra_loss(model: nn.Module) -> Tensor | None:
    """The sum of :meth:`Mechanism.extra_loss` over every mechanism in ``model`` (None: no mechanism has one)."""
    terms = [t for m in model.modules() if isinstance(m, Mechanism) for t in [m.extra_loss()] if t is not None]
    return torch.stack(terms).sum() if terms else None


def log_values(model: nn.Module) -> dict[str, list[Any]]:
    """:meth:`Mechanism.log_values` of every mechanism in ``model``, one list per key in module order
    (``{"spans": [layer 0's, layer 1's, ...]}``); empty when none has any."""
    out: dict[str, list[Any]] = {}
    for m in model.modules():
        if isinstance(m, Mechanism):
            for key, value in m.log_values().items():
                out.setdefault(key, []).append(value)
    return out


def reason(check: Callable[..., Any], *args: Any, **kwargs: Any) -> str | None:
    """Run a validating ``check(*args, **kwargs)``: None when it passes, else its ValueError's first line."""
    try:
        check(*args, **kwargs)
    except ValueError as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def _why_not(cls: type[Mechanism], *args: Any, settings: dict | None = None, **kwargs: Any) -> str | None:
    try:
        mech = cls(**(settings or {}))
    except (TypeError, ValueError) as e:
        return f"cannot build {cls.name} with {settings or {}}: {e}"
    return mech.supports(*args, **kwargs)


#: every registered mechanism class, by name
REGISTRY: Registry[type[Mechanism]] = Registry("mechanism", check=_why_not, base=Mechanism)

#: class decorator: enroll a :class:`Mechanism` subclass under ``cls.name``
#: (:meth:`attnlab.registry.Registry.register`)
register_mechanism = REGISTRY.register


def mechanisms() -> dict[str, type[Mechanism]]:
    """Registered mechanism classes by name."""
    return REGISTRY.entries()


def create(name: str, **kwargs) -> Mechanism:
    """Build the mechanism registered as ``name`` with keyword settings.

    Raises:
        ValueError: for an unknown name (listing the known ones) or bad settings.
    """
    return REGISTRY.create(name, **kwargs)


def why_not(name: str, q: Tensor, k: Tensor, v: Tensor, mask=None, *, settings: dict | None = None,
            bias=None, return_weights: bool = False) -> str | None:
    """None when mechanism ``name`` built with ``settings`` can serve this call, else why not, in words."""
    return REGISTRY.why_not(name, q, k, v, mask, settings=settings, bias=bias, return_weights=return_weights)
