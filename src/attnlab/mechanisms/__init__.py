"""Attention mechanisms: exact and efficient approximations behind one interface.

``create(name, **settings)`` builds one by name; ``mechanisms()`` lists them;
``why_not(name, q, k, v, mask, settings=...)`` says why one can't serve a call. Every
module in this package is imported on package import, so a new mechanism file enrolls
itself (through :func:`register_mechanism`) in dispatch, ``attnlab info``, the
benchmark and the conformance grid.
"""

import importlib
import pkgutil

from .base import REGISTRY, Cost, Mechanism, create, mechanisms, reason, register_mechanism, why_not
from .exact import Exact

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name not in ("base",) and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["REGISTRY", "Cost", "Exact", "Mechanism", "create", "mechanisms", "reason", "register_mechanism", "why_not"]
