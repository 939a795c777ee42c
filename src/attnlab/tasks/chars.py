"""Character-level language modelling on any text file (Karpathy's char-rnn / minimal-GPT setup).

The vocabulary is the set of characters in the file (sorted), the first ``train_fraction``
(90%) of the characters train and the rest validate. A training example is a window
of ``context + 1`` characters starting at a random offset (drawn from a generator
seeded with ``(seed, step)``); validation averages the next-character loss over
``eval_batches`` windows drawn with a fixed seed, as the well-known minimal GPT
estimates it, and reports it also in bits per character (``loss / ln 2``) with the
next-character accuracy. Generation encodes a prompt with the same vocabulary.

Time O(file size) to read and encode; memory O(file size) (int64 ids).
Shape legend: ``B`` batch, ``N`` context, ``V`` vocabulary (distinct characters).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .base import Task, masked_cross_entropy, perplexity, register_task, require_file, step_generator

__all__ = ["CharsTask", "CharVocab"]



class CharVocab:
    """A character vocabulary: ``encode(str) -> list[int]``, ``decode(list[int]) -> str``."""

    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; unknown characters raise ValueError naming them."""
        missing = sorted({c for c in text if c not in self.index})
        if missing:
            raise ValueError(f"prompt has characters outside the training vocabulary: {missing!r}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        """Text of ``ids``."""
        return "".join(self.chars[int(i)] for i in ids)

    def __len__(self) -> int:
        return len(self.chars)

    def save(self, directory: Path) -> None:
        """Write ``vocab.json`` into ``directory`` (a checkpoint)."""
        (Path(directory) / "vocab.json").write_text(json.dumps({"chars": self.chars}))

    @classmethod
    def load(cls, directory: Path) -> CharVocab | None:
        """The vocabulary :meth:`save` wrote into ``directory`` (None: there is none)."""
        p = Path(directory) / "vocab.json"
        return cls(json.loads(p.read_text())["chars"]) if p.is_file() else None


@register_task
class CharsTask(Task):
    """Next-character prediction with a :class:`~attnlab.models.CausalLM`."""

    name = "chars"
    model_type = "CausalLM"
    option_defaults: dict[str, Any] = {"context": 64, "train_fraction": 0.9}
    model_defaults: dict[str, Any] = {"dim": 128, "heads": 4, "layers": 4, "positional": "learned", "bias": False}
    train_defaults: dict[str, Any] = {"steps": 2000, "batch_size": 12, "lr": 1e-3, "min_lr": 1e-4, "warmup": 100,
                                      "beta2": 0.99, "weight_decay": 0.1, "eval_every": 250, "eval_batches": 20,
                                      "grad_clip": 1.0}
    item_unit = "tok"
    eval_splits = ("val",)
    attention_mask = "causal"
    score_metric = "bits_per_char"
    lower_is_better = True
    length_range = (16, 65536)

    def __init__(self, data: str | None = None, seed: int = 0, **options: Any):
        super().__init__(data, seed, **options)
        self.vocab: CharVocab | None = None
        c, f = self.options["context"], self.options["train_fraction"]
        if c < 1 or not 0.0 < f < 1.0:
            raise ValueError(f"chars needs context >= 1 and 0 < train_fraction < 1, got context={c} train_fraction={f}")

    def setup(self) -> None:
        path = require_file(self.data, self.name, "a text file", "tinyshakespeare", "input.txt")
        text = path.read_text(encoding="utf-8")
        if self.vocab is None:
            self.vocab = CharVocab(sorted(set(text)))
        ids = torch.tensor(self.vocab.encode(text), dtype=torch.long)
        cut = int(len(ids) * self.options["train_fraction"])
        self.train_ids, self.val_ids = ids[:cut], ids[cut:]
        need = self.options["context"] + 2
        if len(self.train_ids) < need or len(self.val_ids) < need:
            raise ValueError(f"{path} is too short for context {self.options['context']}: "
                             f"{len(self.train_ids)} train and {len(self.val_ids)} validation characters")

    def model_config(self) -> dict[str, Any]:
        if self.vocab is None:
            self.ensure_setup()
        return {"vocab_size": len(self.vocab), "max_len": max(self.options["context"], 16)}

    def _windows(self, ids: Tensor, g: torch.Generator, n: int) -> Tensor:
        c = self.options["context"]
        starts = torch.randint(0, len(ids) - c - 1, (n,), generator=g)  # (n,)
        offsets = torch.arange(c + 1)  # (c+1,)
        return ids[starts[:, None] + offsets]  # (n, c+1)

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        return {"tokens": self._windows(self.train_ids, step_generator(self.seed, step), batch_size)}

    def items_per_batch(self, batch: dict[str, Tensor]) -> int:
        return int(batch["tokens"].shape[0] * (batch["tokens"].shape[1] - 1))

    def options_at_length(self, n: int) -> dict[str, Any]:
        return {"context": n}

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        self.ensure_setup()
        g = step_generator(self.seed, 0, stream=3 if split == "val" else 4)
        return {"tokens": self._windows(self._ids(split), g, size)}

    def _ids(self, split: str) -> Tensor:
        if split not in ("val", "train"):
            raise ValueError(f"chars has the splits 'train' and 'val' (the last 10% of the file), got {split!r}")
        return self.val_ids if split == "val" else self.train_ids

    def baseline(self, split: str = "val") -> float | None:
        """Bits per character of a smoothed bigram model fitted on the training text, on ``split``.

        The next character's probability given the last one, with add-one smoothing; the first
        character of the split is scored by the add-one unigram. A model that is not well below
        this has learned no more than pairs of characters, nothing of its context.
        """
        self.ensure_setup()
        V = len(self.vocab)
        tr = self.train_ids
        counts = torch.zeros(V, V, dtype=torch.float64)
        counts.index_put_((tr[:-1], tr[1:]), torch.ones(len(tr) - 1, dtype=torch.float64), accumulate=True)
        logp = torch.log2((counts + 1.0) / (counts.sum(1, keepdim=True) + V))  # (V, V) log2 P(next | prev)
        ids = self._ids(split)
        first = torch.log2((torch.bincount(tr, minlength=V).double()[ids[0]] + 1.0) / (len(tr) + V))
        total = float(logp[ids[:-1], ids[1:]].sum() + first)
        return -total / len(ids)

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        tokens = batch["tokens"]
        out = model(tokens[:, :-1], return_weights=return_weights)
        return masked_cross_entropy(out.logits, tokens[:, 1:], None, label_smoothing), out.attentions

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        self.ensure_setup()
        ids = self._ids(split)
        n_batches = max_batches or 20
        g = step_generator(self.seed, 0, stream=3 if split == "val" else 4)
        device = next(model.parameters()).device
        losses, right, total = [], 0, 0
        for _ in range(n_batches):
            t = self._windows(ids, g, batch_size).to(device)
            logits = model(t[:, :-1]).logits  # (b, N, V)
            losses.append(float(masked_cross_entropy(logits, t[:, 1:])))
            right += int((logits.argmax(-1) == t[:, 1:]).sum())
            total += t[:, 1:].numel()
        loss = sum(losses) / len(losses)
        return {"loss": loss, "perplexity": perplexity(loss), "bits_per_char": loss / math.log(2),
                "accuracy": right / max(total, 1)}

    def save_assets(self, directory: Path) -> None:
        self.vocab.save(directory)

    def load_assets(self, directory: Path) -> bool:
        self.vocab = CharVocab.load(directory) or self.vocab
        return self.vocab is not None

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a generation prompt."""
        return self.vocab.encode(text)

    def decode(self, ids) -> str:
        """Text of generated ids."""
        return self.vocab.decode(ids)
