"""The ``attnlab`` command: a thin skin over library calls, one function per subcommand.

Errors are one line on stderr, ``attnlab COMMAND: message``, and exit status 2, never a
traceback: :func:`main` runs the subcommand through :func:`attnlab.command.run_command`,
which catches what it raises. ``ATTNLAB_DEBUG=1`` lets the exception through instead,
traceback and all. An interrupt (Ctrl-C) is one line too, with the shell's status for it, 130.
A subcommand module that fails to import is such an error too, naming the module.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from .command import one_line, run_command

__all__ = ["build_parser", "main", "one_line", "run_command"]


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
    (".deploy.cli", "add_export_parser"),
    (".data.cli", "add_data_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from . import __version__

    p = argparse.ArgumentParser(prog="attnlab", description="self-attention and Transformers, exact and efficient, measured")
    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    pi = sub.add_parser("info", help="versions, device, and which attention backend serves which call")
    pi.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    pi.add_argument("--json", action="store_true", help="print JSON instead of text")
    pi.set_defaults(func=_info)
    for module, adder in _SUBCOMMANDS:
        try:
            mod = importlib.import_module(module, __package__)
        except ImportError as e:
            raise ImportError(f"the subcommands of attnlab{module} failed to import: {one_line(str(e))}") from e
        getattr(mod, adder)(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: the exit status (errors: one line on stderr, 2)."""
    try:
        parser = build_parser()
    except ImportError as e:
        if os.environ.get("ATTNLAB_DEBUG", "") not in ("", "0"):
            raise
        print(f"attnlab: {one_line(str(e))}", file=sys.stderr)
        return 2
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
