"""The words of the verdicts, and the "which attention to use" table, shared by every suite.

Verdicts are computed from measured cases, never typed by hand. Each suite writes its own
(:meth:`attnlab.bench.suite.Suite.verdicts`) with these phrases, so every comparison reads
the same way ("2.1x faster than sdpa", "12.0x less memory than exact"), and contributes its
rows to :func:`decision_table`. Comparisons are against what a user would otherwise use:
SDPA (``torch.nn.functional.scaled_dot_product_attention``) for exact attention, exact
attention for an approximation.
"""

from __future__ import annotations

MODE_WORDS = {"fwd": "forward", "fwd_bwd": "forward+backward"}

MASK_WORDS = {"none": "no mask", "causal": "causal", "sliding_window": "sliding window", "padding": "padding",
              "document": "document"}

#: below this, peak memory is measurement noise (thread stacks, allocator pages): no ratios
MIN_RATIO_BYTES = 1 << 20

#: the columns of the "which attention to use" table
DECISION_HEAD = ["situation", "use", "measured gain", "compared with"]


def is_ok(c: dict) -> bool:
    """The case ran and has a time."""
    return c["status"] == "ok" and c["time_s"] is not None


def mb_text(b: int | None) -> str:
    """``'12.3 MB'`` (``'n/a'`` when unknown)."""
    return "n/a" if b is None else f"{b / 2**20:,.1f} MB"


def ms_text(s: float) -> str:
    """``'12.3 ms'`` below ten seconds, ``'12.3 s'`` above."""
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.1f} s"


def ratio_text(x: float | None) -> str:
    """``'2.31x'``, ``'12x'``, or ``'n/a'``."""
    return "n/a" if x is None else (f"{x:.2f}x" if x < 10 else f"{x:.0f}x")


def times_phrase(a: float, b: float, more: str = "faster", less: str = "slower") -> str:
    """``'2.1x faster than'`` style comparison of ``a`` (ours) with ``b`` (theirs), lower is better."""
    if a <= 0 or b <= 0:
        return "compared with"
    r = b / a
    if r >= 1.05:
        return f"{r:.1f}x {more} than"
    if r <= 1 / 1.05:
        return f"{1 / r:.1f}x {less} than"
    return "about the same as"


def mem_phrase(a: int, b: int, other: str) -> str:
    """``'12.0x less than math'``, or both figures when either is too small for a ratio."""
    if a < MIN_RATIO_BYTES or b < MIN_RATIO_BYTES:
        return f"vs {mb_text(b)} for {other}"
    r = b / a
    if r >= 1.05:
        return f"{r:.1f}x less than {other}"
    if r <= 1 / 1.05:
        return f"{1 / r:.1f}x more than {other}"
    return f"about the same as {other}"


def decision_table(results: dict, suites: list) -> tuple[list[str], list[list[str]]]:
    """The short answer: one row per measured situation, what to use, the gain, what it is compared with.

    Each of ``suites`` (the run's, in report order) contributes its rows
    (:meth:`attnlab.bench.suite.Suite.decision_rows`) from its own records.
    """
    rows: list[list[str]] = []
    for suite in suites:
        rows += suite.decision_rows(suite.own(results["cases"]))
    return DECISION_HEAD, rows


__all__ = ["DECISION_HEAD", "MASK_WORDS", "MIN_RATIO_BYTES", "MODE_WORDS", "decision_table", "is_ok", "mb_text",
           "mem_phrase", "ms_text", "ratio_text", "times_phrase"]
