"""Exact softmax attention as a mechanism: :func:`attnlab.attention` behind the interface.

Vaswani et al., 2017. Time O(B H N M D); memory O(B H (N + M) D) on the ``sdpa`` and
``chunked`` backends, O(B H N M) on ``math``. Supports every mask and bias.
"""

from __future__ import annotations

from ..exact import attention
from ..exact.registry import get_backend
from .base import Cost, Mechanism, register_mechanism


@register_mechanism
class Exact(Mechanism):
    """Exact attention through the backend registry.

    Args:
        backend: ``"auto"`` or a backend name (``"math"``, ``"chunked"``, ``"sdpa"``, ...).
        dropout: attention-weight dropout applied in training mode only.
    """

    name = "exact"
    masks_supported = "any mask and additive bias"
    exact = True

    def __init__(self, backend: str = "auto", dropout: float = 0.0):
        super().__init__()
        if backend != "auto":
            get_backend(backend)  # raises ValueError naming the known backends
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.backend = backend
        self.dropout = dropout

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        backend = "math" if return_weights and self.backend == "auto" else self.backend
        return attention(
            q, k, v, mask=mask, bias=bias, dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights, backend=backend,
        )

    def supports(self, q, k, v, mask=None, *, bias=None, return_weights=False) -> str | None:
        """None when the backend (``auto``: some backend) can serve the call, else the reason."""
        from ..exact import make_call

        why = super().supports(q, k, v, mask, bias=bias)
        if why is not None:
            return why
        call = make_call(q, k, v, mask=mask, bias=bias, return_weights=return_weights)
        if self.backend == "auto":
            return None if not return_weights else get_backend("math").verdict(call)
        return get_backend(self.backend).verdict(call)

    def cost(self, n_queries, n_keys, head_dim, heads, batch=1):
        flops = 2.0 * batch * heads * n_queries * n_keys * 2 * head_dim
        if self.backend == "math":
            mem = 4.0 * batch * heads * n_queries * n_keys * 2
        else:
            mem = 4.0 * batch * heads * (n_queries + n_keys) * head_dim * 2
        return Cost(flops, mem)

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}, dropout={self.dropout}"
