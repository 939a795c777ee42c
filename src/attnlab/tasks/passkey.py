"""Passkey retrieval in real text: a number hidden at a random depth of a passage, asked for at its end.

Mohtashami and Jaggi, 2023, "Landmark Attention" (the passkey retrieval probe of long-context
models), here in natural text: an example of ``length`` characters is a passage of the text
file (tinyshakespeare by default) with the sentence :data:`NEEDLE` inserted at a random depth,
followed by :data:`QUESTION` and the key, a random number of ``digits`` digits. A character-level
causal language model reads it; the loss and the score count only the key's digits. The
score is ``sequence_accuracy``: the share of examples whose every digit is right (what greedy
decoding would answer, see :mod:`.synthetic`). One far dependency in natural text: the model
must find the key wherever it is and copy it; the rest of the passage is real context that
it may not ignore (it must read it to know where the key sentence is).

Splits: training passages come from the first ``train_fraction`` of the file, validation and
test passages from the rest (its first and second half). Depth is the needle's position as
a fraction of the passage: uniform in training; in validation and test it is stratified, so
every tenth of the depth range holds a tenth of the examples.

Vocabulary: every character of the file, the digits and the characters of the needle and the
question, sorted. Time O(file size) to read; an example costs O(length) to build.
Shape legend: ``B`` batch, ``N`` characters per example.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .base import register_task, require_file, step_generator
from .chars import CharVocab
from .synthetic import _LMTask

__all__ = ["NEEDLE", "QUESTION", "PasskeyTask", "find_key"]

#: the sentence that carries the key (``{key}`` twice)
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
#: what follows the passage; the key comes right after it
QUESTION = "\nWhat is the pass key? The pass key is "


def find_key(text: str) -> str | None:
    """The key a passkey example's text carries, read off the needle with a plain pattern (None: no needle)."""
    m = re.search(r"The pass key is (\d+)\. Remember it\. \1 is the pass key\.", text)
    return None if m is None else m.group(1)


@register_task
class PasskeyTask(_LMTask):
    """Find a number hidden in a passage of real text (a :class:`~attnlab.models.CausalLM` over characters).

    Options:
        length: characters per example ``N`` (passage, needle, question and key).
        digits: digits of the key.
        train_fraction: the share of the file the training passages come from.
        val_size: validation and test examples each.
    """

    name = "passkey"
    option_defaults: dict[str, Any] = {"length": 512, "digits": 5, "train_fraction": 0.9, "val_size": 200}
    model_defaults: dict[str, Any] = {**_LMTask.model_defaults, "positional": "rotary"}
    score_metric = "sequence_accuracy"
    length_range = (128, 65536)

    def __init__(self, data: str | None = None, seed: int = 0, **options: Any):
        super().__init__(data, seed, **options)
        self.vocab: CharVocab | None = None

    def options_at_length(self, n: int) -> dict[str, Any]:
        return {"length": n}

    def _fixed(self) -> int:
        """Characters of an example that are not passage: needle, question and key."""
        d = self.options["digits"]
        return len(NEEDLE.format(key="0" * d)) + len(QUESTION) + d

    def validate_options(self) -> None:
        o = self.options
        if not 1 <= o["digits"] <= 12 or o["val_size"] < 1 or not 0.0 < o["train_fraction"] < 1.0:
            raise ValueError(f"passkey needs 1 <= digits <= 12, val_size >= 1 and 0 < train_fraction < 1, got {o}")
        if o["length"] < self._fixed() + 16:
            raise ValueError(f"passkey needs length >= {self._fixed() + 16} (the needle, the question, the key and "
                             f"16 characters of passage), got {o['length']}")

    def setup(self) -> None:
        path = require_file(self.data, self.name, "a text file", "tinyshakespeare", "input.txt")
        self.validate_options()
        text = path.read_text(encoding="utf-8")
        if self.vocab is None:
            extra = set("0123456789") | set(NEEDLE) | set(QUESTION)
            self.vocab = CharVocab(sorted(set(text) | extra))
        cut = int(len(text) * self.options["train_fraction"])
        held = text[cut:]
        self.texts = {"train": text[:cut], "val": held[: len(held) // 2], "test": held[len(held) // 2:]}
        room = self.options["length"] - self._fixed()
        short = [k for k, t in self.texts.items() if len(t) <= room]
        if short:
            raise ValueError(f"{path} is too short for passkey length {self.options['length']}: the {short} text has "
                             f"fewer than {room + 1} characters")
        n = self.options["val_size"]
        self._val = self._examples(step_generator(self.seed, 0, stream=1), n, "val")
        self._test = self._examples(step_generator(self.seed, 0, stream=2), n, "test")

    def model_config(self) -> dict[str, Any]:
        if self.vocab is None:
            self.ensure_setup()
        return {"vocab_size": len(self.vocab), "max_len": max(256, self.options["length"])}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        tokens, mask = self._examples(step_generator(self.seed, step), batch_size, "train")
        return {"tokens": tokens, "target_mask": mask}

    def texts_of(self, split: str, count: int) -> list[tuple[str, str, float]]:
        """``count`` examples of ``split`` as ``(text, key, depth)``, exactly as the batches hold them."""
        g = step_generator(self.seed, 0, stream={"val": 1, "test": 2}[split])
        return self._draw(g, count, split)

    def _draw(self, g: torch.Generator, n: int, split: str) -> list[tuple[str, str, float]]:
        o = self.options
        text = self.texts[split]
        room = o["length"] - self._fixed()
        starts = torch.randint(0, len(text) - room, (n,), generator=g).tolist()
        keys = torch.randint(0, 10 ** o["digits"], (n,), generator=g, dtype=torch.long).tolist()
        u = torch.rand(n, generator=g, dtype=torch.float64).tolist()
        out = []
        for i in range(n):
            depth = (i + u[i]) / n if split != "train" else u[i]  # held-out splits: every tenth of depths
            key = str(keys[i]).zfill(o["digits"])
            passage = text[starts[i]: starts[i] + room]
            at = int(depth * room)
            out.append((passage[:at] + NEEDLE.format(key=key) + passage[at:] + QUESTION + key, key, depth))
        return out

    def _examples(self, g: torch.Generator, n: int, split: str) -> tuple[Tensor, Tensor]:
        rows = self._draw(g, n, split)
        tokens = torch.tensor([self.vocab.encode(t) for t, _, _ in rows], dtype=torch.long)  # (n, N)
        mask = torch.zeros(n, self.options["length"] - 1, dtype=torch.bool)  # over tokens[:, 1:]
        mask[:, -self.options["digits"]:] = True  # the key's digits, the last characters
        return tokens, mask

    def baseline(self, split: str = "test") -> float | None:
        """Exact-match accuracy of always answering the most frequent key of ``split``."""
        keys = [k for _, k, _ in self.texts_of(split, self.options["val_size"])]
        return max(keys.count(k) for k in set(keys)) / len(keys)

    def save_assets(self, directory: Path) -> None:
        self.vocab.save(directory)

    def load_assets(self, directory: Path) -> bool:
        self.vocab = CharVocab.load(directory) or self.vocab
        return self.vocab is not None
