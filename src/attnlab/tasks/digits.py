"""Handwritten digits as a Vision Transformer task: scikit-learn's bundled 8x8 images.

The UCI optical-recognition digits (1,797 grey 8x8 images, values 0-16, 10 classes)
ship inside scikit-learn (``sklearn.datasets.load_digits``), so no file is needed. Pixels
are scaled to [0, 1] then standardized with the training split's mean and
standard deviation; the images are shuffled with the seed and cut 80/10/10 into
train/val/test. A :class:`~attnlab.models.ViT` (Dosovitskiy et al., 2021) cuts each
image into 2x2 patches (16 tokens plus a class token).

Time per step O(layers B N dim^2 + attention) with N = 17; memory O(dataset) (small).
Shape legend: ``B`` batch, ``C`` = 1 channel, ``S`` = 8 pixels, ``K`` = 10 classes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import EpochBatcher, Task, masked_cross_entropy, register_task, split_indices

__all__ = ["DigitsTask", "load_digits"]


def load_digits() -> tuple[Tensor, Tensor]:
    """Images ``(1797, 1, 8, 8)`` float32 in [0, 1] and labels ``(1797,)``."""
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError as e:
        raise ImportError("the digits task needs scikit-learn: pip install scikit-learn") from e
    d = _load()
    images = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (n, 1, 8, 8)
    return images, torch.tensor(d.target, dtype=torch.long)


@register_task
class DigitsTask(Task):
    """8x8 digit classification with a ViT."""

    name = "digits"
    model_type = "ViT"
    option_defaults: dict[str, Any] = {"patch_size": 2}
    model_defaults: dict[str, Any] = {"dim": 64, "heads": 4, "layers": 2, "ff_dim": 128, "positional": "sinusoidal",
                                      "dropout": 0.1}
    train_defaults: dict[str, Any] = {"steps": 600, "batch_size": 64, "lr": 2e-3, "warmup": 50, "min_lr": 1e-5,
                                      "eval_every": 100, "weight_decay": 0.05}
    item_unit = "img"

    def setup(self) -> None:
        images, labels = load_digits()
        tr, va, te = split_indices(len(labels), (0.8, 0.1, 0.1), self.seed)
        mean, std = images[tr].mean(), images[tr].std()  # standardize with training statistics
        images = (images - mean) / std
        self.splits = {k: (images[idx], labels[idx]) for k, idx in
                       (("train", torch.tensor(tr)), ("val", torch.tensor(va)), ("test", torch.tensor(te)))}
        self._batcher: EpochBatcher | None = None

    def model_config(self) -> dict[str, Any]:
        p = self.options["patch_size"]
        if p < 1 or 8 % p:
            raise ValueError(f"patch_size must divide 8, got {p}")
        return {"image_size": 8, "patch_size": p, "channels": 1, "num_classes": 10}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        images, labels = self.splits["train"]
        if self._batcher is None or self._batcher.batch_size != batch_size:
            self._batcher = EpochBatcher(len(labels), batch_size, self.seed)
        idx = torch.tensor(self._batcher.indices(step))
        return {"images": images[idx], "labels": labels[idx]}

    def data_position(self, step: int, batch_size: int) -> dict[str, Any]:
        self.ensure_setup()
        return EpochBatcher(len(self.splits["train"][1]), batch_size, self.seed).position(step)

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        out = model(batch["images"], return_weights=return_weights)
        return masked_cross_entropy(out.logits, batch["labels"], None, label_smoothing), out.attentions

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        self.ensure_setup()
        images, labels = self.splits[split]
        device = next(model.parameters()).device
        logits = torch.cat([model(images[i:i + batch_size].to(device)).logits.float().cpu()
                            for i in range(0, len(labels), batch_size)])
        return {"loss": float(masked_cross_entropy(logits, labels)),
                "accuracy": float((logits.argmax(-1) == labels).float().mean())}
