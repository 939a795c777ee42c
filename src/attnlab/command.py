"""Running one ``attnlab`` subcommand: its errors become one line on stderr, exit status 2.

:func:`run_command` catches what a subcommand raises and prints ``attnlab COMMAND:
message``, never a traceback; ``ATTNLAB_DEBUG=1`` lets the exception through instead. This is
the one error path of every subcommand: they raise (ValueError for what the user gave), they
never print their own errors or exit with a message. An interrupt (Ctrl-C) is one line too,
with the shell's status for it, 130.

The main CLI (:mod:`attnlab.cli`) and the stand-alone entries of the subcommand modules
(``python -m attnlab.train.cli``, ``python -m attnlab.viz.cli``) share it. It imports
nothing from attnlab, so those modules, which live in lower layers than the CLI, reach it
without importing upward.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["one_line", "run_command"]

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
    except Exception as e:
        if _debug():
            raise
        text = one_line(str(e)) or type(e).__name__
        if not isinstance(e, _USER_ERRORS):
            text = f"{type(e).__name__}: {text} (a bug? ATTNLAB_DEBUG=1 shows the traceback)"
        print(f"{prog}: {text}", file=sys.stderr)
        return 2
