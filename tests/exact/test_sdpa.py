"""SDPA's CUDA kernel notes (what ``explain`` says about falling back to the math kernel),
checked with mocked CUDA calls, and the empty-row check that never reads a device value."""

from __future__ import annotations

import torch

from attnlab import masks
from attnlab.exact import explain, get_backend
from attnlab.exact import sdpa as sdpa_mod


def test_no_note_when_a_fused_kernel_fits(cuda_call):
    assert get_backend("sdpa").note(cuda_call(dtype=torch.float16, mask=masks.causal())) is None
    assert get_backend("sdpa").note(cuda_call(dtype=torch.bfloat16, H=8, Hkv=2)) is None


def test_float32_on_cuda_says_no_flash(cuda_call):
    note = get_backend("sdpa").note(cuda_call(dtype=torch.float32))
    assert "float32" in note and "math kernel" in note


def test_grouped_query_with_a_mask_says_math_fallback_and_repeat(cuda_call):
    note = get_backend("sdpa").note(cuda_call(dtype=torch.float16, H=8, Hkv=2, mask=masks.padding([40])))
    assert "grouped-query" in note and "math kernel" in note and "repeats k/v" in note


def test_odd_head_dims_note(cuda_call):
    note = get_backend("sdpa").note(cuda_call(dtype=torch.float16, D=59))
    assert "D=59" in note and "multiple of 8" in note


def test_no_note_on_cpu():
    q = torch.randn(1, 4, 9, 8)
    k = torch.randn(1, 2, 9, 8)
    by = {v.backend: v for v in explain(q, k, k, mask=masks.padding([5]))}
    assert by["sdpa"].serves and by["sdpa"].note is None


def test_empty_row_check_reads_only_host_values():
    assert sdpa_mod._all_true(torch.ones(3, dtype=torch.bool))
    assert not sdpa_mod._all_true(torch.tensor([True, False]))
    # a device tensor takes the general path without reading the value back
    assert not sdpa_mod._all_true(torch.ones(3, dtype=torch.bool, device="meta"))


def test_cuda_kernel_answers_with_a_kernel_name():
    q = torch.randn(1, 2, 8, 16)
    assert sdpa_mod.cuda_kernel(q, q, q) in ("flash", "efficient", "cudnn", "math", "none", "unknown")
