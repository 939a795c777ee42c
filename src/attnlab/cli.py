"""The ``attnlab`` command: a thin skin over library calls, one function per subcommand."""

from __future__ import annotations

import argparse
import json
import sys


def _info(args: argparse.Namespace) -> int:
    from .info import collect, format_info

    info = collect(args.device)
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


#: (module, function adding its subcommands); each module owns its arguments
_SUBCOMMANDS = (
    (".bench.cli", "add_bench_parser"),
    (".train.cli", "add_train_parsers"),
    (".viz.cli", "add_view_parser"),
    (".viz.cli", "add_analyze_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="attnlab", description="self-attention and Transformers, exact and efficient, measured")
    sub = p.add_subparsers(dest="command", required=True)
    pi = sub.add_parser("info", help="versions, device, and which attention backend serves which call")
    pi.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    pi.add_argument("--json", action="store_true", help="print JSON instead of text")
    pi.set_defaults(func=_info)
    import importlib

    for module, adder in _SUBCOMMANDS:
        try:
            mod = importlib.import_module(module, __package__)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("attnlab"):
                continue  # that part of attnlab is not installed in this build
            raise
        getattr(mod, adder)(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
