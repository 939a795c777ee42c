"""attnlab.exact.calibration: a tiny calibration writes a file that ``auto`` then reads;
corrupt files and files from another torch or CPU are ignored with a one-line reason."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab import masks
from attnlab.bench.calibrate import calibrate
from attnlab.exact import calibration, explain


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    calibration._cache.clear()
    yield tmp_path / "calibration.json"
    calibration._cache.clear()


def test_without_a_file_auto_uses_the_shipped_defaults(cache):
    assert not cache.exists()
    assert calibration.status().startswith("shipped defaults (no calibration file at")
    assert calibration.predict("sdpa", 2.2e11, needs_grad=False) == pytest.approx(1.0)


def test_a_tiny_calibration_is_written_and_read(cache):
    data = calibrate(lengths=(64, 128), mask_kinds=("none", "causal"), backends_=("sdpa", "math"),
                                 repeats=1, heads=2, head_dim=16)
    assert set(data["constants"]) == {"sdpa", "math"}
    for modes in data["constants"].values():
        assert set(modes) == {"fwd", "fwd_bwd"}
        for scale, overhead in modes.values():
            assert scale > 0 and overhead >= 0
    assert len(data["cases"]) == 2 * 2 * 2 * 2 and all(c["seconds"] > 0 for c in data["cases"])
    path = calibration.write(data)
    assert path == cache and json.loads(cache.read_text())["identity"] == calibration.identity()
    assert calibration.status().startswith("measured by 'attnlab bench calibrate'")
    scale, overhead = data["constants"]["math"]["fwd"]
    assert calibration.predict("math", 1e9, False) == pytest.approx(scale * 1e9 * calibration.DEFAULT_SECONDS_PER_UNIT
                                                                   + overhead)
    # a backend the file does not cover keeps the default units
    assert calibration.predict("chunked", 2.2e11, False) == pytest.approx(1.0)


def _constants_file(cache, **over):
    data = {"version": calibration.VERSION, "created": "now", "identity": calibration.identity(),
            "constants": {"sdpa": {"fwd": [100.0, 0.0], "fwd_bwd": [100.0, 0.0]}}}
    data.update(over)
    cache.write_text(json.dumps(data))


def test_auto_follows_the_calibration(cache):
    q, k, v = (torch.randn(1, 2, 512, 16) for _ in range(3))
    mask = masks.causal() & masks.padding([400])  # not SDPA's fast path: auto weighs the estimates
    before = next(x for x in explain(q, k, v, mask=mask) if x.chosen).backend
    _constants_file(cache)  # sdpa measured 100x slower than its model says
    after = next(x for x in explain(q, k, v, mask=mask) if x.chosen).backend
    assert after != "sdpa"
    assert before == "sdpa" or before == after


@pytest.mark.parametrize("content,why", [
    ("{not json", "is not a valid calibration"),
    (json.dumps({"version": 99}), "is not a valid calibration"),
    (json.dumps({"version": 1, "identity": {}, "constants": {"sdpa": {"fwd": [-1, 0]}}}), "is not a valid calibration"),
])
def test_a_corrupt_file_is_reported_in_one_line_and_ignored(cache, content, why):
    cache.write_text(content)
    line = calibration.status()
    assert why in line and "\n" not in line and line.startswith("shipped defaults")
    assert calibration.predict("sdpa", 2.2e11, False) == pytest.approx(1.0)


@pytest.mark.parametrize("field,value", [("torch", "1.0.0"), ("cpu", "Some Other CPU"), ("threads", 64),
                                         ("native", "another chunked path")])
def test_a_file_from_another_machine_or_torch_is_ignored(cache, field, value):
    _constants_file(cache, identity={**calibration.identity(), field: value})
    line = calibration.status()
    assert line.startswith("shipped defaults") and f"measured with {field}" in line
    assert calibration.predict("sdpa", 2.2e11, False) == pytest.approx(1.0)


def test_the_identity_names_the_native_build_so_an_avx2_calibration_is_not_reused():
    """The kernel's info names its softmax ISA, so another build's file fails the identity check above."""
    from attnlab.exact import native_build

    native = calibration.identity()["native"]
    if native_build.status() is None:
        assert native == native_build.library().info() and "softmax " in native
    else:
        assert native is False
