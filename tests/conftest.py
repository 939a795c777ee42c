"""Shared fixtures: a seeded generator, per-dtype tolerances, a naive attention, one-thread modules,
the native CPU kernel turned off.

The helpers themselves live in ``tests/helpers.py`` (this folder is on ``sys.path``
because this conftest sits in it, so tests write ``from helpers import ...``); the
fixtures here (``gen``, ``tol``, ``naive_attention``, ``one_thread``, ``no_native_kernel``)
offer the common ones without an import.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch

# auto's choices in the tests follow the shipped cost models, not a calibration this machine's
# user may have written (attnlab bench calibrate): every test process reads its own empty cache
os.environ["ATTNLAB_CACHE"] = tempfile.mkdtemp(prefix="attnlab-test-cache-")

from helpers import TOLERANCES, naive_attention  # after ATTNLAB_CACHE: helpers imports attnlab


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator seeded the same way in every test."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def tol():
    """``tol(dtype) -> dict(rtol=..., atol=...)`` for ``torch.testing.assert_close``."""

    def _tol(dtype: torch.dtype) -> dict[str, float]:
        rtol, atol = TOLERANCES[dtype]
        return {"rtol": rtol, "atol": atol}

    return _tol


@pytest.fixture(scope="session", name="naive_attention")
def naive_attention_fixture():
    """The plain-torch formula computed in the inputs' dtype (see :func:`naive_attention`)."""
    return naive_attention


@pytest.fixture(scope="module")
def one_thread():
    """Run a module on one torch thread: tiny models are fastest so, and a shared CPU is
    never oversubscribed. Folders of tiny-model tests use it through an autouse fixture."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_data(tmp_path_factory, monkeypatch):
    """No data set is fetched: ``$ATTNLAB_DATA`` and the cache (``$XDG_CACHE_HOME``) are empty folders."""
    root = tmp_path_factory.mktemp("no-data")
    monkeypatch.setenv("ATTNLAB_DATA", str(root / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    return root


@pytest.fixture
def no_native_kernel():
    """Run a test with attnlab's native CPU kernel turned off (the paths it replaces)."""
    from attnlab.exact import native

    native.set_native_enabled(False)
    yield
    native.set_native_enabled(True)


@pytest.fixture(scope="session")
def planetoid():
    """``planetoid("cora" | "citeseer")`` -> the data set (:func:`attnlab.data.planetoid.load_planetoid`), read
    once per session from the fetched copy; the test is skipped, naming ``attnlab data fetch``, without it."""
    from attnlab.data.planetoid import load_planetoid
    from helpers import fetched

    cache: dict[str, Any] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_planetoid(fetched(name), name)
        return cache[name]

    return get



@pytest.fixture(autouse=True)
def _grouped_by_loadgroup(request):
    """Under ``--dist loadgroup`` a test marked ``xdist_group`` must carry its group in its node id
    (``path::test@group``): that suffix is how pytest-xdist sends a group to one worker, so its
    session fixtures are built once. A pytest that drops the suffix would silently build them
    once per worker; such a test fails here instead, saying why."""
    if getattr(request.config.option, "loadgroup", False) and request.node.get_closest_marker("xdist_group"):
        if "@" not in request.node.nodeid:
            import xdist

            pytest.fail(f"--dist loadgroup did not group {request.node.nodeid}: pytest {pytest.__version__} with "
                        f"pytest-xdist {xdist.__version__} drops the group; install the pytest the test extra pins "
                        "(pip install -e '.[test]')", pytrace=False)
