"""Diagnostics: checks that attention keeps its contracts, per-head analysis, attention
statistics streamed from the memory-lean kernel, and graph attention's neighbours, head
entropy and static vs dynamic ranking (:mod:`~attnlab.diagnostics.graph`)."""

from .analysis import HeadStats, analyze_heads, format_head_table, head_similarity, redundant_heads
from .checks import AttentionCheckError, AttentionReport, check_attention, leak_test
from .graph import GraphReport, analyze_graph_model, format_graph_report
from .stream import AttentionStatistics, attention_statistics, statistics_from_weights

__all__ = [
    "AttentionCheckError",
    "AttentionReport",
    "AttentionStatistics",
    "GraphReport",
    "HeadStats",
    "analyze_graph_model",
    "analyze_heads",
    "attention_statistics",
    "check_attention",
    "format_graph_report",
    "format_head_table",
    "head_similarity",
    "leak_test",
    "redundant_heads",
    "statistics_from_weights",
]
