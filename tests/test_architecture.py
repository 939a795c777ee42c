"""The import contract of ``pyproject.toml`` holds: attnlab's layers import only downward.

``lint-imports`` (import-linter) reads the contract from ``[tool.importlinter]``; a
lower layer importing a higher one, even inside a function, breaks it and this test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP = 'pip install -c scripts/constraints.txt "import-linter>=2.0"'


def _lint_imports() -> str | None:
    """The ``lint-imports`` beside this interpreter (the venv), else the one on PATH."""
    return shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def test_imports_only_go_downward():
    exe = _lint_imports()
    if exe is None:
        pytest.skip(f"the import contract needs import-linter: {PIP}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"lint-imports found imports that break the contract:\n{res.stdout}{res.stderr}"
    assert " 0 broken" in res.stdout
