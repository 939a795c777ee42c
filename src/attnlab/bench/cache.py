"""The result cache: a finished case of a suite that trains, kept per version of the code and the machine.

An arena case takes minutes; measured once, it says the same until the code, torch or the CPU
changes. The cache keeps every ``ok`` record of a suite whose :attr:`~attnlab.bench.suite.Suite.cached`
is set, under a key made of

* the case as the journal knows it (:func:`attnlab.bench.runner.case_key`: what it measures, with
  no paths and no thread counts), and
* this environment's :func:`fingerprint`: attnlab's version and git commit, torch's version and
  the CPU model.

A later run, in any folder, reuses the record (marked ``reused`` with the date it was measured)
unless ``--fresh`` asks for new measurements. Files live under ``$ATTNLAB_CACHE/bench``, else
``~/.cache/attnlab/bench``; each is written to a temporary
file and renamed, so a killed run leaves no half-written entry.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..utils import cpu_model


def default_root() -> Path:
    """``$ATTNLAB_CACHE/bench``, else ``~/.cache/attnlab/bench`` (beside the calibration file)."""
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab").expanduser() / "bench"


@functools.lru_cache(maxsize=1)
def commit() -> str:
    """The git commit attnlab's source is at (``unknown`` outside a git checkout: an installed wheel).

    Uncommitted changes to the package add ``+`` and a hash of their diff, so results of edited
    code are never taken for the commit's.
    """
    here = Path(__file__).resolve().parent.parent  # the attnlab package

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=20,
                              check=True).stdout

    try:
        if not git("ls-files", "--", "__init__.py").strip():  # installed inside someone else's checkout
            return "unknown"
        head = git("rev-parse", "HEAD").strip()
        diff = git("diff", "HEAD", "--", ".")
        new = git("ls-files", "--others", "--exclude-standard", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    if not diff and not new:
        return head
    h = hashlib.sha256(diff.encode())
    for name in new.split():
        h.update(name.encode() + (here / name).read_bytes())
    return f"{head}+{h.hexdigest()[:12]}"


def fingerprint() -> dict[str, str]:
    """What a cached result depends on besides its case: the code's version and commit, torch's, the CPU."""
    return {"attnlab": __version__, "commit": commit(), "torch": torch.__version__, "cpu": cpu_model()}


class ResultCache:
    """Cached records of one environment (:func:`fingerprint`).

    Args:
        root: the cache folder (None: :func:`default_root`).
        fresh: reuse nothing (new results are still stored).
    """

    def __init__(self, root: str | Path | None = None, fresh: bool = False):
        self.fingerprint = fingerprint()
        tag = hashlib.sha256(json.dumps(self.fingerprint, sort_keys=True).encode()).hexdigest()[:16]
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.dir = self.root / tag
        self.fresh = fresh

    def _path(self, key: str) -> Path:
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def get(self, key: str) -> dict[str, Any] | None:
        """The record cached under ``key`` with its ``reused`` mark, or None (none, ``fresh``, or unreadable)."""
        if self.fresh:
            return None
        path = self._path(key)
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if entry.get("key") != key:  # a hash collision, or a file from elsewhere
            return None
        rec = dict(entry["record"])
        rec["reused"] = {"measured": entry["measured"], "cache": str(self.dir)}
        rec["notes"] = [*rec.get("notes", []), f"reused from the result cache (measured {entry['measured']} by this "
                                               "version on this CPU; --fresh measures it again)"]
        return rec

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Keep an ``ok`` record under ``key`` (others, and records that were reused, are not kept)."""
        if record.get("status") != "ok" or record.get("reused"):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        measured = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "measured": measured, "fingerprint": self.fingerprint,
                                   "record": record}))
        os.replace(tmp, path)

    def describe(self) -> str:
        """One phrase for the run's notes."""
        fp = self.fingerprint
        where = f"result cache {self.dir} (attnlab {fp['attnlab']} at {fp['commit']}, torch {fp['torch']}, {fp['cpu']})"
        return where + (": --fresh, nothing reused" if self.fresh else "")


__all__ = ["ResultCache", "commit", "default_root", "fingerprint"]
