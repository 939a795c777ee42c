"""Sentence sentiment classification from tab-separated ``sentence<TAB>label`` files.

Kotzias et al., 2015, "From Group to Individual Labels using Deep Features" (the UCI
Sentiment Labelled Sentences: Amazon, IMDB and Yelp reviews, labels 0/1). The pooled
examples are shuffled with the seed and cut 80/10/10 into train/val/test; a word-level
(or BPE) tokenizer is trained on the training sentences; a Transformer encoder with mean
pooling classifies. Files are split on ``\\n`` only, because the IMDB file holds U+0085.

Data: ``--data`` a file, a directory (every ``*.txt`` in it) or comma-separated files; without
``--data``, the fetched copy (``attnlab data fetch sentiment``).
Time per step O(layers B N dim^2 + attention); memory O(dataset).
Shape legend: ``B`` batch, ``N`` tokens, ``C`` classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import MissingDataError, read_lines, register_task, require_file, split_indices
from .classification import SequenceClassificationTask
from .tokenizer import BOS, load_tokenizer, train_tokenizer

__all__ = ["SentimentTask", "read_labelled"]



def read_labelled(path: Path) -> list[tuple[str, int]]:
    """``(sentence, label)`` rows of one ``sentence<TAB>label`` file (blank lines skipped)."""
    rows = []
    for n, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        text, sep, label = line.rpartition("\t")
        if not sep or not label.strip().lstrip("-").isdigit():
            raise ValueError(f"{path}:{n} must be 'sentence<TAB>integer label', got {line[:80]!r}")
        rows.append((text, int(label)))
    return rows


@register_task
class SentimentTask(SequenceClassificationTask):
    """Sentence classification (a :class:`~attnlab.models.SequenceClassifier`)."""

    name = "sentiment"
    model_type = "SequenceClassifier"
    option_defaults: dict[str, Any] = {"tokenizer": "word", "vocab_size": 8000, "max_tokens": 128, "lowercase": True}
    model_defaults: dict[str, Any] = {"dim": 64, "heads": 4, "layers": 2, "ff_dim": 128, "dropout": 0.1,
                                      "pooling": "mean", "positional": "sinusoidal", "scale_embeddings": True}
    train_defaults: dict[str, Any] = {"steps": 600, "batch_size": 32, "lr": 1e-3, "warmup": 50, "min_lr": 1e-5,
                                      "eval_every": 100, "weight_decay": 0.05}
    item_unit = "tok"

    def __init__(self, data: str | None = None, seed: int = 0, **options: Any):
        super().__init__(data, seed, **options)
        self.tok = None

    def _files(self) -> list[Path]:
        if self.data is not None and "," in self.data and not Path(self.data).exists():
            return [require_file(p.strip(), self.name, "a sentence<TAB>label file", "sentiment") for p in self.data.split(",")]
        p = require_file(self.data, self.name, "sentence<TAB>label files (a file or a directory of *.txt)",
                         "sentiment")
        if p.is_dir():
            files = sorted(p.glob("*.txt"))
            if not files:
                raise MissingDataError(f"task 'sentiment' expected *.txt files in {str(p)!r}, found none")
            return files
        return [p]

    def setup(self) -> None:
        rows = [r for f in self._files() for r in read_labelled(f)]
        labels = sorted({y for _, y in rows})
        if labels[0] < 0 or len(labels) < 2:
            raise ValueError(f"labels must be integers >= 0 with at least two classes, got {labels}")
        self.num_classes = labels[-1] + 1
        tr, va, te = split_indices(len(rows), (0.8, 0.1, 0.1), self.seed)
        self.text = {k: [rows[i] for i in idx] for k, idx in (("train", tr), ("val", va), ("test", te))}
        if self.tok is None:
            o = self.options
            self.tok = train_tokenizer([s for s, _ in self.text["train"]], kind=o["tokenizer"],
                                       vocab_size=o["vocab_size"], lowercase=o["lowercase"])
        self.ids = {k: [(self.encode(s), y) for s, y in v] for k, v in self.text.items()}
        self._batcher = None

    def encode(self, sentence: str) -> list[int]:
        """``<s>`` then the sentence's ids, cut to ``max_tokens``."""
        return ([BOS] + self.tok.encode(sentence).ids)[: self.options["max_tokens"]]

    def model_config(self) -> dict[str, Any]:
        self.ensure_setup()
        return {"vocab_size": self.tok.get_vocab_size(), "num_classes": self.num_classes,
                "max_len": max(512, self.options["max_tokens"])}

    def save_assets(self, directory: Path) -> None:
        self.tok.save(str(directory / "tokenizer.json"))

    def load_assets(self, directory: Path) -> bool:
        p = Path(directory) / "tokenizer.json"
        if not p.is_file():
            return False
        self.tok = load_tokenizer(p)
        return True
