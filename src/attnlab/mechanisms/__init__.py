"""Attention mechanisms: exact and efficient approximations behind one interface.

``create(name, **settings)`` builds one by name; ``mechanisms()`` lists them.
"""

from . import exact  # noqa: F401  (registration)
from .base import Cost, Mechanism, create, mechanisms, register_mechanism
from .exact import Exact

__all__ = ["Cost", "Exact", "Mechanism", "create", "mechanisms", "register_mechanism"]
