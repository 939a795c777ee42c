"""What every attention mechanism is: an ``nn.Module`` mixing values, plus a cost model.

A mechanism maps ``q (B, H, N, D)``, ``k (B, Hkv, M, D)``, ``v (B, Hkv, M, Dv)`` and an
optional mask to ``out (B, H, N, Dv)``. Mechanisms are registered by name so that
layers, the CLI and the benchmark can build them from strings
(``create("performer", features=256)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

_MECHANISMS: dict[str, type[Mechanism]] = {}


@dataclass(frozen=True)
class Cost:
    """Estimated work of one forward call: floating-point operations and bytes of memory
    held at peak beyond the inputs (activations the call allocates)."""

    flops: float
    bytes: float


class Mechanism(nn.Module):
    """Base class. Subclasses set ``name`` and implement ``forward`` and ``cost``."""

    name: str = ""
    #: which masks it accepts, in words, for docs and ``attnlab info``
    masks_supported: str = ""
    #: True when its output equals exact attention (no approximation)
    exact: bool = False

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


def register_mechanism(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: enroll a mechanism under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}.name must be set to register it")
    _MECHANISMS[cls.name] = cls
    return cls


def mechanisms() -> dict[str, type[Mechanism]]:
    """Registered mechanism classes by name."""
    return dict(_MECHANISMS)


def create(name: str, **kwargs) -> Mechanism:
    """Build the mechanism registered as ``name`` with keyword settings.

    Raises:
        ValueError: for an unknown name (listing the known ones) or bad settings.
    """
    try:
        cls = _MECHANISMS[name]
    except KeyError:
        raise ValueError(f"mechanism must be one of {sorted(_MECHANISMS)}, got {name!r}") from None
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"bad settings for mechanism {name!r}: {e}") from e
