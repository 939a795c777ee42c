"""Nav slots for pages that other branches are writing.

A line ``slot:NAME`` inside a toctree of a Markdown page becomes ``NAME`` when
``docs/NAME.md`` (or ``.rst``) exists, and disappears while it does not, so the
build stays free of warnings before the page lands and lists it the moment it does.
Once every slot's page is on main, replace the ``slot:`` lines by the plain names.
"""

from __future__ import annotations

import re
from pathlib import Path

SLOT = re.compile(r"^slot:(?P<name>[\w/.-]+)[ \t]*$", re.M)


def fill_slots(text: str, srcdir: Path) -> str:
    """``text`` with each ``slot:NAME`` line replaced by NAME (page present) or removed (absent)."""

    def repl(m: re.Match) -> str:
        name = m["name"]
        present = any((srcdir / f"{name}{ext}").exists() for ext in (".md", ".rst"))
        return name if present else ""

    return SLOT.sub(repl, text)


def setup(app):
    def on_source_read(app, docname, source):
        source[0] = fill_slots(source[0], Path(app.srcdir))

    app.connect("source-read", on_source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
