"""A catalogue of mask kinds, each with an example, so that the tests are generated from it.

A mask constructor enrolls with the :func:`mask_kind` decorator, naming one or more
examples: functions of ``n`` (the number of positions of a self-attention call, queries and
keys alike) that build a mask of that kind for ``n`` positions. ``tests/test_conformance.py``
runs every example on every exact backend against the same mask as a dense boolean tensor,
so a new kind of mask is tested by enrolling it (the mask modules of this package are
imported by ``attnlab.masks``).

This module imports nothing from attnlab.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["mask_kind", "kinds", "grid_of"]

#: ``"constructor/example" -> maker(n)``, in registration order
_KINDS: dict[str, Callable[[int], Any]] = {}


def mask_kind(**examples: Callable[[int], Any]) -> Callable:
    """Decorator of a mask constructor: enroll each ``name=maker`` as ``"constructor/name"``.

    ``maker(n)`` returns a mask for a self-attention call of ``n`` positions.

    Raises:
        ValueError: with no example, or an example that is not callable.
    """
    if not examples:
        raise ValueError("mask_kind needs at least one example: mask_kind(name=lambda n: ...)")
    for name, maker in examples.items():
        if not callable(maker):
            raise ValueError(f"mask_kind example {name!r} must be a function of n, got {maker!r}")

    def enroll(constructor):
        for name, maker in examples.items():
            _KINDS[f"{constructor.__name__}/{name}"] = maker
        return constructor

    return enroll


def kinds() -> dict[str, Callable[[int], Any]]:
    """Every enrolled example, ``"constructor/example" -> maker(n)``, in registration order."""
    return dict(_KINDS)


def grid_of(n: int, dims: int) -> tuple[int, ...]:
    """A shape of ``dims`` axes whose product is ``n``: near-square, leading axes no larger.

    ``grid_of(60, 3) == (3, 4, 5)``, ``grid_of(60, 2) == (6, 10)``, a prime ``n`` gives
    ``(1, ..., 1, n)``. For the examples of the grid masks.
    """
    if dims == 1:
        return (n,)
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0 and d ** dims <= n)  # n ** (1 / dims) or below
    return (a, *grid_of(n // a, dims - 1))
