"""Diagnostics: checks that attention weights and outputs keep their contracts."""

from .checks import AttentionCheckError, AttentionReport, check_attention, leak_test

__all__ = ["AttentionCheckError", "AttentionReport", "check_attention", "leak_test"]
