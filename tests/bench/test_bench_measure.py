"""bench.measure on CUDA reads the counters of the device the case's tensors live on, not the
current device (checked with the CUDA calls recorded, on a machine without CUDA)."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench import measure


@pytest.fixture
def cuda_calls(monkeypatch):
    """Record every CUDA counter/sync call with the device it was given; the current device is 3."""
    calls = []
    allocated = iter([100, 0])

    def record(name, result=None):
        def fn(device=None):
            calls.append((name, device))
            return result() if callable(result) else result
        return fn

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "synchronize", record("synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", record("reset_peak_memory_stats"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", record("memory_allocated", lambda: next(allocated)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", record("max_memory_allocated", 612))
    return calls


def test_cuda_device_resolves_the_current_index(cuda_calls):
    assert measure.cuda_device("cuda:1") == torch.device("cuda", 1)
    assert measure.cuda_device("cuda") == torch.device("cuda", 3)
    assert measure.cuda_device("cpu") is None


@pytest.mark.parametrize("device,index", [("cuda:1", 1), ("cuda", 3)])
def test_peak_memory_and_sync_use_the_case_device(cuda_calls, device, index):
    out, peak, method = measure.peak_memory(lambda: "done", device)
    assert out == "done" and peak == 512 and f"cuda:{index}" in method
    assert {name for name, _ in cuda_calls} == {"synchronize", "reset_peak_memory_stats", "memory_allocated",
                                                "max_memory_allocated"}
    assert all(dev == torch.device("cuda", index) for _, dev in cuda_calls), cuda_calls


def test_sync_is_a_no_op_off_cuda(cuda_calls):
    measure.sync("cpu")
    assert cuda_calls == []


def test_float32_ceiling_is_the_faster_of_torch_mm_and_onednn():
    ce = measure.ceilings("cpu", ["float32"], size=128, copy_mb=1, budget_s=0.05)
    paths = ce["matmul_paths"]["float32"]
    assert paths["torch.mm"] > 0
    if torch.backends.mkldnn.is_available():
        assert paths["onednn"] is not None and paths["onednn"] > 0
    assert ce["matmul_gflops"]["float32"] == max(paths["torch.mm"], paths["onednn"] or 0.0)
