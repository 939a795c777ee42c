"""Tiny suite runs: every test module here runs on one torch thread (see tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield
