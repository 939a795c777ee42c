"""docs/structured.md: its Python example runs as written, and every picture it shows exists."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "structured.md"


def test_the_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/structured.md[python block {i}]", "exec"), {})


def test_every_picture_is_committed():
    pictures = re.findall(r"\]\((structured/[^)]+\.png)\)", DOC.read_text())
    assert len(pictures) >= 7
    for pic in pictures:
        assert (DOC.parent / pic).is_file(), pic
