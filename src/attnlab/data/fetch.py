"""Fetching, verifying and finding the data sets of :mod:`attnlab.data.catalogue`.

Where data lives: ``$ATTNLAB_DATA`` when it is set, else ``~/.cache/attnlab/data`` (or under
``$XDG_CACHE_HOME``)
(:func:`data_root`); one folder per data set. A task looks for its data in the path the user
gave (``--data``), then under ``$ATTNLAB_DATA``, then in the cache (:func:`locate`), and
when none has it, the error says ``attnlab data fetch NAME``.

:func:`fetch` downloads each published file with the standard library (``urllib``) into a
temporary file beside its destination, hashing as it goes, and renames it into place only
when its SHA-256 is the catalogue's: a download that is cut, killed or wrong leaves nothing
under the data set's name (a killed process's ``.part`` file is swept on the next fetch).
``fetch(..., source=DIR)`` imports the same files from a local folder instead, checked the
same way: an offline machine's route, and how CI imports its copies.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tqdm.auto import tqdm

from . import planetoid
from .catalogue import DATASETS, DataSet, FileSpec, dataset

__all__ = ["MissingDataError", "cache_root", "data_root", "fetch", "locate", "present", "roots", "status"]

#: seconds a download may wait for the server before it is called offline
TIMEOUT_S = 30.0
_CHUNK = 1 << 16
#: a zip member larger than this is refused before it is read (the archives hold a few hundred KB)
_MAX_MEMBER = 1 << 28


class MissingDataError(ValueError):
    """A data set (or a file a task was pointed at) is not there; the message says how to get it."""


def cache_root() -> Path:
    """The cache: ``$XDG_CACHE_HOME/attnlab/data``, else ``~/.cache/attnlab/data``."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "attnlab" / "data"


def data_root() -> Path:
    """Where :func:`fetch` writes: ``$ATTNLAB_DATA``, else :func:`cache_root`."""
    env = os.environ.get("ATTNLAB_DATA")
    return Path(env).expanduser() if env else cache_root()


def roots() -> list[Path]:
    """Where :func:`locate` looks, in order: ``$ATTNLAB_DATA`` (when set), then the cache."""
    cache = cache_root()
    env = os.environ.get("ATTNLAB_DATA")
    return [Path(env).expanduser(), cache] if env and Path(env).expanduser() != cache else [cache]


def present(ds: DataSet | str, root: str | Path | None = None) -> bool:
    """Whether ``root`` (default :func:`data_root`) holds every file the data set keeps."""
    ds = dataset(ds) if isinstance(ds, str) else ds
    folder = Path(root if root is not None else data_root()) / ds.folder
    return all((folder / f).is_file() for f in ds.kept())


def _fetch_hint(name: str) -> str:
    return f"run: attnlab data fetch {name} (or, offline: attnlab data fetch {name} --from DIR, a folder with its files)"


def locate(name: str, root: str | Path | None = None) -> Path:
    """The folder holding data set ``name``.

    Args:
        name: a catalogue name.
        root: a data folder the user named (``--data``): its subfolder for the data set, or
            the folder itself when it holds the files; None looks under ``$ATTNLAB_DATA``,
            then in the cache (:func:`roots`).

    Raises:
        MissingDataError: when it is not there, naming where it looked and the fetch command.
    """
    ds = dataset(name)
    if root is not None:
        r = Path(root).expanduser()
        for cand in (r / ds.folder, r):
            if all((cand / f).is_file() for f in ds.kept()):
                return cand
        raise MissingDataError(f"data set {name!r} is not in {r} (nor in {r / ds.folder}); {_fetch_hint(name)}")
    for r in roots():
        if present(ds, r):
            return r / ds.folder
    looked = " and ".join(str(r / ds.folder) for r in roots())
    raise MissingDataError(f"data set {name!r} is not here (looked in {looked}); {_fetch_hint(name)}")


def status() -> list[dict]:
    """One row per data set: name, size, license, where it is (or would be) cached, and whether it is there."""
    rows = []
    for ds in DATASETS.values():
        where = next((r / ds.folder for r in roots() if present(ds, r)), None)
        rows.append({"name": ds.name, "size_bytes": ds.size_bytes, "license": ds.license,
                     "path": str(where or data_root() / ds.folder), "present": where is not None,
                     "description": ds.description, "citation": ds.citation})
    return rows


def _sweep(staging: Path) -> None:
    """Remove leftovers of fetches whose process is gone (named ``NAME-PID-*``)."""
    for d in staging.glob("*-*-*"):
        try:
            pid = int(d.name.split("-")[-2])
            os.kill(pid, 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            continue


@contextlib.contextmanager
def _staging(root: Path, name: str) -> Iterator[Path]:
    """A private folder under ``root/.partial`` for one fetch, removed afterwards whatever happens."""
    staging = root / ".partial"
    staging.mkdir(parents=True, exist_ok=True)
    _sweep(staging)
    d = Path(tempfile.mkdtemp(dir=staging, prefix=f"{name}-{os.getpid()}-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _copy_hashed(read, out: Path, total: int | None, label: str, progress: bool) -> str:
    """Stream ``read(n)`` into ``out``; the SHA-256 of what was written."""
    h = hashlib.sha256()
    with open(out, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, desc=label, leave=False,
                                    disable=not progress) as bar:
        while chunk := read(_CHUNK):
            f.write(chunk)
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _download(url: str, out: Path, progress: bool) -> str:
    """``url`` into ``out``; its SHA-256. OSError (naming the URL and ``--from``) when it cannot be had whole."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            length = r.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            digest = _copy_hashed(r.read1, out, total, Path(url).name, progress)  # read1: what has arrived
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise OSError(f"could not download {url} ({reason})") from None
    if total is not None and out.stat().st_size != total:
        raise OSError(f"could not download {url} (got {out.stat().st_size} of {total} bytes)")
    return digest


def _mismatch(what: str, got: str, want: str) -> ValueError:
    return ValueError(f"{what}: its SHA-256 is {got}, expected {want}; it is not the published file, nothing was kept")


def _from_urls(spec: FileSpec, staging: Path, progress: bool) -> Path:
    """The verified file of ``spec`` in ``staging``, downloaded from its first URL that works."""
    errors = []
    for url in spec.urls:
        if spec.archive_member is None:
            out = staging / spec.name
            try:
                digest = _download(url, out, progress)
            except OSError as e:
                errors.append(str(e))
                continue
            if digest != spec.sha256:
                raise _mismatch(url, digest, spec.sha256)
            return out
        archive = staging / ("archive-" + hashlib.sha256(url.encode()).hexdigest()[:12] + ".zip")
        if not archive.is_file():
            try:
                _download(url, archive, progress)
            except OSError as e:
                archive.unlink(missing_ok=True)
                errors.append(str(e))
                continue
        return _extract(archive, spec, staging, url)
    raise OSError("; ".join(errors))


def _extract(archive: Path, spec: FileSpec, staging: Path, url: str) -> Path:
    out = staging / spec.name
    try:
        with zipfile.ZipFile(archive) as z:
            info = z.getinfo(spec.archive_member)
            if info.file_size > _MAX_MEMBER:
                raise ValueError(f"{url}: member {spec.archive_member!r} is {info.file_size} bytes, over the cap")
            with z.open(info) as member:
                digest = _copy_hashed(member.read, out, info.file_size, spec.name, False)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"{url}: not the published archive ({e})") from None
    if digest != spec.sha256:
        raise _mismatch(f"{url} ({spec.archive_member})", digest, spec.sha256)
    return out


def _from_folder(spec: FileSpec, source: Path, folder: str, staging: Path) -> Path:
    """The verified copy of ``spec`` from ``source`` (or its ``folder`` subfolder) in ``staging``."""
    for cand in (source / spec.name, source / folder / spec.name):
        if cand.is_file():
            out = staging / spec.name
            with open(cand, "rb") as f:
                digest = _copy_hashed(f.read, out, None, spec.name, False)
            if digest != spec.sha256:
                raise _mismatch(str(cand), digest, spec.sha256)
            return out
    raise MissingDataError(f"{spec.name} is not in {source} (nor in {source / folder})")


def fetch(name: str | DataSet, source: str | Path | None = None, *, root: str | Path | None = None,
          progress: bool = True, force: bool = False) -> Path:
    """Download (or import from ``source``) one data set, verify every file, and keep it under ``root``.

    Args:
        name: a catalogue name (``attnlab data list``) or a :class:`DataSet` manifest.
        source: a local folder holding the published files (or a subfolder named after the data
            set's folder); None downloads them from their URLs.
        root: where to keep it (default :func:`data_root`).
        progress: draw a progress bar per download (tqdm, on stderr).
        force: fetch again even when the data set is already there.

    Returns:
        the data set's folder.

    Raises:
        ValueError: a file whose SHA-256 is not the catalogue's (nothing is kept).
        OSError: a download that failed (offline, refused, cut short), naming the URL and ``--from``.
        MissingDataError: ``source`` lacks one of the files.
    """
    ds = dataset(name) if isinstance(name, str) else name
    root = Path(root).expanduser() if root is not None else data_root()
    folder = root / ds.folder
    if not force and present(ds, root):
        return folder
    src = Path(source).expanduser() if source is not None else None
    if src is not None and not src.is_dir():
        raise MissingDataError(f"--from {src}: no such folder")
    with _staging(root, ds.name) as staging:
        try:
            files = [_from_folder(s, src, ds.folder, staging) if src is not None else _from_urls(s, staging, progress)
                     for s in ds.files]
        except OSError as e:
            raise OSError(f"{e}; offline? copy the files to a folder and run: attnlab data fetch {ds.name} "
                          f"--from DIR") from None
        folder.mkdir(parents=True, exist_ok=True)
        if ds.convert == "planetoid":
            planetoid.convert(staging, ds.name, folder / f"{ds.name}.npz")
        else:
            for f in files:
                os.replace(f, folder / f.name)  # same file system: atomic
    return folder
