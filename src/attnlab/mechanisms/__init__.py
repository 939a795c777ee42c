"""Attention mechanisms: exact and efficient approximations behind one interface.

``create(name, **settings)`` builds one by name; ``mechanisms()`` lists them. Every
module in this package is imported on package import, so a new mechanism file enrolls
itself (through :func:`register_mechanism`) in dispatch, ``attnlab info``, the
benchmark and the test grid.
"""

import importlib
import pkgutil

from .base import Cost, Mechanism, create, mechanisms, register_mechanism
from .exact import Exact

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name not in ("base",) and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Cost", "Exact", "Mechanism", "create", "mechanisms", "register_mechanism"]
