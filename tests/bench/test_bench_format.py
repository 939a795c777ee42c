"""attnlab.bench.format: one renderer for the terminal tables and the Markdown report's."""

from __future__ import annotations

import pytest

from attnlab.bench.format import render_table, text_table
from attnlab.bench.report import to_markdown

HEAD = ["name", "task", "N", "steps", "note"]
ROWS = [["exact", "mqar", "64", "12", "same | function"], ["exact-naive", "mqar", "1025", "12", ""]]


def test_markdown_cells_have_one_space_and_are_escaped():
    lines = render_table(HEAD, ROWS, "markdown").splitlines()
    assert lines[0] == "| name | task | N | steps | note |"
    assert set(lines[1]) == {"|", "-"} and lines[1].count("|") == len(HEAD) + 1
    assert lines[2] == "| exact | mqar | 64 | 12 | same \\| function |"
    assert lines[3] == "| exact-naive | mqar | 1025 | 12 |  |"
    assert render_table(["a"], [["x\ny"]], "markdown").splitlines()[-1] == "| x y |"


def test_text_columns_line_up_names_left_figures_right():
    lines = text_table(HEAD, ROWS).splitlines()
    assert len(lines) == 4 and set(lines[1]) == {"-", " "}
    assert len({line.index(" 12") for line in lines[2:]}) == 1  # right-aligned figures end in one column
    assert lines[2].index(" 64") + 3 == lines[3].index(" 1025") + 5
    assert lines[2].startswith("exact ") and lines[3].startswith("exact-naive  mqar")
    assert lines[2].rstrip().endswith("same | function") and all(line == line.rstrip() for line in lines)
    assert lines[3].split() == ["exact-naive", "mqar", "1025", "12"]


def test_numbers_stay_as_written():
    out = text_table(["name", "x", "ms"], [["a", "b", "1,234.50"], ["c", "d", "0.10"], ["e", "f", "1e-05"]])
    assert "1,234.50" in out and "0.10" in out and "1e-05" in out
    assert "| 0.10 |" in render_table(["ms"], [["0.10"]], "markdown")


def test_empty_tables_keep_their_head():
    assert text_table(["a", "b"], []).splitlines()[0].split() == ["a", "b"]
    assert render_table(["a", "b"], [], "markdown").splitlines()[0] == "| a | b |"


def test_report_tables_render_through_it():
    assert render_table(HEAD, ROWS, "markdown") in to_markdown([("h2", "T"), ("table", HEAD, ROWS)])
    assert text_table(HEAD, ROWS) == render_table(HEAD, ROWS, "text")


def test_unknown_format():
    with pytest.raises(ValueError, match="'html'"):
        render_table(HEAD, ROWS, "html")
