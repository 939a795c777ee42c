"""What every sequence-classification task shares: padded batches of ``(token ids, label)``
rows, masked cross-entropy on the label, accuracy in evaluation.

A subclass fills ``self.ids`` in ``setup()`` (split name -> list of ``(ids, label)``) and
sets ``bucket_by_length`` when batches should group similar lengths.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import masks
from .base import EpochBatcher, Task, masked_cross_entropy
from .tokenizer import PAD  # 0, also ListOps' padding id


class SequenceClassificationTask(Task):
    """Base of tasks whose examples are a token sequence and one class label."""

    #: group training batches by length (less padding for widely varying lengths)
    bucket_by_length: bool = False
    ids: dict[str, list[tuple[list[int], int]]]
    _batcher: EpochBatcher | None = None

    def _collate(self, rows: list[tuple[list[int], int]]) -> dict[str, Tensor]:
        tokens = torch.full((len(rows), max(len(r) for r, _ in rows)), PAD, dtype=torch.long)  # (B, N)
        for i, (ids, _) in enumerate(rows):
            tokens[i, : len(ids)] = torch.tensor(ids)
        labels = torch.tensor([y for _, y in rows], dtype=torch.long)  # (B,)
        return {"tokens": tokens, "mask": tokens != PAD, "labels": labels}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        train = self.ids["train"]
        if self._batcher is None or self._batcher.batch_size != batch_size:
            lengths = [len(r[0]) for r in train] if self.bucket_by_length else None
            self._batcher = EpochBatcher(len(train), batch_size, self.seed, lengths=lengths)
        return self._collate([train[i] for i in self._batcher.indices(step)])

    def data_position(self, step: int, batch_size: int) -> dict[str, Any]:
        self.ensure_setup()
        return EpochBatcher(len(self.ids["train"]), batch_size, self.seed).position(step)

    def items_per_batch(self, batch: dict[str, Tensor]) -> int:
        return int(batch["mask"].sum())

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        self.ensure_setup()
        return self._collate(self._rows(split)[:size])

    def baseline(self, split: str = "test") -> float | None:
        """Accuracy of always answering the most frequent label of ``split`` (the majority class)."""
        self.ensure_setup()
        labels = torch.tensor([y for _, y in self._rows(split)])
        return float(torch.bincount(labels).max()) / max(1, labels.numel())

    def _rows(self, split: str) -> list[tuple[list[int], int]]:
        if split not in self.ids:
            raise ValueError(f"task {self.name!r} has the splits {sorted(self.ids)}, got {split!r}")
        return self.ids[split]

    def structure(self, tokens: Tensor) -> masks.Mask | None:
        """A mask the model's attention keeps beside padding (:meth:`loss` and :meth:`evaluate` pass it), or None."""
        return None

    def _forward(self, model: nn.Module, tokens: Tensor, keep: Tensor, return_weights: bool = False):
        structure = self.structure(tokens)
        extra = {} if structure is None else {"mask": structure}
        return model(tokens, keep, return_weights=return_weights, **extra)

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        out = self._forward(model, batch["tokens"], batch["mask"], return_weights)
        return masked_cross_entropy(out.logits, batch["labels"], None, label_smoothing), out.attentions

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        """Mean loss and accuracy over ``split`` (batches of similar length, in order)."""
        self.ensure_setup()
        rows = self._rows(split)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        device = next(model.parameters()).device
        right, total, loss_sum = 0, 0, 0.0
        chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        for chunk in chunks[:max_batches] if max_batches else chunks:
            b = {k: v.to(device) for k, v in self._collate([rows[i] for i in chunk]).items()}
            logits = self._forward(model, b["tokens"], b["mask"]).logits
            loss_sum += float(masked_cross_entropy(logits, b["labels"])) * len(chunk)
            right += int((logits.argmax(-1) == b["labels"]).sum())
            total += len(chunk)
        return {"loss": loss_sum / total, "accuracy": right / total}
