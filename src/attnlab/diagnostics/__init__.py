"""Diagnostics: checks that attention keeps its contracts, per-head analysis, and
attention statistics streamed from the memory-lean kernel."""

from .analysis import HeadStats, analyze_heads, format_head_table, head_similarity, redundant_heads
from .checks import AttentionCheckError, AttentionReport, check_attention, leak_test
from .stream import AttentionStatistics, attention_statistics, statistics_from_weights

__all__ = [
    "AttentionCheckError",
    "AttentionReport",
    "AttentionStatistics",
    "HeadStats",
    "analyze_heads",
    "attention_statistics",
    "check_attention",
    "format_head_table",
    "head_similarity",
    "leak_test",
    "redundant_heads",
    "statistics_from_weights",
]
