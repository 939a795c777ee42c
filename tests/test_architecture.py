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


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved against ``package``)."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_no_module_outside_bench_suites_imports_a_suite():
    """The runner, the worker, the CLI, the schema and the reports reach suites through the registry only."""
    src = ROOT / "src"
    suites = {f"attnlab.bench.suites.{p.stem}" for p in (src / "attnlab/bench/suites").glob("*.py") if p.stem != "__init__"}
    suites |= {f"attnlab.bench.suites.{p.name}" for p in (src / "attnlab/bench/suites").iterdir() if p.is_dir()
               and (p / "__init__.py").exists()}
    bad = []
    for path in (src / "attnlab").rglob("*.py"):
        rel = path.relative_to(src).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if module.startswith("attnlab.bench.suites"):
            continue
        package = module if rel.name == "__init__" else module.rsplit(".", 1)[0]
        hits = {m for m in _imports(path, package) if any(m == s or m.startswith(s + ".") for s in suites)}
        bad += [f"{module} imports {m}" for m in sorted(hits)]
    assert not bad, "import a suite only inside attnlab/bench/suites/ (elsewhere use the registry):\n" + "\n".join(bad)
