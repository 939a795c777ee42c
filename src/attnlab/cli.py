"""The ``attnlab`` command: a thin skin over library calls, one function per subcommand.

Errors are one line on stderr, ``attnlab COMMAND: message``, and exit status 2, never a
traceback: :func:`main` runs the subcommand through :func:`attnlab.command.run_command`,
which catches what it raises. ``ATTNLAB_DEBUG=1`` lets the exception through instead,
traceback and all. An interrupt (Ctrl-C) is one line too, with the shell's status for it, 130.
A subcommand module that fails to import is such an error too.
"""

from __future__ import annotations

import argparse
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (each subcommand module owns its arguments).

    The subcommand modules are imported here rather than at the top, so that ``attnlab --help``
    and a failing import still end in one line (see :func:`main`); the imports are plain ones,
    so the import contract sees everything the command imports.
    """
    from . import __version__

    try:
        from .bench.cli import add_bench_parser
        from .data.cli import add_data_parser
        from .deploy.cli import add_export_parser
        from .train.cli import add_train_parsers
        from .viz.cli import add_analyze_parser, add_view_parser
        from .viz.plots import plot_attention
    except ImportError as e:
        raise ImportError(f"the subcommands of attnlab failed to import: {one_line(str(e))}") from e

    p = argparse.ArgumentParser(prog="attnlab", description="self-attention and Transformers, exact and efficient, measured")
    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    pi = sub.add_parser("info", help="versions, device, and which attention backend serves which call")
    pi.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    pi.add_argument("--json", action="store_true", help="print JSON instead of text")
    pi.set_defaults(func=_info)
    add_bench_parser(sub)
    add_train_parsers(sub, draw_map=plot_attention)
    add_view_parser(sub)
    add_analyze_parser(sub)
    add_export_parser(sub)
    add_data_parser(sub)
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
