"""What every task shares: the :class:`Task` interface, deterministic batching, losses.

A task makes or reads its data, says which model it trains (and that model's default
configuration), builds the training batch of any step, computes the loss and evaluates.

The batch of step ``s`` is a pure function of ``(seed, s)``: synthetic tasks draw it
from a generator seeded with both, dataset tasks walk a per-epoch permutation seeded
with ``(seed, epoch)``. The data position of a run is therefore its step count, a
resumed run sees exactly the batches an uninterrupted one would, and under data
parallelism rank ``r`` of ``K`` takes rows ``r*B/K .. (r+1)*B/K`` of the same global
batch, so K processes take the step one process takes with the whole batch.

Shape legend: ``B`` batch, ``N`` sequence length, ``V`` vocabulary, ``C`` classes.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..data import MissingDataError, locate
from ..registry import Registry

__all__ = [
    "REGISTRY",
    "register_task",
    "Task",
    "MissingDataError",
    "EpochBatcher",
    "step_generator",
    "masked_cross_entropy",
    "attention_penalty",
    "read_lines",
    "require_file",
    "split_indices",
    "slice_batch",
]


def require_file(path: str | Path | None, task: str, what: str, dataset: str, file: str | None = None) -> Path:
    """The data a task reads: ``path`` when the user gave one (``--data``), else the catalogue's copy.

    Args:
        path: what the user passed (None when nothing).
        task: task name (for the message).
        what: what the file is ("a text file", ...).
        dataset: the :mod:`attnlab.data` data set to fall back on (found under ``$ATTNLAB_DATA``
            or in the cache).
        file: the file of that data set to return (None: its folder).

    Raises:
        MissingDataError: ``path`` does not exist, or no ``path`` and the data set is not
            fetched; the message names ``--data`` and ``attnlab data fetch``.
    """
    if path is None:
        folder = locate(dataset)
        return folder / file if file is not None else folder
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingDataError(f"task {task!r} expected {what} at {str(p)!r}, which does not exist; pass the right "
                               f"path with --data, or drop --data to use the fetched copy (attnlab data fetch {dataset})")
    return p


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (``.gz`` read through gzip), split on ``\\n`` only.

    Splitting on ``\\n`` alone (not ``str.splitlines``) keeps characters such as U+0085
    (NEL) inside their line, as the files were written.
    """
    p = Path(path)
    raw = gzip.open(p, "rb").read() if p.suffix == ".gz" else p.read_bytes()
    text = raw.decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator that depends only on ``(seed, step, stream)``."""
    mixed = (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def split_indices(n: int, fractions: tuple[float, float, float], seed: int) -> tuple[list[int], list[int], list[int]]:
    """A seeded shuffle of ``range(n)`` cut into disjoint train/val/test index lists."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = int(round(fractions[1] * n))
    n_test = int(round(fractions[2] * n))
    n_train = n - n_val - n_test
    return perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]


def slice_batch(batch: dict[str, Tensor], rank: int, world: int) -> dict[str, Tensor]:
    """Rank ``rank``'s contiguous share of a global batch (first dim divisible by ``world``)."""
    if world == 1:
        return batch
    b = next(iter(batch.values())).shape[0]
    if b % world:
        raise ValueError(f"batch size must be divisible by the number of processes, got {b} and {world}")
    per = b // world
    return {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}


class EpochBatcher:
    """Deterministic batches of dataset indices, epoch after epoch.

    Epoch ``e`` is a permutation seeded with ``(seed, e)``. With ``lengths`` the
    permutation is cut into pools of ``pool`` batches, each pool sorted by length and
    cut into batches, and the epoch's batches shuffled again: similar lengths share a
    batch (less padding) while the order stays random and reproducible.

    Args:
        n: dataset size.
        batch_size: global batch size ``B``.
        seed: data seed.
        lengths: per-example lengths for bucketing, or None.
        pool: batches per sorting pool.
    """

    def __init__(self, n: int, batch_size: int, seed: int, lengths: list[int] | None = None, pool: int = 50):
        if n < 1:
            raise ValueError(f"dataset must hold at least one example, got {n}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.lengths, self.pool = lengths, pool
        self.per_epoch = max(1, n // batch_size) if n >= batch_size else 1
        self._cache: dict[int, list[list[int]]] = {}

    def _epoch(self, epoch: int) -> list[list[int]]:
        if epoch not in self._cache:
            g = torch.Generator().manual_seed(self.seed * 7_919 + epoch)
            perm = torch.randperm(self.n, generator=g).tolist()
            while len(perm) < self.batch_size:  # tiny datasets: repeat to fill one batch
                perm = perm + perm
            B = self.batch_size
            usable = perm[: self.per_epoch * B]
            if self.lengths is not None:
                size = B * self.pool
                pools = [sorted(usable[i:i + size], key=lambda j: self.lengths[j]) for i in range(0, len(usable), size)]
                batches = [p[i:i + B] for p in pools for i in range(0, len(p), B)]
                order = torch.randperm(len(batches), generator=g).tolist()
                batches = [batches[i] for i in order]
            else:
                batches = [usable[i:i + B] for i in range(0, len(usable), B)]
            self._cache = {epoch: batches}
        return self._cache[epoch]

    def indices(self, step: int) -> list[int]:
        """The ``B`` dataset indices of step ``step``."""
        epoch, j = divmod(step, self.per_epoch)
        return self._epoch(epoch)[j]

    def position(self, step: int) -> dict[str, int]:
        """Where step ``step`` is in the data: epoch and batch within it."""
        epoch, j = divmod(step, self.per_epoch)
        return {"epoch": epoch, "batch_in_epoch": j, "batches_per_epoch": self.per_epoch}


def masked_cross_entropy(logits: Tensor, target: Tensor, mask: Tensor | None = None,
                         label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over the positions ``mask`` keeps.

    Args:
        logits: ``(..., V)`` scores (computed in float32 for the loss).
        target: ``(...)`` ids.
        mask: ``(...)`` bool, True where the loss counts (None: everywhere).
        label_smoothing: Szegedy et al., 2016: the target distribution puts
            ``1 - eps`` on the label and spreads ``eps`` uniformly over all classes.
    """
    flat = logits.reshape(-1, logits.shape[-1]).float()  # (B*N, V)
    t = target.reshape(-1)  # (B*N,)
    if mask is not None:
        t = t.masked_fill(~mask.reshape(-1), -100)
    return F.cross_entropy(flat, t, ignore_index=-100, label_smoothing=label_smoothing)


def attention_penalty(attentions: Iterable[Tensor] | None, kind: str) -> Tensor:
    """A regularizer on attention weights ``(B, H, N, M)`` per layer, averaged over layers.

    ``entropy``: mean row entropy ``-sum_j p_ij log p_ij`` (adding it with a positive
    weight pushes toward sharper attention; a negative weight toward flatter).
    ``l2``: mean over rows of ``sum_j p_ij^2``.
    """
    if attentions is None:
        raise ValueError("attention penalty needs attention weights; the model returned none")
    terms = []
    for w in attentions:
        if w is None:
            continue
        w = w.float()
        if kind == "entropy":
            terms.append(-(w * torch.log(w.clamp_min(1e-12))).sum(-1).mean())
        elif kind == "l2":
            terms.append((w * w).sum(-1).mean())
        else:
            raise ValueError(f"attention penalty must be 'entropy' or 'l2', got {kind!r}")
    if not terms:
        raise ValueError("attention penalty needs attention weights; every layer returned None")
    return torch.stack(terms).mean()


class Task:
    """A task: its data, its model, its batches, its loss and its evaluation.

    Subclasses set the class attributes and implement the methods marked below.

    Attributes:
        name: registry name (``attnlab train NAME``).
        model_type: the attnlab model class name (``CausalLM``, ``EncoderDecoder``,
            ``SequenceClassifier``, ``ViT``).
        option_defaults: task options and their defaults (``--task-opt k=v``).
        model_defaults: model config fields this task sets by default.
        train_defaults: trainer settings this task sets by default (steps, lr, ...).
        item_unit: what ``items_per_batch`` counts (speed display).
        eval_splits: held-out splits evaluated at the end (``chars`` has only ``val``).
        attention_mask: the mask its model attends under: ``causal`` (language models) or
            ``padding`` (classifiers over padded batches).
        score_metric, lower_is_better: the key of :meth:`evaluate`'s result that scores a trained
            model, and whether lower is better (bits per character) or higher (accuracy).
        length_range: the sequence lengths :meth:`options_at_length` accepts, inclusive (None:
            the task has no length to change). A length curriculum trains phases of one task at
            increasing lengths (:meth:`at_length`).
    """

    name: ClassVar[str] = ""
    model_type: ClassVar[str] = ""
    option_defaults: ClassVar[dict[str, Any]] = {}
    model_defaults: ClassVar[dict[str, Any]] = {}
    train_defaults: ClassVar[dict[str, Any]] = {}
    item_unit: ClassVar[str] = "seq"
    #: the held-out splits evaluated at the end of training
    eval_splits: ClassVar[tuple[str, ...]] = ("val", "test")
    attention_mask: ClassVar[str] = "padding"
    score_metric: ClassVar[str] = "accuracy"
    lower_is_better: ClassVar[bool] = False
    length_range: ClassVar[tuple[int, int] | None] = None

    def __init__(self, data: str | None = None, seed: int = 0, **options: Any):
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            raise ValueError(f"unknown options {unknown} for task {self.name!r}; it takes {sorted(self.option_defaults)}")
        merged = dict(self.option_defaults)
        for k, v in options.items():
            default = self.option_defaults[k]
            merged[k] = _coerce(k, v, default)
        self.options = merged
        self.data = None if data is None else _absolute(str(data))
        self.seed = int(seed)
        self._ready = False

    # -- to implement ---------------------------------------------------------------
    def setup(self) -> None:
        """Make or read the data (called once, before batches are drawn)."""

    def model_config(self) -> dict[str, Any]:
        """Model config fields that depend on the data (vocabulary sizes, classes)."""
        return {}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        """The whole batch of step ``step`` (all ranks' rows), as CPU tensors."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """Mean loss of a batch, and the attention weights (one tensor per layer) when ``return_weights``."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        """Metrics on a split (``val``/``test``); ``final`` enables slow metrics (BLEU with beams)."""
        raise NotImplementedError

    def items_per_batch(self, batch: dict[str, Tensor]) -> int:
        """Tokens or examples in a batch (for the speed display)."""
        return int(next(iter(batch.values())).shape[0])

    def options_at_length(self, n: int) -> dict[str, Any]:
        """The options that make this task's sequences ``n`` tokens long (see :attr:`length_range`)."""
        raise ValueError(f"task {self.name!r} has no sequence length to change")

    def baseline(self, split: str = "test") -> float | None:
        """The :attr:`score_metric` of a predictor that ignores the input, on ``split`` (None: none defined).

        A trained model that does not beat it by a margin has not learned the task.
        """
        return None

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        """The first ``size`` examples of the held-out ``split`` as a batch for :meth:`loss` (CPU tensors)."""
        raise NotImplementedError(f"task {self.name!r} gives no example batches")

    def data_position(self, step: int, batch_size: int) -> dict[str, Any]:
        """Where step ``step`` is in the data (stored in checkpoints)."""
        return {"step": step}

    def save_assets(self, directory: Path) -> None:
        """Write what decoding needs (vocabularies, tokenizers) into a checkpoint."""

    def load_assets(self, directory: Path) -> bool:
        """Read :meth:`save_assets` output; True if the task can decode without its data."""
        return False

    # -- shared ---------------------------------------------------------------------
    def ensure_setup(self) -> None:
        """Run :meth:`setup` once."""
        if not self._ready:
            self.setup()
            self._ready = True

    def train_batch(self, step: int, batch_size: int, rank: int = 0, world: int = 1) -> dict[str, Tensor]:
        """This rank's rows of step ``step``'s batch."""
        self.ensure_setup()
        return slice_batch(self.global_batch(step, batch_size), rank, world)

    def check_length(self, n: int) -> None:
        """Raise ValueError naming the task and its range when ``n`` is not a length it can be run at."""
        if self.length_range is None:
            raise ValueError(f"task {self.name!r} has no sequence length to change")
        lo, hi = self.length_range
        if not isinstance(n, int) or isinstance(n, bool) or not lo <= n <= hi:
            raise ValueError(f"length {n!r} is beyond what task {self.name!r} supports: N must be in [{lo}, {hi}]")

    def at_length(self, n: int) -> Task:
        """A task like this one (same data, seed and other options) whose sequences are ``n`` tokens long.

        ``self`` when its sequences are that long already, else a new task.

        Raises:
            ValueError: when ``n`` is outside :attr:`length_range` or the other options cannot make
                sequences that long (the task's own check, e.g. MQAR's ``length >= 4 * pairs``).
        """
        self.check_length(n)
        changes = self.options_at_length(n)
        same = all(self.options.get(k) == v for k, v in changes.items())  # already that long
        task = self if same else type(self)(self.data, self.seed, **{**self.options, **changes})
        task.validate_options()
        return task

    def validate_options(self) -> None:
        """Raise ValueError when the options cannot make data (default: nothing to check before setup)."""

    def describe(self) -> dict[str, Any]:
        """JSON-ready identity of the task (name, data path, seed, options)."""
        return {"name": self.name, "data": self.data, "seed": self.seed, "options": dict(self.options)}


def _absolute(data: str) -> str:
    """An absolute data path; each part of a comma-separated list of files made absolute."""
    if "," in data and not Path(data).exists():
        return ",".join(str(Path(p.strip()).expanduser().resolve()) for p in data.split(","))
    return str(Path(data).expanduser().resolve())


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Parse a ``--task-opt`` string to the type of its default."""
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    try:
        if isinstance(default, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ValueError(f"task option {name} must be a {type(default).__name__}, got {value!r}") from None
    return value


def batched(seq: list, size: int) -> list[list]:
    """``seq`` cut into consecutive lists of at most ``size``."""
    return [seq[i:i + size] for i in range(0, len(seq), size)]


def perplexity(loss: float) -> float:
    """``exp(loss)``, capped to stay finite."""
    return math.exp(min(loss, 50.0))


#: every registered task class, by name (filled by :func:`register_task` as the task modules are imported)
REGISTRY: Registry[type[Task]] = Registry("task", base=Task)

#: class decorator: enroll a :class:`Task` subclass under ``cls.name`` (:meth:`attnlab.registry.Registry.register`)
register_task = REGISTRY.register
