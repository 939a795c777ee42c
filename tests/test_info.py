"""attnlab.info: the BLAS line, the native kernel's line (its reason said once), every backend per call."""

from __future__ import annotations

import torch

from attnlab import info
from attnlab.exact import native


def test_info_names_the_blas_path_and_the_native_kernel():
    text = info.format_info(info.collect("cpu"))
    blas = next(ln for ln in text.splitlines() if ln.startswith("BLAS: "))
    if "BLAS_INFO=mkl" in torch.__config__.show():
        assert "MKL" in blas and "oneDNN" in blas
    line = next(ln for ln in text.splitlines() if ln.startswith("native kernel: "))
    assert line.startswith("native kernel: in use" if native.status() is None else "native kernel: not used: ")


def test_a_native_kernel_not_in_use_is_said_once_in_one_line(no_native_kernel):
    text = info.format_info(info.collect("cpu"))
    assert text.count("the native kernel is turned off") == 1
    assert "native kernel: not used: the native kernel is turned off (set_native_enabled(False))" in text
    assert "no: the native kernel is not in use (see above)" in text
