"""``attnlab view`` and ``attnlab analyze``: thin parsers over :mod:`attnlab.viz` and the analysis.

    attnlab view --pretrained minilm "The animal didn't cross the street because it was too tired"
    attnlab view CHECKPOINT "text" --out page.html --serve
    attnlab view HF_MODEL_FOLDER "text"      # transformers with attnlab attention (token ids without a tokenizer)
    attnlab view --pretrained minilm "text" --compare performer:features=64
    attnlab analyze --pretrained minilm "text"
    attnlab analyze runs/cora --node 42 --against runs/cora-gatv2   # a graph model: one node's neighbours
    attnlab view runs/cora --node 42 --against runs/cora-gatv2 --out node42.html

The lead wires them in with ``add_view_parser(sub)`` and ``add_analyze_parser(sub)``;
each sets ``func`` so that ``args.func(args)`` runs the command.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..command import run_command

__all__ = ["add_analyze_parser", "add_view_parser", "parse_mechanism", "run_analyze", "run_view"]


def parse_mechanism(spec: str) -> tuple[str, dict]:
    """``"performer:features=64,orthogonal=false"`` -> ``("performer", {"features": 64, "orthogonal": False})``."""
    name, _, rest = spec.partition(":")
    if not name:
        raise ValueError(f"--compare must be NAME or NAME:key=value,..., got {spec!r}")
    settings = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--compare settings must be key=value, got {item!r} in {spec!r}")
        try:
            settings[key] = json.loads(val.lower() if val.lower() in ("true", "false", "null") else val)
        except json.JSONDecodeError:
            settings[key] = val
    return name, settings


def _source_and_text(args: argparse.Namespace):
    from .source import load_source

    rest = list(args.inputs)
    if args.pretrained:
        if len(rest) != 1:
            raise ValueError(f"with --pretrained give exactly one TEXT, got {len(rest)} arguments")
        spec, text = args.pretrained, rest[0]
    else:
        if len(rest) != 2:
            raise ValueError(f"give CHECKPOINT TEXT (or --pretrained minilm TEXT), got {len(rest)} arguments")
        spec, text = rest
    return load_source(spec), text


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="[CHECKPOINT] TEXT",
                   help="a checkpoint directory (save_pretrained, with tokenizer.json or vocab.json) or a Hugging "
                        "Face model folder (run with attnlab attention; TEXT is token ids like '12 7 33' when it has "
                        "no tokenizer), and the text")
    p.add_argument("--pretrained", choices=["minilm"], default=None,
                   help="use the pretrained all-MiniLM-L6-v2 instead of a checkpoint")
    g = p.add_argument_group("graph models (attnlab train cora / citeseer)")
    g.add_argument("--node", type=int, default=None,
                   help="give one CHECKPOINT of a graph model: this node's neighbours' weights per head, each head's "
                        "entropy against uniform, and whether its attention is static (GAT) or dynamic (GATv2)")
    g.add_argument("--against", metavar="CHECKPOINT", default=None,
                   help="with --node: a second graph model on the same graph, shown beside the first")
    g.add_argument("--data", default=None, help="with --node: the graph's data folder (default: the run's)")


def _graph_reports(args: argparse.Namespace) -> list:
    """The :class:`~attnlab.diagnostics.graph.GraphReport` of ``args.node`` for the checkpoint (and ``--against``)."""
    from ..diagnostics.graph import analyze_graph_model
    from ..train import load_run

    if args.pretrained or len(args.inputs) != 1:
        raise ValueError(f"with --node give exactly one CHECKPOINT (a graph model's run), got {len(args.inputs)} "
                         f"arguments")
    reports, graph = [], None
    for ckpt in [args.inputs[0]] + ([args.against] if args.against else []):
        task, model, _ = load_run(ckpt, data=args.data, need_data=True)
        if not hasattr(task, "graph"):
            raise ValueError(f"--node needs a graph model's checkpoint (task cora or citeseer); {ckpt} is task "
                             f"{task.name!r}")
        if graph is not None and (task.name, task.graph.num_nodes) != graph:
            raise ValueError(f"--against must be a model of the same graph ({graph[0]}), got task {task.name!r}")
        graph = (task.name, task.graph.num_nodes)
        reports.append(analyze_graph_model(model, task.graph.x, task.graph.edge_index, args.node,
                                           name=f"{ckpt} ({task.name})"))
    return reports


def _graph_view(args: argparse.Namespace) -> int:
    from .graph_page import write_graph_page

    reports = _graph_reports(args)
    out = args.out if args.out != "attention.html" else f"node{args.node}.html"
    path = write_graph_page(out, reports, title=f"graph attention: node {args.node}")
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB; node {args.node}, {len(reports)} model(s))")
    if args.serve:
        from .explorer import serve

        serve(path, port=args.port)
    return 0


def run_view(args: argparse.Namespace) -> int:
    """Build the explorer page for the model and text in ``args``; optionally serve it."""
    from .explorer import serve, write_explorer
    from .source import approximate_attention, text_attention

    if args.node is not None:
        return _graph_view(args)

    source, text = _source_and_text(args)
    exact = text_attention(source, text)
    kwargs = {}
    if args.compare:
        name, settings = parse_mechanism(args.compare)
        other = approximate_attention(source, text, name, **settings)
        kwargs = {"compare": other.weights, "names": ("exact", other_name(name, settings))}
    head = "all" if args.head == "all" else int(args.head)
    path = write_explorer(args.out, exact.weights, exact.tokens, title=f"{source.name}: attention",
                          subtitle=text, layer=args.layer, head=head, **kwargs)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB; {len(exact.weights)} layers, "
          f"{exact.weights[0].shape[0]} heads, {len(exact.tokens)} tokens)")
    if args.serve:
        serve(path, port=args.port)
    return 0


def other_name(name: str, settings: dict) -> str:
    return name + ("(" + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")" if settings else "")


def run_analyze(args: argparse.Namespace) -> int:
    """Print the per-head table (and redundant head pairs) for the model and text in ``args``."""
    from ..diagnostics.analysis import analyze_heads, format_head_table, head_similarity, redundant_heads
    from .source import text_attention

    if args.node is not None:
        from ..diagnostics.graph import format_graph_report

        reports = _graph_reports(args)
        if args.json:
            print(json.dumps([r.to_dict() for r in reports], indent=2))
        else:
            print("\n\n".join(format_graph_report(r, top=args.top) for r in reports))
        return 0
    source, text = _source_and_text(args)
    ta = text_attention(source, text)
    layers = [w.unsqueeze(0) for w in ta.weights]  # each (1, H, N, N)
    stats = analyze_heads(layers, ta.tokens)
    if args.layer is not None:
        stats = [s for s in stats if s.layer == args.layer]
    pairs = redundant_heads(head_similarity(layers), ta.weights[0].shape[0], args.similar)
    if args.json:
        print(json.dumps({"tokens": ta.tokens, "heads": [s.to_dict() for s in stats],
                          "redundant": [{"a": a, "b": b, "similarity": s} for a, b, s in pairs]}, indent=2))
        return 0
    print(f"{source.name} on {text!r}")
    print("tokens: " + " ".join(ta.tokens))
    print(format_head_table(stats))
    n_abn = sum(s.abnormal for s in stats)
    print(f"\n{n_abn} of {len(stats)} heads put at least half their attention on separators / the first token")
    print(f"redundant pairs (similarity >= {args.similar}): {len(pairs)}")
    for (la, ha), (lb, hb), s in pairs[: args.top]:
        print(f"  layer {la} head {ha}  ~  layer {lb} head {hb}   {s:.3f}")
    return 0


def add_view_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``view`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser("view", help="write a self-contained HTML attention explorer for a model and a text",
                              description="Run a model on TEXT and write one self-contained HTML explorer page "
                                          "(no network, no notebook); --serve serves it on localhost.")
    _add_common(p)
    p.add_argument("--out", default="attention.html", help="output HTML file (default attention.html)")
    p.add_argument("--layer", type=int, default=0, help="layer shown first")
    p.add_argument("--head", default="0", help="head shown first, or 'all'")
    p.add_argument("--compare", metavar="MECH[:k=v,...]", default=None,
                   help="also show the weights this mechanism (e.g. performer:features=64) gives on the same "
                        "queries and keys of every layer, side by side with exact attention and their difference")
    p.add_argument("--serve", action="store_true", help="serve the page on http://127.0.0.1:PORT/ after writing it")
    p.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000)")
    p.set_defaults(func=run_view)
    return p


def add_analyze_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``analyze`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser("analyze", help="per-head entropy, distance, pattern label and abnormal flag",
                              description="Run a model on TEXT and print every head's pattern label, entropy, "
                                          "mean distance and sink mass, and the most redundant head pairs.")
    _add_common(p)
    p.add_argument("--layer", type=int, default=None, help="only this layer")
    p.add_argument("--similar", type=float, default=0.95, help="similarity threshold for redundant pairs (default 0.95)")
    p.add_argument("--top", type=int, default=10, help="how many redundant pairs to list")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_analyze)
    return p


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m attnlab.viz.cli view ...``), with the main CLI's one-line errors."""
    p = argparse.ArgumentParser(prog="attnlab")
    sub = p.add_subparsers(dest="command", required=True)
    add_view_parser(sub)
    add_analyze_parser(sub)
    return run_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
