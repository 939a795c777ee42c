"""``attnlab data list`` and ``attnlab data fetch NAME|all [--from DIR]``: a thin skin over :mod:`attnlab.data`."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from .catalogue import DATASETS
from .fetch import data_root, fetch, status

__all__ = ["add_data_parser"]


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} KB"


def _list(args: argparse.Namespace) -> int:
    rows = status()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(tabulate([[r["name"], _size(r["size_bytes"]), "yes" if r["present"] else "no", r["license"], r["path"]]
                    for r in rows], headers=["data set", "size", "here", "license", "where"]))
    print(f"\nfetch one with: attnlab data fetch NAME   (into {data_root()}; set ATTNLAB_DATA to change it)")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    names = list(DATASETS) if args.name == ["all"] else args.name
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"unknown data set(s) {unknown}: expected names from {sorted(DATASETS)} or 'all'")
    for name in names:
        folder = fetch(name, args.source, progress=not args.quiet, force=args.force)
        print(f"{name}: {folder}")
    return 0


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``attnlab data`` (``list``, ``fetch``) to the main parser's subcommands."""
    p = sub.add_parser("data", help="the public data sets the tasks read: list them, fetch and verify them")
    dsub = p.add_subparsers(dest="data_command", required=True)
    pl = dsub.add_parser("list", help="each data set: size, license, where it is cached, whether it is here")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.set_defaults(func=_list)
    pf = dsub.add_parser("fetch", help="download (or import with --from) data sets, checking every file's SHA-256")
    pf.add_argument("name", nargs="+", help=f"data set names ({', '.join(DATASETS)}) or 'all'")
    pf.add_argument("--from", dest="source", default=None, metavar="DIR",
                    help="import from this local folder (the published files, or a subfolder per data set) "
                         "instead of downloading")
    pf.add_argument("--force", action="store_true", help="fetch again even when it is already here")
    pf.add_argument("--quiet", action="store_true", help="no progress bars")
    pf.set_defaults(func=_fetch)
