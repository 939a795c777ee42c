"""Training checkpoints: model, optimizer, schedule, RNG and data position, without pickle.

A checkpoint is a directory ``OUT/checkpoints/step_XXXXXXXX/`` holding

* ``config.json`` + ``model.safetensors`` - exactly what
  :func:`attnlab.models.save_pretrained` writes, so ``from_pretrained`` loads a checkpoint;
* ``optimizer.safetensors`` - every optimizer state tensor under a structured key
  ``state.<param index>.<name>`` plus the RNG state tensors ``rng.torch.<rank>``,
  ``rng.rank.<rank>.cuda`` and ``rng.cuda.<device>`` (uint8; :func:`capture_rank_rng`);
* ``trainer_state.json`` - step, schedule settings, the optimizer's non-tensor state and
  param-group hyperparameters, Python's and NumPy's RNG states as lists, the data
  position and the run configuration;
* whatever the task needs to decode (vocabularies, tokenizer JSON).

It is written into a temporary sibling directory, each file flushed to disk, then
renamed into place in one ``os.replace``; ``OUT/latest`` (the name of the newest
checkpoint) is replaced the same way afterwards. A run killed at any moment leaves either
the previous complete checkpoint or the new complete one. Loading reads JSON and raw
tensor bytes only: nothing is unpickled. A file damaged after the fact (a full disk, a
bad copy) raises :class:`~attnlab.models.io.CorruptCheckpointError` naming it;
:func:`load_resumable` then falls back to the newest checkpoint that still loads, so
``--resume`` loses at most one save interval.

Time and memory O(parameters + optimizer state).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.io import CorruptCheckpointError, load_safetensors, read_json
from . import distributed

__all__ = [
    "FORMAT",
    "checkpoint_at",
    "capture_rng",
    "restore_rng",
    "capture_rank_rng",
    "restore_rank_rng",
    "flatten_optimizer",
    "unflatten_optimizer",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "resolve_checkpoint",
    "atomic_write_text",
    "checkpoints",
    "load_resumable",
    "CorruptCheckpointError",
]

FORMAT = "attnlab-checkpoint-1"
STATE_NAME = "trainer_state.json"
OPTIM_NAME = "optimizer.safetensors"
LATEST_NAME = "latest"


def _st():
    import safetensors.torch as st

    return st


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


# -- RNG ------------------------------------------------------------------------------
def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's RNG states: tensors (torch CPU, CUDA) and JSON (Python, NumPy)."""
    tensors = {"rng.torch.0": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    meta = {
        "python": [version, list(internal), gauss],
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any], rank: int = 0) -> None:
    """Set the RNGs from :func:`capture_rng` output (rank ``rank``'s torch state if stored)."""
    key = f"rng.torch.{rank}" if f"rng.torch.{rank}" in tensors else "rng.torch.0"
    torch.set_rng_state(tensors[key].to(torch.uint8))
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k].to(torch.uint8) for k in cuda][: torch.cuda.device_count()])
    if "python" in meta:
        version, internal, gauss = meta["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in meta:
        name, keys, pos, has_gauss, cached = meta["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def capture_rank_rng(info: distributed.DistInfo) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every rank's RNG states, gathered on every rank (rank 0 writes them).

    Tensors: ``rng.torch.<rank>`` (CPU) and ``rng.rank.<rank>.cuda`` (the rank's own CUDA
    device; ``rng.cuda.<i>`` from :func:`capture_rng` is rank 0's view of every device).
    JSON: rank 0's Python and NumPy states, and every rank's under ``ranks``.
    """
    rng_t, rng_j = capture_rng()
    per_rank = distributed.gather_tensors(rng_t["rng.torch.0"], info)
    rng_t.update({f"rng.torch.{r}": s for r, s in enumerate(per_rank)})
    if info.device.type == "cuda":
        own = torch.cuda.get_rng_state(info.device)
        rng_t.update({f"rng.rank.{r}.cuda": s for r, s in enumerate(distributed.gather_tensors(own, info))})
    if info.distributed:
        rng_j = {**rng_j, "ranks": distributed.gather_objects({"python": rng_j["python"], "numpy": rng_j["numpy"]}, info)}
    return rng_t, rng_j


def restore_rank_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any], info: distributed.DistInfo) -> None:
    """Set this rank's RNGs from :func:`capture_rank_rng` output (rank 0's where this rank has none)."""
    ranks = meta.get("ranks") or []
    restore_rng(tensors, ranks[info.rank] if info.rank < len(ranks) else meta, info.rank)
    own = tensors.get(f"rng.rank.{info.rank}.cuda")
    if own is not None and info.device.type == "cuda":
        torch.cuda.set_rng_state(own.to("cpu", torch.uint8), info.device)


# -- optimizer ------------------------------------------------------------------------
def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return {"__tuple__": [_jsonable(x) for x in v]}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise ValueError(f"optimizer state value of type {type(v).__name__} cannot be stored as JSON: {v!r}")


def _from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"__tuple__"}:
            return tuple(_from_json(x) for x in v["__tuple__"])
        return {k: _from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    return v


def flatten_optimizer(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``state.<idx>.<name>``) and JSON."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in state_dict["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = _jsonable(value)
    meta = {"param_groups": _jsonable(state_dict["param_groups"]), "scalars": scalars,
            "indices": [int(i) for i in state_dict["state"]]}
    return tensors, meta


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_optimizer`: a dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {int(i): {} for i in meta["indices"]}
    for key, value in tensors.items():
        if not key.startswith("state."):
            continue
        _, idx, name = key.split(".", 2)
        state[int(idx)][name] = value
    for idx, entry in meta["scalars"].items():
        state[int(idx)].update(_from_json(entry))
    return {"state": state, "param_groups": _from_json(meta["param_groups"])}


# -- save / load ----------------------------------------------------------------------
def _step_name(step: int) -> str:
    return f"step_{step:08d}"


def save_checkpoint(
    out: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    *,
    rng: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    assets: Callable[[Path], None] | None = None,
    keep: int = 2,
) -> Path:
    """Write a complete checkpoint of ``step`` under ``out/checkpoints`` atomically.

    Args:
        out: the run directory.
        step: optimizer steps completed.
        model: the (unwrapped) attnlab model.
        optimizer: its optimizer (None: weights only).
        state: JSON-ready trainer state (schedule, data position, run config...).
        rng: :func:`capture_rng` output (per-rank torch states may be merged in).
        extra_tensors: more tensors for ``optimizer.safetensors`` (e.g. a grad scaler's scale).
        assets: called with the temporary directory to write task files into.
        keep: keep this many newest checkpoints (older ones are deleted; 0 keeps all).

    Returns:
        The checkpoint directory.
    """
    from ..models.io import save_pretrained

    root = Path(out) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / _step_name(step)
    tmp = root / f".tmp-{_step_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_pretrained(model, tmp)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {"format": FORMAT, "step": int(step), **state}
    if optimizer is not None:
        opt_tensors, opt_meta = flatten_optimizer(optimizer.state_dict())
        tensors.update(opt_tensors)
        meta["optimizer"] = opt_meta
    if rng is not None:
        tensors.update({k: v.contiguous() for k, v in rng[0].items()})
        meta["rng"] = rng[1]
    if extra_tensors:
        tensors.update({f"extra.{k}": v.detach().to("cpu").contiguous() for k, v in extra_tensors.items()})
    _st().save_file(tensors, str(tmp / OPTIM_NAME), metadata={"format": FORMAT})
    (tmp / STATE_NAME).write_text(json.dumps(meta, indent=1, sort_keys=True))
    if assets is not None:
        assets(tmp)
    for f in tmp.iterdir():
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (a resumed run ending where it was killed)
        trash = root / f".old-{_step_name(step)}-{os.getpid()}"
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    atomic_write_text(Path(out) / LATEST_NAME, f"checkpoints/{final.name}\n")
    if keep > 0:
        done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
        for old in done[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_at(out: str | Path, step: int) -> Path:
    """The checkpoint directory of step ``step`` in run directory ``out`` (ValueError when it was not saved)."""
    path = Path(out) / "checkpoints" / _step_name(step)
    if not (path / STATE_NAME).is_file():
        have = [p.name for p in checkpoints(out)] if Path(out).is_dir() else []
        raise ValueError(f"run {str(out)!r} has no checkpoint of step {step} (it has {have or 'none'})")
    return path


def checkpoints(out: str | Path) -> list[Path]:
    """The complete checkpoints of run directory ``out``, newest first.

    The one ``OUT/latest`` names leads (a run killed between renaming a checkpoint into
    place and updating the pointer resumes from the pointer's); an unreadable pointer is
    ignored.
    """
    out = Path(out)
    root = out / "checkpoints"
    found = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and (p / STATE_NAME).is_file()),
                   reverse=True) if root.is_dir() else []
    try:
        cand = out / (out / LATEST_NAME).read_text().strip()
        if (cand / STATE_NAME).is_file():
            found = [cand] + [p for p in found if p.name != cand.name]
    except (OSError, ValueError):  # no pointer, or bytes that are not a path
        pass
    return found


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint of run directory ``out``, or None."""
    found = checkpoints(out)
    return found[0] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from either itself or a run directory (its latest checkpoint).

    Raises:
        ValueError: when ``path`` is neither.
    """
    p = Path(path)
    if (p / STATE_NAME).is_file():
        return p
    found = latest_checkpoint(p) if p.is_dir() else None
    if found is None:
        raise ValueError(
            f"checkpoint must be a checkpoint directory (holding {STATE_NAME}) or a run directory with "
            f"checkpoints/ (the --out of 'attnlab train'), got {str(p)!r}"
            + ("" if p.exists() else " which does not exist")
        )
    return found


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read a checkpoint's JSON state and its tensors (optimizer, RNG, extras); no unpickling.

    Returns:
        ``(state, tensors)``; the model weights are loaded separately
        (:func:`attnlab.models.from_pretrained` or ``model.load_state_dict``).
    """
    p = resolve_checkpoint(path)
    state = read_json(p / STATE_NAME)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{p / STATE_NAME} is not an attnlab checkpoint (format {found!r}, expected {FORMAT!r})")
    tensors = load_safetensors(p / OPTIM_NAME, map_location) if (p / OPTIM_NAME).is_file() else {}
    state["path"] = str(p)
    return state, tensors


def load_resumable(out: str | Path, map_location: str | torch.device = "cpu"
                   ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor], list[str]]:
    """The newest checkpoint of run directory ``out`` whose every file loads (what ``--resume`` continues).

    Returns:
        ``(state, tensors, weights, skipped)``: :func:`load_checkpoint`'s two, the model
        weights, and for each newer checkpoint that did not load, a phrase saying why.

    Raises:
        ValueError: when ``out`` holds no checkpoint.
        CorruptCheckpointError: when none of them loads (each one's problem named).
    """
    from ..models.io import WEIGHTS_NAME, read_config

    found = checkpoints(out)
    if not found:
        raise ValueError(f"--resume needs a checkpoint in {str(out)!r} (checkpoints/step_*), found none")
    skipped: list[str] = []
    for ckpt in found:
        try:
            state, tensors = load_checkpoint(ckpt, map_location)
            read_config(ckpt)
            weights = load_safetensors(ckpt / WEIGHTS_NAME, map_location)
        except ValueError as e:  # CorruptCheckpointError, or a foreign format
            why = f"{e.path.name} {e.problem}" if isinstance(e, CorruptCheckpointError) else str(e)
            skipped.append(f"{ckpt} is unreadable ({why})")
            continue
        return state, tensors, weights, skipped
    raise CorruptCheckpointError(Path(out) / "checkpoints", "holds no readable checkpoint: " + "; ".join(skipped),
                                 "train without --resume to start afresh, or pass another --out")


def load_model_weights(model: nn.Module, path: str | Path, map_location: str | torch.device = "cpu") -> None:
    """Load ``model.safetensors`` of a checkpoint into ``model`` (strict)."""
    from ..models.io import WEIGHTS_NAME

    p = resolve_checkpoint(path)
    model.load_state_dict(load_safetensors(p / WEIGHTS_NAME, map_location), strict=True)
