"""The ``attnlab`` command: a thin skin over library calls, one function per subcommand.

Errors are one line on stderr, ``attnlab COMMAND: message``, and exit status 2, never a
traceback: :func:`main` catches what a subcommand raises (and the ``SystemExit("attnlab
bench: ...")`` messages some subcommands raise themselves). ``ATTNLAB_DEBUG=1`` lets the
exception through instead, traceback and all. An interrupt (Ctrl-C) is one line too, with
the shell's status for it, 130.
"""

from __future__ import annotations

import argparse
import json
import os
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


#: what a user can cause (bad arguments, missing or damaged files, a missing optional package,
#: a diverging run); anything else is reported as a bug, still on one line
_USER_ERRORS = (ValueError, OSError, ImportError, FloatingPointError)


def one_line(text: str) -> str:
    """``text`` with its lines joined by "; " (an error message must stay one line)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _debug() -> bool:
    return os.environ.get("ATTNLAB_DEBUG", "") not in ("", "0")


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; its errors become one line on stderr and status 2 (130 on Ctrl-C)."""
    prog = f"attnlab {args.command}"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if _debug():
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise  # a status (argparse, sys.exit(n))
        if _debug():  # the traceback of what the message reports, with its own cause
            cause = e.__cause__ or e
            raise cause from cause.__cause__
        message = one_line(e.code)
        print(message if message.startswith("attnlab ") else f"{prog}: {message}", file=sys.stderr)
        return 2
    except Exception as e:
        if _debug():
            raise
        text = one_line(str(e)) or type(e).__name__
        if not isinstance(e, _USER_ERRORS):
            text = f"{type(e).__name__}: {text} (a bug? ATTNLAB_DEBUG=1 shows the traceback)"
        print(f"{prog}: {text}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: the exit status (errors: one line on stderr, 2)."""
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
