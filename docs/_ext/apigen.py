"""Generate the API reference from the modules that exist at build time, and refuse
public functions and classes without a docstring.

Public modules are every module under ``attnlab`` with no dotted part starting with
``_``. A module's public names are its ``__all__`` or, without one, the functions and
classes it defines whose names do not start with ``_``. Each object is documented once,
in the shallowest public module that lists it among the packages it is defined under
(``attnlab.attention``, not ``attnlab.exact.op.attention``); the other modules that
export it link there. One page per second-level module (``attnlab.masks``,
``attnlab.exact``, ``attnlab.cli`` ...), with a section per submodule.

Used by ``docs/conf.py`` (the ``builder-inited`` event writes ``docs/api/``) and by
``tests/docs/test_api_reference.py``: ``python docs/_ext/apigen.py`` lists what is
missing a docstring and exits 1 if anything is.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT_PACKAGE = "attnlab"


@dataclass
class Module:
    name: str
    module: object
    names: list[str]
    owned: list[str] = field(default_factory=list)  # documented here
    elsewhere: dict[str, str] = field(default_factory=dict)  # name -> where it is documented

    @property
    def depth(self) -> int:
        return self.name.count(".")


def public_modules(root: str = ROOT_PACKAGE) -> list[str]:
    """Every importable public module under ``root``, ``root`` first, in dotted-name order."""
    pkg = importlib.import_module(root)
    names = [root] + sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, root + "."))
    return [n for n in names if not any(p.startswith("_") for p in n.split("."))]


def _is_routine_or_class(obj: object) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)


def public_names(mod: object) -> list[str]:
    """``__all__``, or the public functions and classes the module defines."""
    if hasattr(mod, "__all__"):
        return [n for n in mod.__all__ if not inspect.ismodule(getattr(mod, n, None))]
    return sorted(
        n
        for n, obj in vars(mod).items()
        if not n.startswith("_") and _is_routine_or_class(obj) and getattr(obj, "__module__", None) == mod.__name__
    )


def has_docstring(obj: object) -> bool:
    """A docstring written for it (a dataclass's generated ``Name(field: type, ...)`` does not count)."""
    doc = obj.__doc__ if (inspect.isclass(obj) or inspect.isfunction(obj)) else inspect.getdoc(obj)
    if not doc or not doc.strip():
        return False
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "("):
        return False
    return True


def collect(root: str = ROOT_PACKAGE) -> list[Module]:
    """Import every public module and assign each public object to the module that documents it."""
    mods = []
    for name in public_modules(root):
        mod = importlib.import_module(name)
        mods.append(Module(name, mod, public_names(mod)))
    by_depth = sorted(mods, key=lambda m: (m.depth, m.name))
    owner: dict[object, str] = {}
    for m in mods:
        for n in m.names:
            obj = getattr(m.module, n)
            key = id(obj) if _is_routine_or_class(obj) else (m.name, n)
            if key in owner:
                continue
            if not _is_routine_or_class(obj):  # a constant is documented where it is listed
                owner[key] = m.name
                continue
            home = getattr(obj, "__module__", None)
            # the shallowest exporter that the object's own module sits under, else the shallowest exporter
            exporters = [e for e in by_depth if n in e.names and _same(getattr(e.module, n, None), obj)]
            ancestors = [e for e in exporters if home and (home == e.name or home.startswith(e.name + "."))]
            owner[key] = (ancestors or exporters)[0].name
    for m in mods:
        for n in m.names:
            obj = getattr(m.module, n)
            key = id(obj) if _is_routine_or_class(obj) else (m.name, n)
            if owner[key] == m.name:
                m.owned.append(n)
            else:
                m.elsewhere[n] = owner[key]
    return mods


def _same(a: object, b: object) -> bool:
    return a is b


def missing_docstrings(mods: list[Module]) -> list[str]:
    """Public functions and classes (each where it is documented) without a docstring, and public modules without one."""
    out = [f"module {m.name}" for m in mods if not (m.module.__doc__ or "").strip()]
    for m in mods:
        for n in m.owned:
            obj = getattr(m.module, n)
            if _is_routine_or_class(obj) and not has_docstring(obj):
                kind = "class" if inspect.isclass(obj) else "function"
                out.append(f"{kind} {m.name}.{n}")
    return out


def _directive(obj: object) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "autoexception"
        return "autoclass"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "autofunction"
    return "autodata"


def _heading(text: str, char: str) -> str:
    return f"{text}\n{char * len(text)}\n"


def _data(name: str, obj: object) -> list[str]:
    """A constant: its type and, when short, its value (autodoc would show the docstring of its type)."""
    text = repr(obj)
    lines = [f".. py:data:: {name}", f"   :type: {type(obj).__name__}"]
    if len(text) <= 100 and "\n" not in text:
        lines.append(f"   :value: {text}")
    return lines + [""]


def _section(m: Module, char: str, shadowed: set[str]) -> str:
    # a submodule named like a function its package exports (attnlab.bench.compare) is not indexed twice
    no_index = "\n   :no-index:" if m.name in shadowed else ""
    lines = [_heading(f"``{m.name}``", char), f".. automodule:: {m.name}\n   :no-members:{no_index}\n"]
    for n in m.owned:
        obj = getattr(m.module, n)
        d = _directive(obj)
        if d == "autodata":
            lines += _data(n, obj)  # automodule made m the current module: the short name gets m's prefix
            continue
        lines.append(f".. {d}:: {m.name}.{n}")
        if d in ("autoclass", "autoexception"):
            lines.append("   :members:\n   :show-inheritance:")
        lines.append("")
    if m.elsewhere:
        refs = ", ".join(f":py:obj:`{n} <{home}.{n}>`" for n, home in sorted(m.elsewhere.items()))
        lines.append(f"Also exported here, documented where they belong: {refs}.\n")
    return "\n".join(lines) + "\n"


def write_pages(out_dir: Path, mods: list[Module]) -> list[str]:
    """Write ``index.rst`` and one page per second-level module into ``out_dir`` (replaced); return the page names."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    top = [m for m in mods if m.depth <= 1]
    shadowed = {f"{m.name}.{n}" for m in mods for n in m.owned}
    pages = []
    for t in top:
        subs = [m for m in mods if m.depth > 1 and m.name.startswith(t.name + ".")] if t.depth == 1 else []
        text = _section(t, "=", shadowed) + "".join(_section(s, "-", shadowed) for s in subs)
        (out_dir / f"{t.name}.rst").write_text(text)
        pages.append(t.name)
    total = sum(len(m.owned) for m in mods)
    index = [
        ".. This directory is generated by docs/_ext/apigen.py at every build: edit the docstrings, not these files.\n",
        _heading("API reference", "="),
        f"Every public name of attnlab ({total} documented objects in {len(mods)} modules), generated from the "
        "docstrings of the modules present when the docs were built. A module's public names are its ``__all__`` "
        "or, without one, the functions and classes it defines; each is documented once, in the shallowest "
        "module that exports it, and the other modules that export it link there.\n",
        ".. toctree::\n   :maxdepth: 1\n",
    ]
    index += [f"   {p}" for p in pages]
    (out_dir / "index.rst").write_text("\n".join(index) + "\n")
    return pages


def setup(app):  # the Sphinx extension
    from sphinx.errors import ExtensionError

    def generate(app):
        mods = collect()
        missing = missing_docstrings(mods)
        if missing:
            raise ExtensionError("public names without a docstring:\n  " + "\n  ".join(missing))
        write_pages(Path(app.srcdir) / "api", mods)

    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    missing = missing_docstrings(collect())
    print("\n".join(missing) if missing else "every public function, class and module has a docstring")
    sys.exit(1 if missing else 0)
