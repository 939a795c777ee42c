"""Saving and loading models: ``config.json`` + ``model.safetensors``, never pickle.

``save_pretrained(model, dir)`` writes the model's config (with its model type) as
JSON and its state dict with :mod:`safetensors`; ``from_pretrained(dir)`` rebuilds the
model from the config and loads the tensors with ``strict=True``, so the restored
model computes bit-for-bit what the saved one did. Loading reads only JSON and raw
tensor bytes: no code is unpickled. A file that cannot be read (empty, truncated by a
full disk or a killed copy, not JSON) raises :class:`CorruptCheckpointError`, a
``ValueError`` naming the file, what is wrong with it and what to do.

Time and memory O(parameters).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..registry import Registry

__all__ = ["CorruptCheckpointError", "PretrainedMixin", "register_model", "model_types", "save_pretrained",
           "from_pretrained", "load_safetensors", "read_json"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "attnlab"

#: every registered model class, by class name (the ``model_type`` of its config.json)
REGISTRY: Registry[type] = Registry("model", name_of=lambda cls: cls.__name__, requires=("config_class",))

#: class decorator: enroll a model class (with ``config_class``) for :func:`from_pretrained`
#: (:meth:`attnlab.registry.Registry.register`)
register_model = REGISTRY.register


class CorruptCheckpointError(ValueError):
    """A saved model or checkpoint file is missing or cannot be read (empty, truncated, not JSON).

    Attributes:
        path: the file.
        problem: what is wrong with it ("is empty (0 bytes)", ...).
        advice: what to do about it.
    """

    def __init__(self, path: str | Path, problem: str, advice: str = "re-save it or point to another checkpoint"):
        self.path, self.problem, self.advice = Path(path), problem, advice
        super().__init__(f"{path} {problem}; {advice}")

    def __reduce__(self):  # picklable across worker processes despite the three arguments
        return type(self), (self.path, self.problem, self.advice)


def model_types() -> dict[str, type]:
    """Registered model classes by name."""
    return REGISTRY.entries()


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("saving/loading models needs safetensors: pip install safetensors") from e
    return st


def load_safetensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path``, on ``device``.

    Raises:
        CorruptCheckpointError: naming the file and its size when it is missing, empty,
            truncated or otherwise not a safetensors file.
    """
    st = _safetensors()
    from safetensors import SafetensorError

    path = Path(path)
    try:
        return st.load_file(str(path), device=str(device))
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "is missing") from None
    except (SafetensorError, OSError) as e:
        size = path.stat().st_size if path.is_file() else None
        what = ("cannot be read" if size is None else "is empty (0 bytes)" if size == 0
                else f"is damaged or truncated ({size:,} bytes)")
        raise CorruptCheckpointError(path, f"{what}: {e}") from e


def read_json(path: str | Path) -> Any:
    """The JSON value stored in ``path``.

    Raises:
        CorruptCheckpointError: naming the file when it is missing, empty, truncated or not JSON.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "is missing") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        what = "is empty" if not path.stat().st_size else "is not valid JSON"
        raise CorruptCheckpointError(path, f"{what} ({e})") from e


def save_pretrained(model: nn.Module, directory: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` for ``model`` into ``directory``.

    Returns:
        The directory path. Parameters and persistent buffers are stored contiguous,
        on the CPU, in their own dtypes.

    Raises:
        ValueError: when ``model`` is not a registered attnlab model or two state-dict
            entries share memory (tie weights by reuse in ``forward``, not by aliasing).
    """
    name = type(model).__name__
    if name not in REGISTRY or not hasattr(model, "config"):
        raise ValueError(f"model must be a registered attnlab model ({sorted(REGISTRY.names())}), got {name}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {"format": FORMAT, "model_type": name, "config": model.config.to_dict()}
    (out / CONFIG_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True))
    try:
        _safetensors().save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt", "model_type": name})
    except RuntimeError as e:
        raise ValueError(f"could not save the state dict of {name} with safetensors: {e}") from e
    return out


def read_config(directory: str | Path) -> tuple[type, Any]:
    """The model class and config stored in ``directory/config.json``."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"directory must hold {CONFIG_NAME} (written by save_pretrained), not found: {path}")
    meta = read_json(path)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not an attnlab model config (expected format={FORMAT!r})")
    name = meta.get("model_type")
    if name not in REGISTRY:
        raise ValueError(f"model_type in {path} must be one of {sorted(REGISTRY.names())}, got {name!r}")
    cls = REGISTRY.get(name)
    return cls, cls.config_class.from_dict(meta["config"])


def from_pretrained(directory: str | Path, *, map_location: str | torch.device = "cpu",
                    expected: type | None = None) -> nn.Module:
    """Rebuild the model saved in ``directory`` (in eval mode).

    Args:
        directory: written by :func:`save_pretrained`.
        map_location: device the tensors are loaded onto.
        expected: if given, the saved model must be of this class.

    Raises:
        ValueError: on a missing/foreign config, a model type other than ``expected``,
            or weights that do not match the config (missing/unexpected/misshapen keys).
        CorruptCheckpointError: (a ValueError) when ``config.json`` or ``model.safetensors``
            is empty, truncated or otherwise unreadable.
    """
    cls, config = read_config(directory)
    if expected is not None and cls is not expected:
        raise ValueError(f"{directory} holds a {cls.__name__}, not a {expected.__name__}")
    weights = Path(directory) / WEIGHTS_NAME
    if not weights.is_file():
        raise ValueError(f"directory must hold {WEIGHTS_NAME}, not found: {weights}")
    state = load_safetensors(weights, map_location)
    model = cls(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"weights in {weights} do not match the config: {e}") from e
    return model.to(map_location).eval()


class PretrainedMixin:
    """What every registered model shares: the start of its ``__init__`` (:meth:`_keep_config`),
    ``save_pretrained(dir)`` and ``from_pretrained(dir)``."""

    config_class: type

    def _keep_config(self, config) -> None:
        """Start ``nn.Module`` and keep ``config`` (ValueError unless it is this model's :attr:`config_class`)."""
        torch.nn.Module.__init__(self)  # type: ignore[arg-type]
        if not isinstance(config, self.config_class):
            raise ValueError(f"config must be a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (see :func:`save_pretrained`)."""
        return save_pretrained(self, directory)  # type: ignore[arg-type]

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, map_location: str | torch.device = "cpu"):
        """Load a model of this class saved with :meth:`save_pretrained`."""
        return from_pretrained(directory, map_location=map_location, expected=cls)
