"""Moving digits: which of 8 directions is a scene of handwritten digits moving in?

A video is ``frames`` frames of ``canvas x canvas`` pixels: a camera window onto a larger
``world x world`` torus (its edges wrap around) strewn with scikit-learn's 8x8 handwritten
digits (``sklearn.datasets.load_digits``, pixels scaled to [0, 1], overlaps take the brighter
pixel) at uniformly random positions, ``digits`` per ``canvas x canvas`` of area. Every frame
moves every digit ``speed`` pixels further in the video's direction, one of the 8 compass
directions (label 0 = right, then counter-clockwise in 45 degree steps: up-right, up,
up-left, left, down-left, down, down-right): the window shows the scene shifted, new digits
entering at one edge. The world is large enough that nothing seen leaves and comes back
within a video (``world >= canvas + (frames - 1) * speed``). Pixels are standardized with
fixed constants of the generator.

What makes it a test of attention over time: with uniformly random positions on a torus every
single frame has the same distribution whatever the direction, so the frames taken as an
unordered set carry next to nothing about it; only how consecutive frames relate does. A model
that attends within frames only and pools over time (``attention=space``) sits near chance
(1/8); a model that attends over time can reach 100 % (the direction is a deterministic
function of two consecutive frames).

Balanced data: each batch holds every direction equally often (batch sizes that are multiples
of 8 exactly) and draws the digit classes in turn (every class equally often, up to one). The
digit images are split 80/10/10 into train/val/test pools with the seed, so validation and
test videos show digit images never seen in training; the training batch of step ``s`` is a
pure function of ``(seed, s)``, the val and test sets are fixed by the seed.

Time O(B (T canvas^2 + world^2 digits (world / canvas)^2)) per batch; memory O(val + test videos).
Shape legend: ``B`` batch, ``T`` frames, ``S`` canvas side, ``L`` world side, ``K`` = 8 directions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Task, masked_cross_entropy, register_task, split_indices, step_generator
from .digits import load_digits

__all__ = ["MovingDigitsTask", "DIRECTIONS", "make_videos", "estimate_direction"]

#: ``(row step, column step)`` of each label, rows growing downwards: right, then counter-clockwise
DIRECTIONS = ((0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1), (1, 0), (1, 1))
#: mean and standard deviation of a pixel of the generated frames (4 digits per 16 x 16), measured once
PIXEL_MEAN, PIXEL_STD = 0.27, 0.376
#: digit image side
SIDE = 8


def make_videos(labels: Tensor, images: Tensor, *, frames: int, canvas: int, speed: int, world: int,
                gen: torch.Generator) -> Tensor:
    """Videos ``(B, T, 1, S, S)`` in [0, 1] of the digits ``images (B, K, 8, 8)`` moving in ``labels (B,)``.

    The ``K`` digits of each video are placed at uniformly random positions of a ``world`` torus
    (drawn from ``gen``); frame ``t`` is the window ``[0, canvas)^2`` of that scene shifted by
    ``t * speed`` pixels in the label's direction.
    """
    b, k = images.shape[:2]
    if canvas < SIDE:
        raise ValueError(f"canvas must be at least {SIDE} pixels (a digit's side), got {canvas}")
    if world < canvas + (frames - 1) * speed:
        raise ValueError(f"world must be at least canvas + (frames - 1) * speed = {canvas + (frames - 1) * speed} "
                         f"pixels (nothing seen comes back within a video), got {world}")
    offsets = torch.randint(0, world, (b, k, 2), generator=gen)
    local = torch.arange(SIDE)
    r = (offsets[..., 0, None] + local) % world  # (B, K, 8) the rows of every digit
    c = (offsets[..., 1, None] + local) % world
    flat = (r[..., :, None] * world + c[..., None, :]).reshape(b, -1)  # (B, K 64) pixel indices in the world
    scene = torch.zeros(b, world * world).scatter_reduce_(1, flat, images.reshape(b, -1), "amax")  # brighter wins
    scene = scene.view(b, world, world)  # (B, L, L)
    rows_b = torch.arange(b)[:, None, None]
    step = torch.tensor(DIRECTIONS)[labels] * speed  # (B, 2)
    grid = torch.arange(canvas)
    out = torch.empty(b, frames, 1, canvas, canvas)
    for t in range(frames):  # frame t shows the scene moved t steps: pixel p comes from p - t * step
        r = (grid - t * step[:, 0, None]) % world  # (B, S)
        c = (grid - t * step[:, 1, None]) % world
        out[:, t, 0] = scene[rows_b, r[:, :, None], c[:, None, :]]
    return out


def _overlap(x: Tensor, dr: int, dc: int) -> tuple[Tensor, Tensor]:
    """The parts of frames ``x[:, :-1]`` moved by ``(dr, dc)`` and of ``x[:, 1:]`` that show the same pixels."""
    s = x.shape[-1]
    r0, r1, c0, c1 = max(0, dr), s + min(0, dr), max(0, dc), s + min(0, dc)
    return x[:, :-1, ..., r0 - dr:r1 - dr, c0 - dc:c1 - dc], x[:, 1:, ..., r0:r1, c0:c1]


def estimate_direction(videos: Tensor) -> Tensor:
    """The label whose one-step move best maps each frame onto the next: a model-free oracle, ``(B,)``.

    For every direction and every speed up to a quarter of the canvas, the mean squared difference
    between frame ``t + 1`` and frame ``t`` moved that step, over the pixels both show, summed over
    consecutive pairs; the best (direction, speed) wins.
    """
    b, _, _, s, _ = videos.shape
    best, err = torch.zeros(b, dtype=torch.long), torch.full((b,), float("inf"))
    for speed in range(1, max(2, s // 4 + 1)):
        for label, (dr, dc) in enumerate(DIRECTIONS):
            before, after = _overlap(videos, dr * speed, dc * speed)
            e = ((after - before) ** 2).flatten(2).mean(2).sum(1)
            better = e < err
            best, err = torch.where(better, label, best), torch.where(better, e, err)
    return best


@register_task
class MovingDigitsTask(Task):
    """Classify the direction of a moving scene of digits (a :class:`~attnlab.models.VideoTransformer`)."""

    name = "moving-digits"
    model_type = "VideoTransformer"
    option_defaults: dict[str, Any] = {"frames": 8, "canvas": 16, "world": 64, "digits": 4, "speed": 2,
                                       "patch_size": 2, "val_size": 512, "test_size": 1024}
    model_defaults: dict[str, Any] = {"dim": 48, "heads": 4, "layers": 2, "ff_dim": 96, "attention": "divided",
                                      "positional": "sinusoidal"}
    train_defaults: dict[str, Any] = {"steps": 2000, "batch_size": 32, "lr": 2e-3, "warmup": 50, "min_lr": 1e-5,
                                      "eval_every": 250, "eval_batches": 4, "weight_decay": 0.05}
    item_unit = "video"
    #: sequence lengths in tokens, ``frames * (canvas / patch_size)^2`` (:meth:`options_at_length`)
    length_range = (2, 1 << 20)

    def options_at_length(self, n: int) -> dict[str, Any]:
        """The frames that make a video ``n`` tokens long: ``n / (canvas / patch_size)^2``, which must be whole.

        A length curriculum (``--curriculum 128:600,256:300`` at patch 4) trains on short videos first; the
        model built for the last phase's frames takes the shorter ones (the first frames' positions).
        """
        per_frame = (self.options["canvas"] // self.options["patch_size"]) ** 2
        if n % per_frame or n // per_frame < 2:
            raise ValueError(f"moving-digits lengths are whole videos of >= 2 frames of {per_frame} tokens "
                             f"(canvas {self.options['canvas']} / patch {self.options['patch_size']}, squared), got {n}")
        return {"frames": n // per_frame}

    def validate_options(self) -> None:
        o = self.options
        for name in ("frames", "digits", "speed", "patch_size", "val_size", "test_size"):
            if o[name] < 1:
                raise ValueError(f"moving-digits option {name} must be >= 1, got {o[name]}")
        if o["frames"] < 2:
            raise ValueError(f"moving-digits needs frames >= 2 (motion shows between frames), got {o['frames']}")
        if o["canvas"] < SIDE or o["canvas"] % o["patch_size"]:
            raise ValueError(f"canvas must be >= {SIDE} and divisible by patch_size, got canvas={o['canvas']}, "
                             f"patch_size={o['patch_size']}")
        reach = o["canvas"] + (o["frames"] - 1) * o["speed"]
        if o["world"] < reach:
            raise ValueError(f"world must be at least canvas + (frames - 1) * speed = {reach} (nothing seen comes "
                             f"back within a video), got world={o['world']}")

    def setup(self) -> None:
        self.validate_options()
        o = self.options
        images, classes = load_digits()  # (1797, 1, 8, 8) in [0, 1]
        pools = split_indices(len(classes), (0.8, 0.1, 0.1), self.seed)
        self.pools = {}
        for split, idx in zip(("train", "val", "test"), pools):
            idx_t = torch.tensor(idx)
            by_class = [idx_t[classes[idx_t] == c] for c in range(10)]
            self.pools[split] = (images[:, 0], by_class)
        self.fixed = {"val": self._draw("val", o["val_size"], step_generator(self.seed, 0, stream=1)),
                      "test": self._draw("test", o["test_size"], step_generator(self.seed, 0, stream=2))}

    def _draw(self, split: str, n: int, gen: torch.Generator) -> dict[str, Tensor]:
        """``n`` videos from the split's digit images: balanced directions, digit classes in turn."""
        o = self.options
        images, by_class = self.pools[split]
        labels = (torch.arange(n) % len(DIRECTIONS))[torch.randperm(n, generator=gen)]
        k = round(o["digits"] * (o["world"] / o["canvas"]) ** 2)  # digits per canvas area, over the world
        start = int(torch.randint(0, 10, (), generator=gen))
        digit_classes = ((torch.arange(n * k) + start) % 10)[torch.randperm(n * k, generator=gen)].view(n, k)
        picks = torch.empty(n, k, dtype=torch.long)
        for c in range(10):
            where = digit_classes == c
            pool = by_class[c]
            picks[where] = pool[torch.randint(0, len(pool), (int(where.sum()),), generator=gen)]
        videos = make_videos(labels, images[picks], frames=o["frames"], canvas=o["canvas"], speed=o["speed"],
                             world=o["world"], gen=gen)
        return {"videos": (videos - PIXEL_MEAN) / PIXEL_STD, "labels": labels, "digits": digit_classes}

    def baseline(self, split: str = "test") -> float | None:
        """Accuracy of a constant answer: 1/8, every direction being equally frequent."""
        return 1.0 / len(DIRECTIONS)

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        self.ensure_setup()
        data = self.fixed[split]
        return {"videos": data["videos"][:size], "labels": data["labels"][:size]}

    def model_config(self) -> dict[str, Any]:
        o = self.options
        return {"frames": o["frames"], "image_size": o["canvas"], "patch_size": o["patch_size"], "channels": 1,
                "num_classes": len(DIRECTIONS)}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        batch = self._draw("train", batch_size, step_generator(self.seed, step))
        return {"videos": batch["videos"], "labels": batch["labels"]}

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        out = model(batch["videos"])
        return masked_cross_entropy(out.logits, batch["labels"], None, label_smoothing), None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        """Loss and accuracy on ``split``; with ``final`` also the accuracy with every video's frames shuffled."""
        self.ensure_setup()
        data = self.fixed[split]
        n = len(data["labels"]) if max_batches is None else min(len(data["labels"]), max_batches * batch_size)
        videos, labels = data["videos"][:n], data["labels"][:n]
        device = next(model.parameters()).device

        def logits_of(v: Tensor) -> Tensor:
            return torch.cat([model(v[i:i + batch_size].to(device)).logits.float().cpu()
                              for i in range(0, len(v), batch_size)])

        logits = logits_of(videos)
        out = {"loss": float(masked_cross_entropy(logits, labels)),
               "accuracy": float((logits.argmax(-1) == labels).float().mean())}
        if final:
            g = torch.Generator().manual_seed(self.seed + 17)
            order = torch.stack([torch.randperm(videos.shape[1], generator=g) for _ in range(n)])  # (n, T)
            shuffled = videos[torch.arange(n)[:, None], order]
            out["accuracy_frames_shuffled"] = float((logits_of(shuffled).argmax(-1) == labels).float().mean())
        return out
