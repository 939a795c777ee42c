"""A page of its own for graph attention: one node's neighbours, per head, for one or two trained models.

``attnlab view RUN --node 42 [--against OTHER_RUN]`` writes it. For each model
(:class:`attnlab.diagnostics.graph.GraphReport`): the node's incoming edges (self-loop
included) with their weight per head as bars, layer by layer; then per head the entropy of
the neighbour weights against the uniform distribution over the same neighbours, and the
ranking agreement that tells static attention (GAT: every query ranks the keys alike) from
dynamic (GATv2). Two models sit side by side. Plain HTML and CSS, no script, no network.

Page size O(layers x neighbours x heads) cells.
"""

from __future__ import annotations

import html
from pathlib import Path

from ..diagnostics.graph import GraphReport

__all__ = ["graph_page_html", "write_graph_page"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.models { display: flex; gap: 2.5em; flex-wrap: wrap; align-items: flex-start; }
table { border-collapse: collapse; margin: 0.4em 0 1.2em; font-size: 13px; }
th, td { padding: 2px 6px; text-align: right; border-bottom: 1px solid #eee; }
td.bar { width: 90px; position: relative; }
td.bar span { position: absolute; left: 0; top: 2px; bottom: 2px; background: #4a7bd0; opacity: 0.75; }
td.bar em { position: relative; font-style: normal; }
.self { color: #b0461b; }
.static { color: #b0461b; font-weight: 600; }
.dynamic { color: #2a7a3a; font-weight: 600; }
.note { color: #666; font-size: 12px; max-width: 60em; }
"""


def _neighbour_table(rows: list[dict], node: int, top: int) -> str:
    heads = len(rows[0]["weights"]) if rows else 0
    head = "".join(f"<th>head {h}</th>" for h in range(heads))
    body = []
    for r in rows[:top]:
        cls = ' class="self"' if r["source"] == node else ""
        label = f"{r['source']}" + (" (self)" if r["source"] == node else "")
        cells = "".join(f'<td class="bar"><span style="width:{100 * w:.1f}%"></span><em>{w:.3f}</em></td>'
                        for w in r["weights"])
        body.append(f"<tr><td{cls}>{label}</td>{cells}</tr>")
    more = f'<tr><td colspan="{heads + 1}">... {len(rows) - top} more</td></tr>' if len(rows) > top else ""
    return f"<table><tr><th>neighbour</th>{head}</tr>{''.join(body)}{more}</table>"


def _heads_table(report: GraphReport) -> str:
    rows = []
    for h in report.heads:
        kind = '<span class="static">static</span>' if h.static else '<span class="dynamic">dynamic</span>'
        rows.append(f"<tr><td>{h.layer}</td><td>{h.head}</td><td>{h.entropy:.4f}</td><td>{h.uniform:.4f}</td>"
                    f"<td>{h.ratio:.3f}</td><td>{h.top_share:.3f}</td><td>{h.discordance:.5f}</td>"
                    f"<td>{kind}</td></tr>")
    return ("<table><tr><th>layer</th><th>head</th><th>entropy</th><th>uniform</th><th>ratio</th>"
            "<th>top-key share</th><th>discordance</th><th></th></tr>" + "".join(rows) + "</table>")


def _model_block(report: GraphReport, top: int) -> str:
    parts = [f"<div><h2>{html.escape(report.name)} <small>({html.escape(report.conv)})</small></h2>",
             f"<p>node {report.node}: {report.degree} incoming edges, self-loop included</p>"]
    for layer, rows in enumerate(report.neighbours):
        parts.append(f"<h3>layer {layer}</h3>" + _neighbour_table(rows, report.node, top))
    q, k = report.sample
    parts.append(f"<h3>heads</h3><p class=\"note\">Entropy of each node's neighbour weights (nats, nodes with at "
                 f"least two neighbours) against the uniform distribution over the same neighbours; ranking "
                 f"agreement over {q} queries x {k} keys: the share of queries whose top key is the most common "
                 f"one, and the share of key pairs two queries order differently. 1 and 0 is static attention.</p>")
    parts.append(_heads_table(report) + "</div>")
    return "".join(parts)


def graph_page_html(reports: list[GraphReport], *, title: str = "graph attention", top: int = 25) -> str:
    """The page for one or more reports (of one node), side by side, as an HTML string.

    Raises:
        ValueError: without reports, or when they are about different nodes.
    """
    if not reports:
        raise ValueError("reports must hold at least one GraphReport")
    if len({r.node for r in reports}) != 1:
        raise ValueError(f"the reports must be about one node, got nodes {sorted({r.node for r in reports})}")
    blocks = "".join(_model_block(r, top) for r in reports)
    note = ("GAT's score LeakyReLU(a_dst.Wh_i + a_src.Wh_j) ranks every query's keys alike (Brody et al., ICLR 2022: "
            "static attention); GATv2's a.LeakyReLU(W_r h_i + W_l h_j) can rank them per query (dynamic).")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1><p class=\"note\">{note}</p>"
            f"<div class=\"models\">{blocks}</div></body></html>")


def write_graph_page(path: str | Path, reports: list[GraphReport], **kwargs) -> Path:
    """Write :func:`graph_page_html` to ``path`` (UTF-8) and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(graph_page_html(reports, **kwargs), encoding="utf-8")
    return p
