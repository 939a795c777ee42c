"""Attention mechanisms: exact and efficient approximations behind one interface.

``create(name, **settings)`` builds one by name; ``mechanisms()`` lists them;
``why_not(name, q, k, v, mask, settings=...)`` says why one can't serve a call. A new
mechanism file decorates its class with :func:`register_mechanism` and is added to the
import list below; it then appears in dispatch, ``attnlab info``, the
benchmark and the conformance grid.
"""

# each mechanism module registers its class (@register_mechanism) when imported here
from . import (  # noqa: F401
    adaptive_span,
    bigbird,
    exact,
    linear,
    linformer,
    local,
    longformer,
    nystrom,
    performer,
    reformer,
    topk,
)
from .adaptive_span import AdaptiveSpan
from .base import (
    REGISTRY,
    Cost,
    Mechanism,
    create,
    extra_loss,
    log_values,
    mechanisms,
    reason,
    register_mechanism,
    why_not,
)
from .exact import Exact

__all__ = ["REGISTRY", "AdaptiveSpan", "Cost", "Exact", "Mechanism", "create", "extra_loss", "log_values", "mechanisms",
           "reason", "register_mechanism", "why_not"]
