"""Seeing attention: heat maps (matplotlib, the ``viz`` extra) and a self-contained HTML explorer.

* :func:`plot_attention`, :func:`plot_heads`, :func:`plot_mask` - pictures; long
  sequences are pooled, not refused. Matplotlib is imported on first use and, when
  missing, the error names ``pip install "attnlab[viz]"``.
* :func:`explorer_html`, :func:`write_explorer`, :func:`serve` - the explorer page
  (``attnlab view``), no network and no notebook.
* :func:`plot_spans`, :func:`span_history` - adaptive span's learned spans over a run.
* :func:`load_source`, :func:`text_attention`, :func:`approximate_attention`,
  :func:`with_mechanism` - run MiniLM or a checkpoint on text to get the maps.
"""

from .explorer import explorer_html, serve, stack_layers, write_explorer
from .plots import plot_attention, plot_heads, plot_mask, pool_map
from .source import ModelSource, TextAttention, approximate_attention, load_source, text_attention, with_mechanism
from .spans import plot_spans, span_history

__all__ = [
    "ModelSource",
    "TextAttention",
    "approximate_attention",
    "explorer_html",
    "load_source",
    "plot_attention",
    "plot_heads",
    "plot_mask",
    "plot_spans",
    "pool_map",
    "serve",
    "span_history",
    "stack_layers",
    "text_attention",
    "with_mechanism",
    "write_explorer",
]
