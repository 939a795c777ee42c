"""ListOps: evaluate nested list operations from their token sequence (classification, 10 classes).

Nangia and Bowman, 2018, "ListOps: A Diagnostic Dataset for Latent Tree Learning", in
the form of the Long Range Arena (Tay et al., 2021): operators ``MIN``, ``MAX``, ``MED``
(median, rounded down) and ``SM`` (sum modulo 10) over digits 0-9; a tree node is a
leaf (a random digit) with probability 0.75 and otherwise an operator over 2 to
``max_args`` subtrees, always a leaf at ``max_depth``; sequences outside the length
window ``[min_length, max_length]`` and duplicates are discarded. The label is the value
at the root. The model sees e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` (label 9), after a
classification token. With the option ``tree_mask`` its attention also follows the bracket
tree (:func:`attnlab.masks.brackets`) instead of seeing every token.

The pool of ``train + val + test`` distinct sequences is generated with
``random.Random(seed)`` and cut in that order into the three splits, so the splits are
fixed by the seed and disjoint. The Long Range Arena uses lengths 500-2000 and reports
36-37% test accuracy for the vanilla Transformer; the defaults here are CPU-sized.

Time O(total sequences x length) to generate; memory O(total x length).
Shape legend: ``B`` batch, ``N`` tokens (classification token included), ``C`` = 10 classes.
"""

from __future__ import annotations

import random
from typing import Any

from .. import masks
from .base import register_task
from .classification import SequenceClassificationTask

__all__ = ["ListOpsTask", "generate_listops", "VOCAB", "apply_op"]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
#: token strings by id: padding, classification token, closing bracket, operators, digits
VOCAB = ("<pad>", "<cls>", "]", *OPERATORS, *(str(d) for d in range(10)))
_ID = {t: i for i, t in enumerate(VOCAB)}
PAD, CLS = 0, 1
LEAF_PROBABILITY = 0.75


def apply_op(op: str, values: list[int]) -> int:
    """The value of operator ``op`` over digit arguments."""
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[MED":
        s = sorted(values)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    if op == "[SM":
        return sum(values) % 10
    raise ValueError(f"op must be one of {OPERATORS}, got {op!r}")


class _TooLongError(Exception):
    pass


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int, out: list[str], limit: int) -> int:
    """Append one random subtree's tokens to ``out``; return its value."""
    if len(out) > limit:
        raise _TooLongError
    if depth >= max_depth or rng.random() < LEAF_PROBABILITY:
        d = rng.randrange(10)
        out.append(str(d))
        return d
    n = rng.randint(2, max_args)
    op = rng.choice(OPERATORS)
    out.append(op)
    values = [_tree(rng, depth + 1, max_depth, max_args, out, limit) for _ in range(n)]
    out.append("]")
    return apply_op(op, values)


def generate_listops(n: int, *, seed: int, min_length: int, max_length: int, max_depth: int = 10,
                     max_args: int = 10, max_tries: int | None = None) -> list[tuple[list[str], int]]:
    """``n`` distinct ``(tokens, label)`` examples with ``min_length <= len(tokens) <= max_length``.

    Raises:
        ValueError: when the window is empty or too few distinct sequences turn up in
            ``max_tries`` trees (default ``2000 n + 10000``).
    """
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got min_length={min_length} max_length={max_length}")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got max_depth={max_depth} max_args={max_args}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[list[str], int]] = []
    tries = 0
    limit = max_tries if max_tries is not None else 2000 * n + 10_000
    while len(out) < n:
        tries += 1
        if tries > limit:
            raise ValueError(f"found only {len(out)} of {n} distinct ListOps sequences of length "
                             f"{min_length}-{max_length} in {limit} trees; widen the length window or lower the count")
        toks: list[str] = []
        try:
            value = _tree(rng, 1, max_depth, max_args, toks, max_length)
        except _TooLongError:
            continue
        if not min_length <= len(toks) <= max_length:
            continue
        key = " ".join(toks)
        if key in seen:
            continue
        seen.add(key)
        out.append((toks, value))
    return out


@register_task
class ListOpsTask(SequenceClassificationTask):
    """Classify a ListOps expression by its value (a :class:`~attnlab.models.SequenceClassifier`)."""

    name = "listops"
    model_type = "SequenceClassifier"
    option_defaults: dict[str, Any] = {"train_size": 20000, "val_size": 1000, "test_size": 1000, "min_length": 32,
                                       "max_length": 256, "max_depth": 10, "max_args": 10, "tree_mask": False}
    model_defaults: dict[str, Any] = {"dim": 128, "heads": 4, "layers": 4, "ff_dim": 256, "positional": "sinusoidal",
                                      "pooling": "cls", "scale_embeddings": True}
    train_defaults: dict[str, Any] = {"steps": 3000, "batch_size": 32, "lr": 5e-4, "warmup": 200, "min_lr": 1e-5,
                                      "eval_every": 500, "weight_decay": 0.05}
    item_unit = "tok"
    bucket_by_length = True
    length_range = (16, 8192)

    def options_at_length(self, n: int) -> dict[str, Any]:
        """Expressions of ``n / 4`` to ``n - 1`` tokens: Long Range Arena's 500-1999 at ``n = 2000``."""
        return {"min_length": max(8, n // 4), "max_length": n - 1}

    def model_config(self) -> dict[str, Any]:
        return {"vocab_size": len(VOCAB), "num_classes": 10, "max_len": max(512, self.options["max_length"] + 1)}

    def structure(self, tokens):
        """With ``tree_mask``, the expression's bracket tree (:func:`attnlab.masks.brackets`): a token sees its
        own bracket pair's tokens (all nested inside) and those of the pairs enclosing it; the classification
        token, outside every pair, sees and is seen by every token."""
        if not self.options["tree_mask"]:
            return None
        return masks.brackets(tokens, opening=[_ID[op] for op in OPERATORS], closing=_ID["]"])

    def setup(self) -> None:
        o = self.options
        sizes = (o["train_size"], o["val_size"], o["test_size"])
        if min(sizes) < 1:
            raise ValueError(f"listops split sizes must be >= 1, got train/val/test {sizes}")
        pool = generate_listops(sum(sizes), seed=self.seed, min_length=o["min_length"], max_length=o["max_length"],
                                max_depth=o["max_depth"], max_args=o["max_args"])
        a, b = sizes[0], sizes[0] + sizes[1]
        self.splits = {"train": pool[:a], "val": pool[a:b], "test": pool[b:]}
        self.ids = {k: [([CLS] + [_ID[t] for t in toks], y) for toks, y in v] for k, v in self.splits.items()}
        self._batcher = None

