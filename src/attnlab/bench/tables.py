"""Tables of strings for the terminal and for Markdown, rendered by one function with tabulate.

The terminal gets fixed-width columns: the first two (names) and the last (notes) to the
left, the figures between them to the right. Markdown gets pipe tables with one space
around each cell and no padding, so a row of ``report.md`` reads the same whatever the
other rows hold (``| exact | mqar | 64 | 12 |``) and can be searched for as it is.
"""

from __future__ import annotations

from typing import Literal

from tabulate import tabulate

__all__ = ["render_table"]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(head: list[str], rows: list[list[str]], fmt: Literal["text", "markdown"] = "text") -> str:
    """``head`` and ``rows`` (cells already formatted as strings) as a ``text`` or ``markdown`` table."""
    if fmt == "markdown":
        # stralign=None: cells as they are, not padded to the column's width
        return tabulate([[_md_cell(c) for c in r] for r in rows], headers=[_md_cell(h) for h in head],
                        tablefmt="pipe", stralign=None, numalign=None, disable_numparse=True)
    if fmt != "text":
        raise ValueError(f"table format must be 'text' or 'markdown', got {fmt!r}")
    last = len(head) - 1
    align = ["left" if i in (0, 1, last) else "right" for i in range(len(head))]
    return tabulate(rows, headers=head, tablefmt="simple", colalign=align, disable_numparse=True)
