"""The flash backend's gating, with flash-attn and the GPU mocked: a wheel that does not
import, an old version and a pre-Ampere GPU each decline with the failed check named
(what ``attnlab.explain`` shows), the import happens once, and the forward hands
flash-attn bottom-right causal and window arguments."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnlab import masks
from attnlab.exact import explain, get_backend, make_call
from attnlab.exact import flash as flash_mod


@pytest.fixture
def fresh():
    """Forget the cached import and capabilities before and after the test."""
    flash_mod.load_flash_attn.cache_clear()
    flash_mod._capability_reason.cache_clear()
    yield
    flash_mod.load_flash_attn.cache_clear()
    flash_mod._capability_reason.cache_clear()


def _fake_flash(monkeypatch, version="2.6.3", capability=(9, 0)):
    """Install a fake ``flash_attn`` module and a CUDA device of ``capability``; returns the module."""
    fa = types.ModuleType("flash_attn")
    fa.__version__ = version
    fa.calls = []

    def flash_attn_func(q, k, v, **kw):
        fa.calls.append(kw)
        return torch.zeros_like(q)

    fa.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", fa)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    return fa


def test_version_parsing():
    assert flash_mod.parse_version("2.6.3") == (2, 6, 3)
    assert flash_mod.parse_version("2.7.0.post2") == (2, 7, 0)
    assert flash_mod.parse_version("v2.3") == (2, 3)
    assert flash_mod.parse_version("unknown") == ()


def test_wheel_that_does_not_import_declines_and_says_so(monkeypatch, fresh):
    def broken(name):
        raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")

    monkeypatch.setattr(flash_mod, "importlib", types.SimpleNamespace(import_module=broken))
    monkeypatch.setattr(flash_mod, "_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    why = get_backend("flash").available()
    assert "does not import" in why and "undefined symbol" in why and "pip install" in why
    q = torch.randn(1, 2, 8, 16)
    by = {v.backend: v for v in explain(q, q, q)}
    assert by["flash"].reason == why  # explain shows the failed check


def test_missing_dependency_is_not_reported_as_flash_missing(monkeypatch, fresh):
    def missing_dep(name):
        raise ModuleNotFoundError("No module named 'einops'", name="einops")

    monkeypatch.setattr(flash_mod, "importlib", types.SimpleNamespace(import_module=missing_dep))
    monkeypatch.setattr(flash_mod, "_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    why = get_backend("flash").available()
    assert "einops" in why and "not installed" not in why


def test_old_version_declines(monkeypatch, fresh):
    _fake_flash(monkeypatch, version="2.1.1")
    why = get_backend("flash").available()
    assert "2.1.1" in why and "too old" in why and ">= 2.3" in why


def test_import_happens_once(monkeypatch, fresh):
    _fake_flash(monkeypatch)
    seen = []
    real = flash_mod.importlib.import_module

    def counting(name):
        seen.append(name)
        return real(name)

    monkeypatch.setattr(flash_mod, "importlib", types.SimpleNamespace(import_module=counting))
    monkeypatch.setattr(flash_mod, "_installed", lambda: True)
    for _ in range(3):
        assert get_backend("flash").available() is None
    assert seen == ["flash_attn"]


@pytest.mark.parametrize("capability,serves", [((7, 5), False), ((8, 0), True), ((8, 6), True), ((9, 0), True)])
def test_compute_capability_gate(monkeypatch, fresh, cuda_call, capability, serves):
    _fake_flash(monkeypatch, capability=capability)
    backend = get_backend("flash")
    assert backend.available() is None
    why = backend.supports(cuda_call(mask=masks.causal()))
    if serves:
        assert why is None
    else:
        assert "compute capability" in why and "7.5" in why and ">= 8.0" in why


def test_supports_the_shapes_and_masks_it_can(monkeypatch, fresh, cuda_call):
    _fake_flash(monkeypatch)
    backend = get_backend("flash")
    assert backend.supports(cuda_call(H=8, Hkv=2, D=40, N=33, M=97, mask=masks.sliding_window(8, 3))) is None
    assert "float16/bfloat16" in backend.supports(cuda_call(dtype=torch.float32))
    assert "256" in backend.supports(cuda_call(D=320))
    assert "no key" in backend.supports(cuda_call(N=97, M=33, mask=masks.causal()))
    assert "no mask, causal or sliding_window" in backend.supports(cuda_call(mask=masks.padding([3])))


@pytest.mark.parametrize("mask,causal,window", [
    (None, False, (-1, -1)), (masks.causal(), True, (-1, -1)), (masks.sliding_window(5, 2), False, (5, 2)),
])
def test_forward_translates_the_mask(monkeypatch, fresh, mask, causal, window):
    fa = _fake_flash(monkeypatch)
    q = torch.randn(2, 4, 9, 16)
    k = torch.randn(2, 2, 11, 16)
    out, weights = get_backend("flash").forward(make_call(q, k, k, mask=mask, scale=0.5))
    assert out.shape == (2, 4, 9, 16) and weights is None
    assert fa.calls == [dict(dropout_p=0.0, softmax_scale=0.5, causal=causal, window_size=window)]
