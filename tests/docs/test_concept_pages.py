"""The Python examples of the concept pages (docs/*.md) run as written."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["masks", "backends", "mechanisms", "positional", "models", "training", "seeing", "dynamic"]
BLOCKS = [(p, i, b) for p in PAGES
          for i, b in enumerate(re.findall(r"```python\n(.*?)```", (DOCS / f"{p}.md").read_text(), flags=re.S))]


def test_concept_pages_have_examples():
    assert {p for p, _, _ in BLOCKS} == set(PAGES)


@pytest.mark.parametrize("page,index,block", BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_concept_page_example_runs(page, index, block, capsys):
    exec(compile(block, f"docs/{page}.md[python block {index}]", "exec"), {})
