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


def _contracts() -> list[dict]:
    """The import-linter contracts of ``pyproject.toml``."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def test_every_bench_module_has_a_floor():
    """The bench contract names every module directly under ``attnlab/bench`` (a new file gets a floor)."""
    (bench,) = [c for c in _contracts() if c.get("containers") == ["attnlab.bench"]]
    floors = {name.strip() for layer in bench["layers"] for name in layer.replace(":", "|").split("|")}
    here = {p.stem for p in (ROOT / "src/attnlab/bench").glob("*.py") if p.stem != "__init__"}
    here |= {p.name for p in (ROOT / "src/attnlab/bench").iterdir() if (p / "__init__.py").exists()}
    assert not here - floors, f"bench modules on no floor of the bench contract (pyproject.toml): " \
        f"{sorted(here - floors)}"
    assert not floors - here, f"floors of the bench contract that name no module: {sorted(floors - here)}"


def test_no_module_imports_attnlab_by_string():
    """``importlib.import_module("attnlab...")`` hides an import from the contract and the cycle count."""
    import ast

    bad = []
    for path in sorted((ROOT / "src/attnlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            arg = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(arg, str) and arg.startswith(("attnlab", ".")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {arg!r} by string")
    assert not bad, "import attnlab's modules with import statements (lazily inside a function if need be):\n" \
        + "\n".join(bad)


#: the most lines of code a function of the package may have (its docstring excluded)
MAX_FUNCTION_LINES = 80


def _function_lengths(path: Path):
    """``(name, first line, lines of code)`` of every function and method in ``path``: from the first
    statement after the docstring to the last line of the body (comments and blank lines inside count)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str)
        if has_doc and len(body) == 1:
            continue
        first = body[1] if has_doc else body[0]
        yield node.name, node.lineno, node.end_lineno - first.lineno + 1


def test_function_lengths_are_counted_without_the_docstring(tmp_path):
    code = 'def f():\n    """doc\n\n    more doc\n    """\n    a = 1\n\n    return a\n'
    (tmp_path / "m.py").write_text(code)
    assert list(_function_lengths(tmp_path / "m.py")) == [("f", 1, 3)]


def test_no_function_is_longer_than_80_lines():
    """A long function is split where a reader would want a name for a step (docs/ARCHITECTURE.md)."""
    src = ROOT / "src"
    long = [f"{path.relative_to(src)}:{line} {name}: {n} lines"
            for path in sorted((src / "attnlab").rglob("*.py"))
            for name, line, n in _function_lengths(path) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines of code (docstring excluded):\n" + "\n".join(long)


def _cycles(graph) -> list[str]:
    """Every import circle of ``graph``: between modules, and between the children of each package.

    Modules: the strongly connected components of the module graph with more than one module
    (Tarjan's algorithm). Packages: for each package, grimp's ``nominate_cycle_breakers`` over
    its children (each subpackage counted with everything under it): the imports whose removal
    would leave them acyclic, none when they already are.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[str] = []

    def visit(start: str) -> None:  # iterative Tarjan: the import graph may be deep
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append("modules: " + " <-> ".join(sorted(component)))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        for importer, imported in sorted(graph.nominate_cycle_breakers(package)):
            found.append(f"package {package}: {importer} -> {imported} closes a circle")
    return found


def test_the_cycle_count_finds_a_circle(tmp_path):
    """The counter can fail: a circle between two modules and between two packages is found."""
    grimp = pytest.importorskip("grimp", reason=f"the cycle count needs grimp, which comes with {PIP}")
    graph = grimp.ImportGraph()
    for m in ("pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.x", "pkg.other", "pkg.other.y"):
        graph.add_module(m)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.sub.x", imported="pkg.other.y")
    graph.add_import(importer="pkg.other.y", imported="pkg.sub")
    found = _cycles(graph)
    assert "modules: pkg.a <-> pkg.b" in found
    assert any(f.startswith("package pkg:") and "pkg.sub" in f and "pkg.other" in f for f in found), found


def test_no_module_or_package_sits_in_an_import_circle():
    """No import circle in attnlab, counted over modules and over packages (grimp, lazy imports included)."""
    grimp = pytest.importorskip("grimp", reason=f"the cycle count needs grimp, which comes with {PIP}")
    sys.path.insert(0, str(ROOT / "src"))
    try:
        graph = grimp.build_graph("attnlab", cache_dir=None)
    finally:
        sys.path.remove(str(ROOT / "src"))
    found = _cycles(graph)
    assert not found, "import circles (move the shared piece down a floor):\n" + "\n".join(found)
