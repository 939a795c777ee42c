"""Every public function, class and module has a docstring: the API reference is made from them
(``docs/_ext/apigen.py`` refuses to build without one; this test says so without a build)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_ext"))

import apigen


def test_every_public_name_has_a_docstring():
    assert apigen.missing_docstrings(apigen.collect()) == []


def test_public_names_are_documented_once():
    mods = apigen.collect()
    owned = [f"{m.name}.{n}" for m in mods for n in m.owned]
    assert len(owned) == len(set(owned))
    assert "attention" in next(m for m in mods if m.name == "attnlab").owned
