"""Cluttered digits: find one handwritten digit on a canvas strewn with fragments of others, and name it.

The data set of Mnih et al., 2014 ("Recurrent Models of Visual Attention", cluttered
translated MNIST), made from scikit-learn's 8x8 digits (``sklearn.datasets.load_digits``, pixels
scaled to [0, 1]): each canvas is ``canvas x canvas`` black pixels with one digit at a uniformly
random position (wholly inside) and ``clutter`` fragments, ``fragment x fragment`` crops at random
offsets of other random digits, each at a uniformly random position (wholly inside; they may lie
over the digit). Where pieces overlap the brighter pixel wins. Pixels stay in [0, 1]: the
background is 0, what a glimpse reads beyond the canvas.

The digit images are split 80/10/10 into train/val/test pools with the seed (as the ``digits``
task does), so validation and test canvases show digits never seen in training, and their
clutter comes from their own pool too. scikit-learn has 1,797 digits, 1,437 of them for
training: the training batch of step ``s`` is drawn afresh (pure function of ``(seed, s)``)
from the training pool, so every step sees new placements and new clutter. The val and test
sets are fixed by the seed, each going through its pool's digits in turn.

Warm-up (``spread_steps``): training digits start at the centre and may lie further out as
training goes, anywhere from step ``spread_steps`` on (:meth:`ClutteredDigitsTask.reach`; 0: anywhere
from the start). The val and test digits are anywhere. Without it a glimpse model starts from
classifications at chance, so REINFORCE has no reward to follow: in short runs with digits
anywhere from the start (1,500-2,000 steps of 64; lr 1e-3 to 3e-3, 2 or 3 scales, linear or
convolutional what pathway) the ``ram`` model's training accuracy stayed at 10-11 %; with a
1,500-step warm-up it reached 25 % over steps 1,750-2,000. A second warm-up (``clutter_steps``)
grows the training canvases' fragments from none to ``clutter`` (:meth:`ClutteredDigitsTask.clutter_at`),
so the policy first learns where the one bright blob of a coarse view is the digit. ``profile``
picks the training steps (:data:`PROFILES`).

The option ``model`` picks what is trained: ``ram`` (:class:`~attnlab.models.RecurrentAttention`,
``glimpses`` glimpses, locations learned with REINFORCE: :func:`~attnlab.models.glimpse.hybrid_loss`),
``ram-random`` (the same model with uniformly random locations, no REINFORCE) or ``cnn``
(:class:`~attnlab.models.ConvClassifier` on the whole canvas). The evaluation reports the accuracy
and ``coverage``, the fraction of the canvas under the union of an image's glimpses' largest
patches, averaged over the images (1 for the CNN, which sees every pixel), and ``fovea_coverage``,
the same under their finest, full-resolution patches.

Time O(B (canvas^2 + clutter fragment^2)) per batch; memory O((val + test) canvas^2).
Shape legend: ``B`` batch, ``S`` canvas side, ``F`` clutter fragments, ``G`` glimpses, ``K`` = 10 classes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..models.glimpse import glimpse_corners, glimpse_coverage, hybrid_loss
from .base import Task, masked_cross_entropy, register_task, split_indices, step_generator
from .digits import load_digits

__all__ = ["ClutteredDigitsTask", "make_canvases", "MODELS", "LEARNING_RATES", "BATCH_SIZE", "PROFILES", "glimpse_paths", "glimpse_hits"]

#: digit image side
SIDE = 8
#: the glimpse models' shared defaults (docs/dynamic.md, "How the defaults were found")
_GLIMPSES: dict[str, Any] = {"patch_size": 8, "scales": 3, "dim": 256, "glimpse_dim": 128, "core": "gru", "std": 0.2,
                             "what": "conv", "start": "learned", "policy_grad": "all", "core_grad": 0.1}
#: the ``model`` option: model class, its policy (RAM) and its defaults
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "ram": ("RecurrentAttention", {**_GLIMPSES, "policy": "learned"}),
    "ram-random": ("RecurrentAttention", {**_GLIMPSES, "policy": "random"}),
    "cnn": ("ConvClassifier", {"dim": 16, "layers": 3}),
}
#: each model's learning rate (docs/dynamic.md, "How the defaults were found"): the glimpse models at 1e-3
#: (at 2e-3 the random-location model never left chance), the CNN at 2e-3 (82.6 % at 1e-3, 90.1 % at 2e-3)
LEARNING_RATES: dict[str, float] = {"ram": 1e-3, "ram-random": 1e-3, "cnn": 2e-3}
#: canvases a training step, every model (docs/dynamic.md, "How the defaults were found": the ram model reached
#: 85.1 % after 12,000 steps of 128 against 81.1 % of 64, and 86.0 % of 256 at twice the time of 128)
BATCH_SIZE = 128
#: the ``profile`` option: training steps (``long``: the longer run of docs/dynamic.md, over 15 minutes)
PROFILES: dict[str, int] = {"quick": 12000, "long": 36000}


def make_canvases(digits: Tensor, sources: Tensor, *, canvas: int, fragment: int,
                  gen: torch.Generator, reach: float = 1.0) -> tuple[Tensor, Tensor]:
    """Canvases ``(B, 1, S, S)`` in [0, 1] with one digit each and clutter, and the digits' corners ``(B, 2)``.

    Args:
        digits: ``(B, 8, 8)`` the digit of each canvas.
        sources: ``(B, F, 8, 8)`` the digits the ``F`` clutter fragments of each canvas are cut from.
        canvas: ``S``, at least 8.
        fragment: side of a fragment, in ``[1, 8]``.
        gen: draws the digit's top-left corner (uniform in ``[0, S - 8]^2``), each fragment's offset
            in its source (uniform in ``[0, 8 - fragment]^2``) and its corner (uniform in
            ``[0, S - fragment]^2``).
        reach: in ``[0, 1]``, how far from the centre the digit may be: its corner is uniform in
            ``[lo, S - 8 - lo]^2`` with ``lo = min(round((1 - reach) (S - 8) / 2), (S - 8) // 2)``
            (1: anywhere; 0: centred).

    Returns:
        ``(canvases, corners)``: ``corners[b]`` is the ``(row, col)`` of digit ``b``'s top-left pixel.
    """
    if canvas < SIDE:
        raise ValueError(f"canvas must be at least {SIDE} pixels (a digit's side), got {canvas}")
    if not 1 <= fragment <= SIDE:
        raise ValueError(f"fragment must be in [1, {SIDE}], got {fragment}")
    b, f = sources.shape[:2]
    lo = min(round((1 - reach) * (canvas - SIDE) / 2), (canvas - SIDE) // 2)  # at least one position
    corners = torch.randint(lo, canvas - SIDE - lo + 1, (b, 2), generator=gen)
    offsets = torch.randint(0, SIDE - fragment + 1, (b, f, 2), generator=gen)
    places = torch.randint(0, canvas - fragment + 1, (b, f, 2), generator=gen)
    span = torch.arange(fragment)
    rows, cols = offsets[..., 0, None] + span, offsets[..., 1, None] + span  # (B, F, f) inside the source
    pieces = sources[torch.arange(b)[:, None, None, None], torch.arange(f)[None, :, None, None],
                     rows[..., :, None], cols[..., None, :]]  # (B, F, f, f)
    r = corners[:, None, 0, None] + torch.arange(SIDE)  # (B, 1, 8) the digit's rows on the canvas
    c = corners[:, None, 1, None] + torch.arange(SIDE)
    digit_at = (r[..., :, None] * canvas + c[..., None, :]).reshape(b, -1)  # (B, 64) flat canvas indices
    pr, pc = places[..., 0, None] + span, places[..., 1, None] + span  # (B, F, f)
    piece_at = (pr[..., :, None] * canvas + pc[..., None, :]).reshape(b, -1)  # (B, F f^2)
    at = torch.cat([digit_at, piece_at], 1)
    values = torch.cat([digits.reshape(b, -1), pieces.reshape(b, -1)], 1)
    flat = torch.zeros(b, canvas * canvas).scatter_reduce_(1, at, values, "amax")  # the brighter pixel wins
    return flat.view(b, 1, canvas, canvas), corners


@register_task
class ClutteredDigitsTask(Task):
    """Classify the one whole digit on a cluttered canvas: glimpses (RAM), random glimpses or a CNN.

    Options:
        model: ``ram``, ``ram-random`` or ``cnn`` (:data:`MODELS`; each trains at its own learning rate, :data:`LEARNING_RATES`).
        glimpses: glimpses per image (the RAM models).
        canvas, clutter, fragment: canvas side, fragments per canvas and fragment side (pixels).
        spread_steps: training steps over which the digits' reach grows from the centre to the whole canvas.
        clutter_steps: training steps over which the fragments per training canvas grow from 0 to ``clutter`` (0: all from the start).
        profile: ``quick`` (12,000 steps, the default) or ``long`` (36,000 steps: about 40 minutes) (:data:`PROFILES`).
        samples: glimpse sequences per training canvas of the learned policy (REINFORCE samples; more: less variance, more work).
        val_size, test_size: canvases of the fixed held-out splits.
    """

    name = "cluttered-digits"
    model_type = "RecurrentAttention"
    option_defaults: dict[str, Any] = {"model": "ram", "glimpses": 6, "canvas": 32, "clutter": 8, "fragment": 4,
                                       "spread_steps": 3000, "clutter_steps": 6000, "samples": 1,
                                       "profile": "quick", "val_size": 1000, "test_size": 2000}
    model_defaults: dict[str, Any] = MODELS["ram"][1]
    train_defaults: dict[str, Any] = {"steps": PROFILES["quick"], "batch_size": BATCH_SIZE, "lr": LEARNING_RATES["ram"],
                                      "warmup": 100, "min_lr": 1e-5, "eval_every": 1000, "eval_batches": 8,
                                      "weight_decay": 0.0, "grad_clip": 5.0, "precision": "fp32"}
    item_unit = "img"

    def __init__(self, data: str | None = None, seed: int = 0, **options: Any):
        super().__init__(data, seed, **options)
        self.validate_options()
        # the model option picks the model class and its defaults (the class attributes are the ram model's)
        self.model_type, self.model_defaults = MODELS[self.options["model"]]
        self.train_defaults = {**type(self).train_defaults, "steps": PROFILES[self.options["profile"]],
                               "lr": LEARNING_RATES[self.options["model"]]}

    def validate_options(self) -> None:
        o = self.options
        if o["model"] not in MODELS:
            raise ValueError(f"cluttered-digits option model must be one of {list(MODELS)}, got {o['model']!r}")
        if o["profile"] not in PROFILES:
            raise ValueError(f"cluttered-digits option profile must be one of {list(PROFILES)}, got {o['profile']!r}")
        for name in ("spread_steps", "clutter_steps"):
            if o[name] < 0:
                raise ValueError(f"cluttered-digits option {name} must be >= 0, got {o[name]}")
        for name in ("glimpses", "val_size", "test_size", "fragment", "samples"):
            if o[name] < 1:
                raise ValueError(f"cluttered-digits option {name} must be >= 1, got {o[name]}")
        if o["samples"] > 1 and o["model"] != "ram":
            raise ValueError(f"cluttered-digits option samples draws rollouts of the learned policy (model ram); "
                             f"model {o['model']!r} takes samples=1, got {o['samples']}")
        if o["clutter"] < 0:
            raise ValueError(f"cluttered-digits option clutter must be >= 0, got {o['clutter']}")
        if o["canvas"] < SIDE or o["fragment"] > SIDE:
            raise ValueError(f"cluttered-digits needs canvas >= {SIDE} and fragment <= {SIDE}, got "
                             f"canvas={o['canvas']}, fragment={o['fragment']}")

    @property
    def glimpsing(self) -> bool:
        """Whether the model is a recurrent attention model (``ram`` or ``ram-random``)."""
        return self.options["model"] != "cnn"

    def model_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"image_size": self.options["canvas"], "channels": 1, "num_classes": 10}
        if self.glimpsing:
            cfg["glimpses"] = self.options["glimpses"]
        return cfg

    def setup(self) -> None:
        images, labels = load_digits()  # (1797, 1, 8, 8) in [0, 1]
        pools = split_indices(len(labels), (0.8, 0.1, 0.1), self.seed)
        self.images, self.labels = images[:, 0], labels
        self.pools = {split: torch.tensor(idx) for split, idx in zip(("train", "val", "test"), pools)}
        o = self.options
        self.fixed = {split: self._draw(split, o[f"{split}_size"], step_generator(self.seed, 0, stream=s), cycle=True)
                      for split, s in (("val", 1), ("test", 2))}

    def reach(self, step: int) -> float:
        """How far from the centre training digits may be at ``step`` (1: anywhere; see :func:`make_canvases`)."""
        warm = self.options["spread_steps"]
        return 1.0 if warm == 0 else min(1.0, step / warm)

    def clutter_at(self, step: int) -> int:
        """Fragments per training canvas at ``step``: ``clutter`` scaled by ``step / clutter_steps`` (rounded), at most ``clutter``."""
        full, ramp = self.options["clutter"], self.options["clutter_steps"]
        return full if ramp == 0 else min(full, round(full * step / ramp))

    def _draw(self, split: str, n: int, gen: torch.Generator, cycle: bool = False,
              reach: float = 1.0, clutter: int | None = None) -> dict[str, Tensor]:
        """``n`` canvases of the split's pool: digits drawn at random, or each in turn (``cycle``),
        with ``clutter`` fragments each (None: the option)."""
        pool = self.pools[split]
        if cycle:
            picks = pool[(torch.arange(n) % len(pool))[torch.randperm(n, generator=gen)]]
        else:
            picks = pool[torch.randint(0, len(pool), (n,), generator=gen)]
        clutter = self.options["clutter"] if clutter is None else clutter
        sources = pool[torch.randint(0, len(pool), (n, clutter), generator=gen)]
        canvases, corners = make_canvases(self.images[picks], self.images[sources], canvas=self.options["canvas"],
                                          fragment=self.options["fragment"], gen=gen, reach=reach)
        return {"images": canvases, "labels": self.labels[picks], "corners": corners}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        batch = self._draw("train", batch_size, step_generator(self.seed, step), reach=self.reach(step),
                           clutter=self.clutter_at(step))
        return {"images": batch["images"], "labels": batch["labels"]}

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        data = self._split(split)
        return {"images": data["images"][:size], "labels": data["labels"][:size]}

    def _split(self, split: str) -> dict[str, Tensor]:
        self.ensure_setup()
        if split not in self.fixed:
            raise ValueError(f"task cluttered-digits has the held-out splits 'val' and 'test', got {split!r}")
        return self.fixed[split]

    def baseline(self, split: str = "test") -> float | None:
        """Accuracy of always answering the split's most frequent class."""
        labels = self._split(split)["labels"]
        return float(torch.bincount(labels, minlength=10).max()) / len(labels)

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        images, labels = batch["images"], batch["labels"]
        m = self.options["samples"]
        if m > 1 and model.training:  # validate_options: samples > 1 only for model ram
            images, labels = images.repeat(m, 1, 1, 1), labels.repeat(m)  # (M B, 1, S, S): M rollouts a canvas
        out = model(images)
        if not self.glimpsing:
            return masked_cross_entropy(out.logits, labels, None, label_smoothing), None
        total, _ = hybrid_loss(out, labels, label_smoothing=label_smoothing,
                               reinforce=self.options["model"] == "ram")
        return total, None

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str = "test", *, batch_size: int = 250,
                limit: int | None = None) -> dict[str, Tensor]:
        """Logits ``(n, 10)`` of the split's first ``limit`` canvases (all: None), and the glimpse
        locations ``(n, G, 2)`` of the RAM models.

        A random policy draws its locations from a generator seeded by the task's seed and the split.
        """
        data = self._split(split)
        n = len(data["labels"]) if limit is None else min(limit, len(data["labels"]))
        device = next(model.parameters()).device
        gen = torch.Generator().manual_seed(self.seed * 7_919 + (1 if split == "val" else 2))
        logits, locations = [], []
        for i in range(0, n, batch_size):
            images = data["images"][i:min(i + batch_size, n)].to(device)
            out = model(images, generator=gen) if self.glimpsing else model(images)
            logits.append(out.logits.float().cpu())
            if self.glimpsing:
                locations.append(out.locations.float().cpu())
        result = {"logits": torch.cat(logits)}
        if locations:
            result["locations"] = torch.cat(locations)
        return result

    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 250,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        """Loss (NLL), accuracy and mean glimpse coverage of the canvas (1 for the CNN) on ``split``.

        ``coverage`` counts the pixels under the glimpses' largest patches (seen at any resolution),
        ``fovea_coverage`` those under their first, full-resolution patches.
        """
        labels = self._split(split)["labels"]
        limit = None if max_batches is None else max_batches * batch_size
        pred = self.predict(model, split, batch_size=batch_size, limit=limit)
        logits = pred["logits"]
        labels = labels[:len(logits)]
        out = {"loss": float(F.cross_entropy(logits, labels)),
               "accuracy": float((logits.argmax(-1) == labels).float().mean()), "coverage": 1.0,
               "fovea_coverage": 1.0}
        if "locations" in pred:
            cfg = model.config
            out["coverage"] = float(glimpse_coverage(pred["locations"], cfg.image_size, cfg.patch_size,
                                                     cfg.scales).mean())
            out["fovea_coverage"] = float(glimpse_coverage(pred["locations"], cfg.image_size, cfg.patch_size,
                                                           1).mean())
        return out


def glimpse_paths(model: nn.Module, task: ClutteredDigitsTask, split: str = "test", n: int = 8) -> dict[str, Tensor]:
    """The first ``n`` canvases of ``split`` with what a RAM model did on them (for the figure).

    Returns:
        dict: ``images (n, 1, S, S)``, ``labels (n,)``, ``corners (n, 2)`` (the digits' top-left pixels),
        ``predictions (n,)`` and ``locations (n, G, 2)`` in ``[-1, 1]``, ``(row, col)``.
    """
    if not task.glimpsing:
        raise ValueError(f"glimpse_paths needs a run of model ram or ram-random, got model {task.options['model']!r}")
    data = task._split(split)
    pred = task.predict(model, split, limit=n)
    return {"images": data["images"][:n], "labels": data["labels"][:n], "corners": data["corners"][:n],
            "predictions": pred["logits"].argmax(-1), "locations": pred["locations"]}


def glimpse_hits(model: nn.Module, task: ClutteredDigitsTask, split: str = "test", within: int = 2) -> dict[str, Any]:
    """How often a RAM model's glimpses find the digit, and how right it is when they do.

    A glimpse *hits* when its pixel corner (:func:`~attnlab.models.glimpse.glimpse_corners`, the
    centre of its patches) lies within ``within`` pixels of the digit's centre in both axes.

    Returns:
        dict: ``hit_rate`` (the share of the split's canvases with at least one hit),
        ``accuracy_hit`` and ``accuracy_miss`` (accuracy on those canvases and on the others; None
        when there are none), ``per_glimpse`` (the share of canvases hit by glimpse ``t``, a list of
        ``G``) and ``accuracy``.
    """
    if not task.glimpsing:
        raise ValueError(f"glimpse_hits needs a run of model ram or ram-random, got model {task.options['model']!r}")
    if not isinstance(within, int) or isinstance(within, bool) or within < 0:
        raise ValueError(f"glimpse_hits: within must be an int >= 0 (pixels), got {within!r}")
    data = task._split(split)
    pred = task.predict(model, split)
    right = pred["logits"].argmax(-1) == data["labels"]  # (n,)
    centre = data["corners"] + SIDE // 2  # (n, 2) the digit's centre pixel corner
    at = glimpse_corners(pred["locations"], model.config.image_size)  # (n, G, 2)
    hits = (at - centre[:, None]).abs().amax(-1) <= within  # (n, G)
    found = hits.any(1)  # (n,)

    def acc(sel: Tensor) -> float | None:
        return float(right[sel].float().mean()) if bool(sel.any()) else None

    return {"hit_rate": float(found.float().mean()), "accuracy_hit": acc(found), "accuracy_miss": acc(~found),
            "per_glimpse": [float(x) for x in hits.float().mean(0)], "accuracy": float(right.float().mean())}
