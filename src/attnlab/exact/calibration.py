"""Measured cost constants for ``auto``: ``attnlab bench calibrate`` writes them, ``auto`` reads them.

Every backend's :meth:`~attnlab.exact.registry.Backend.estimate` is a cost model in
shared units (flop-equivalents at SDPA's speed on the machine it was fitted on). On another
machine the backends' relative speeds differ, so ``auto`` can pick a backend that is
slower there. :func:`attnlab.bench.calibrate.calibrate` times each backend on a small grid of calls (mask kinds x
lengths, forward and forward+backward) and fits, per backend and mode, a straight line
``seconds = scale * estimate + overhead`` by least squares. :func:`write` stores the
constants with the identity of the machine and software in a per-user cache file
(:func:`cache_path`: ``$ATTNLAB_CACHE/calibration.json``, default
``~/.cache/attnlab/calibration.json``).

:func:`predict` turns a backend's estimate into predicted seconds: with the measured line
when a valid file for this torch version and CPU exists, else with the shipped default
(:data:`DEFAULT_SECONDS_PER_UNIT`, no overhead). :func:`status` says which constants are in
use and where they came from (``attnlab info`` prints it). A corrupt file, or one measured
with another torch or on another CPU, is ignored, and the status line says why.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import torch

from ..utils import cpu_model

__all__ = ["DEFAULT_SECONDS_PER_UNIT", "VERSION", "cache_path", "fit", "identity", "load", "predict", "status", "write"]

#: the shipped cost models' units: flop-equivalents at 2.2e11 per second (SDPA's CPU kernel on
#: the 2-core x86 machine the defaults were fitted on)
DEFAULT_SECONDS_PER_UNIT = 1.0 / 2.2e11

#: the calibration file's format version
VERSION = 1

_cache: dict[str, Any] = {}


def cache_path() -> Path:
    """The calibration file: ``$ATTNLAB_CACHE/calibration.json`` or ``~/.cache/attnlab/calibration.json``."""
    root = os.environ.get("ATTNLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "attnlab")
    return Path(root) / "calibration.json"




def identity() -> dict[str, Any]:
    """What a calibration is valid for: the torch version, the CPU model, the thread count, and
    the native kernel build ``chunked`` runs here (its ``info()``, which names the softmax ISA: the AVX-512
    and AVX2 builds differ in speed, and both differ from the fused path's; False when it is not in use)."""
    from .native_build import library, status

    native = library().info() if status() is None else False
    return {"torch": torch.__version__, "cpu": cpu_model(), "threads": torch.get_num_threads(), "native": native}


def load(path: Path | None = None) -> tuple[dict[str, dict[str, list[float]]] | None, str]:
    """``(constants, status line)``: the constants of a valid file for this machine, else None and why.

    ``constants[backend][mode] = [scale, overhead_s]`` with ``mode`` ``fwd`` or ``fwd_bwd``.
    Cached per file modification time.
    """
    p = Path(path) if path is not None else cache_path()
    try:
        stamp = p.stat().st_mtime_ns
    except OSError:
        return None, f"shipped defaults (no calibration file at {p}; 'attnlab bench calibrate' writes one)"
    key = f"{p}:{stamp}:{torch.get_num_threads()}"
    if key not in _cache:
        _cache.clear()
        _cache[key] = _read(p)
    return _cache[key]


def _read(p: Path) -> tuple[dict | None, str]:
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"format version {data.get('version') if isinstance(data, dict) else None!r}, "
                             f"expected {VERSION}")
        consts = data["constants"]
        for backend, modes in consts.items():
            for mode, pair in modes.items():
                if mode not in ("fwd", "fwd_bwd") or len(pair) != 2 or not all(
                        isinstance(x, (int, float)) and x == x for x in pair) or pair[0] <= 0:
                    raise ValueError(f"bad constants for {backend}/{mode}: {pair!r}")
        ident = data["identity"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"shipped defaults: {p} is not a valid calibration ({str(e)[:120]}); rerun 'attnlab bench calibrate'"
    here = identity()
    for what in ("torch", "cpu", "threads", "native"):
        if ident.get(what) != here[what]:
            return None, (f"shipped defaults: {p} was measured with {what} {ident.get(what)!r}, this is {here[what]!r}; "
                          "rerun 'attnlab bench calibrate'")
    return consts, f"measured by 'attnlab bench calibrate' on {data.get('created', '?')} ({p})"


def status() -> str:
    """One line: which cost constants ``auto`` uses and where they came from."""
    return load()[1]


def predict(backend: str, estimate: float, needs_grad: bool) -> float:
    """Predicted seconds of a call that ``backend`` estimates at ``estimate`` units."""
    if estimate == float("inf"):
        return estimate
    consts, _ = load()
    pair = (consts or {}).get(backend, {}).get("fwd_bwd" if needs_grad else "fwd")
    if pair is None:
        return estimate * DEFAULT_SECONDS_PER_UNIT
    return pair[0] * estimate * DEFAULT_SECONDS_PER_UNIT + pair[1]


def fit(points: list[tuple[float, float]]) -> list[float]:
    """Least-squares ``seconds = scale * (units * DEFAULT) + overhead`` with both >= 0 (scale > 0)."""
    xs = [x * DEFAULT_SECONDS_PER_UNIT for x, _ in points]
    ys = [y for _, y in points]
    if len(points) == 1 or max(xs) - min(xs) <= 0:
        return [max(ys[0] / xs[0], 1e-6) if xs[0] > 0 else 1.0, 0.0]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    scale = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    overhead = my - scale * mx
    if overhead < 0 or scale <= 0:  # force the line through the origin
        scale, overhead = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs), 0.0
    return [max(scale, 1e-6), overhead]


def write(data: dict[str, Any], path: Path | None = None) -> Path:
    """Write a calibration atomically (a temporary file renamed into place); returns the path."""
    p = Path(path) if path is not None else cache_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, p)
    _cache.clear()
    return p
