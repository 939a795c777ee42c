"""Stand-ins for CUDA calls on a machine without CUDA.

``cuda_call`` builds an :class:`~attnlab.attention.AttentionCall` whose q/k/v claim to
live on ``cuda:0``: objects carrying only what a backend's ``supports``/``note`` read
(shape, dtype, device, requires_grad). Gating logic is checked with them; numbers are
checked on a real GPU in ``tests/test_gpu.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from attnlab.exact import AttentionCall


@dataclass
class FakeTensor:
    """What a backend's gating reads of a tensor, without allocating it on a device."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool = False


def _cuda_call(B=1, H=4, Hkv=4, N=64, M=64, D=64, Dv=None, dtype=torch.float16, mask=None, bias=None,
               bias_fn=None, grad=False, dropout_p=0.0, return_weights=False) -> AttentionCall:
    dev = torch.device("cuda", 0)
    Dv = D if Dv is None else Dv
    q = FakeTensor(torch.Size((B, H, N, D)), dtype, dev, grad)
    k = FakeTensor(torch.Size((B, Hkv, M, D)), dtype, dev, grad)
    v = FakeTensor(torch.Size((B, Hkv, M, Dv)), dtype, dev, grad)
    return AttentionCall(q=q, k=k, v=v, mask=mask, bias=bias, bias_fn=bias_fn, scale=D ** -0.5,
                         dropout_p=dropout_p, dropout_seed=0, return_weights=return_weights)


@pytest.fixture
def cuda_call():
    """``cuda_call(**sizes)`` -> an AttentionCall that claims ``cuda:0`` (see the module docstring)."""
    return _cuda_call
