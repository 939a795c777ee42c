"""Synthetic sequence tasks for a causal language model: copy, reverse, sort, associative recall.

Each example is generated from a seeded generator, so every batch is a function of
``(seed, step)`` and the validation set is fixed by the seed.

* ``copy`` / ``reverse`` / ``sort``: ``x_1 .. x_L SEP y_1 .. y_L`` with ``y`` the input,
  the input reversed, or the input sorted (Graves et al., 2014, "Neural Turing
  Machines", copy; Vinyals et al., 2015, "Pointer Networks", sorting). The loss counts
  only the ``L`` output positions.
* ``associative-recall``: ``k_1 v_1 .. k_n v_n q a``, distinct keys, ``q`` one of them,
  ``a`` its value, optionally several queries per sequence (Ba et al., 2016, "Using Fast Weights to Attend to the Recent Past";
  the induction-head probe of Olsson et al., 2022). The loss counts only the answers.
* ``mqar``: multi-query associative recall at length (Arora et al., 2024, "Zoology"): a
  block of ``pairs`` key-value pairs at a random offset of an ``N``-token sequence of
  filler, and every key asked once at a later position (uniform, or by Zoology's power law
  over the distance from the block), its value right after it. The loss counts only the
  answers. Fixed-state approximations (linear attention, small feature maps) must fit every
  pair in their state; exact attention looks them up. The random offset keeps the pairs
  away from any fixed place (a window or a global block at the start would otherwise see
  them).

Accuracy is measured teacher-forced; the sequence accuracy (every output token right)
equals greedy decoding's exact-match rate, because greedy decoding reproduces the
teacher-forced inputs as long as every prediction is right.

Time per example O(L log L) to generate; the model costs O(layers (N dim^2 + N^2 dim)).
Shape legend: ``B`` batch, ``L`` input length, ``N`` sequence length, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .base import Task, masked_cross_entropy, register_task, step_generator

__all__ = ["CopyTask", "ReverseTask", "SortTask", "AssociativeRecallTask", "MQARTask"]

PAD, SEP, FIRST = 0, 1, 2


class _LMTask(Task):
    """A causal LM trained on ``tokens (B, N)`` with a loss mask over ``tokens[:, 1:]``."""

    model_type = "CausalLM"
    attention_mask = "causal"
    # token embeddings N(0, 1), unscaled, and an output projection of their own: GPT-2's 0.02 stalls
    # content matching for hundreds of steps. (scale_embeddings starts the same but its sqrt(dim)
    # factor speeds the embeddings' updates 8x: exact attention still learns associative recall,
    # linear attention then stalls at 34 % instead of 99.98 %, so the synthetic tasks keep this.)
    model_defaults: dict[str, Any] = {"dim": 64, "heads": 4, "layers": 2, "positional": "learned", "max_len": 256,
                                      "tie_embeddings": False}
    train_defaults: dict[str, Any] = {"steps": 600, "batch_size": 32, "lr": 3e-3, "warmup": 50, "min_lr": 1e-4,
                                      "eval_every": 200, "weight_decay": 0.01, "embed_std": 1.0}
    item_unit = "tok"

    def _examples(self, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        """``n`` examples: tokens ``(n, N)`` and target mask ``(n, N-1)`` over ``tokens[:, 1:]``."""
        raise NotImplementedError

    def setup(self) -> None:
        self.model_config()  # validates the options before generating
        self._val = self._examples(step_generator(self.seed, 0, stream=1), self.options["val_size"])
        self._test = self._examples(step_generator(self.seed, 0, stream=2), self.options["val_size"])

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        tokens, mask = self._examples(step_generator(self.seed, step), batch_size)
        return {"tokens": tokens, "target_mask": mask}

    def items_per_batch(self, batch: dict[str, Tensor]) -> int:
        return int(batch["tokens"].numel())

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        self.ensure_setup()
        tokens, mask = self._split(split)
        return {"tokens": tokens[:size], "target_mask": mask[:size]}

    def _split(self, split: str) -> tuple[Tensor, Tensor]:
        if split not in ("val", "test"):
            raise ValueError(f"task {self.name!r} has the held-out splits 'val' and 'test', got {split!r}")
        return self._val if split == "val" else self._test

    def baseline(self, split: str = "test") -> float | None:
        """Accuracy of always answering the most frequent answer token of ``split``."""
        self.ensure_setup()
        tokens, mask = self._split(split)
        answers = tokens[:, 1:][mask]
        return float(torch.bincount(answers).max()) / max(1, answers.numel())

    def validate_options(self) -> None:
        self.model_config()

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        tokens = batch["tokens"]
        out = model(tokens[:, :-1], return_weights=return_weights)
        loss = masked_cross_entropy(out.logits, tokens[:, 1:], batch["target_mask"], label_smoothing)
        return loss, out.attentions

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        self.ensure_setup()
        tokens, mask = self._split(split)
        device = next(model.parameters()).device
        total_loss, n_tok, right_tok, right_seq, n_seq = 0.0, 0, 0, 0, 0
        starts = list(range(0, tokens.shape[0], batch_size))
        if max_batches is not None:
            starts = starts[:max_batches]
        for s in starts:
            t = tokens[s:s + batch_size].to(device)
            m = mask[s:s + batch_size].to(device)
            logits = model(t[:, :-1]).logits  # (b, N-1, V)
            k = int(m.sum())
            total_loss += float(masked_cross_entropy(logits, t[:, 1:], m)) * k
            ok = (logits.argmax(-1) == t[:, 1:]) | ~m  # (b, N-1)
            right_tok += int((ok & m).sum())
            right_seq += int(ok.all(dim=1).sum())
            n_tok += k
            n_seq += t.shape[0]
        return {"loss": total_loss / max(n_tok, 1), "accuracy": right_tok / max(n_tok, 1),
                "sequence_accuracy": right_seq / max(n_seq, 1)}


class _TransformTask(_LMTask):
    option_defaults: dict[str, Any] = {"length": 16, "vocab": 10, "val_size": 512}

    def _check(self) -> None:
        if self.options["length"] < 1 or self.options["vocab"] < 2 or self.options["val_size"] < 1:
            raise ValueError(f"task {self.name!r} needs length >= 1, vocab >= 2 and val_size >= 1, got {self.options}")

    def model_config(self) -> dict[str, Any]:
        self._check()
        return {"vocab_size": FIRST + self.options["vocab"], "max_len": max(256, 2 * self.options["length"] + 1)}

    def transform(self, x: Tensor) -> Tensor:
        """``x (B, L) -> y (B, L)``."""
        raise NotImplementedError

    def _examples(self, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        L, V = self.options["length"], self.options["vocab"]
        x = torch.randint(FIRST, FIRST + V, (n, L), generator=g)
        sep = torch.full((n, 1), SEP, dtype=torch.long)
        tokens = torch.cat([x, sep, self.transform(x)], dim=1)  # (n, 2L+1)
        mask = torch.zeros(n, 2 * L, dtype=torch.bool)  # over tokens[:, 1:]
        mask[:, L:] = True
        return tokens, mask


@register_task
class CopyTask(_TransformTask):
    """Repeat the input after the separator."""

    name = "copy"

    def transform(self, x: Tensor) -> Tensor:
        return x.clone()


@register_task
class ReverseTask(_TransformTask):
    """Write the input backwards after the separator."""

    name = "reverse"

    def transform(self, x: Tensor) -> Tensor:
        return x.flip(1)


@register_task
class SortTask(_TransformTask):
    """Write the input's tokens in ascending order after the separator."""

    name = "sort"

    def transform(self, x: Tensor) -> Tensor:
        return x.sort(dim=1).values


@register_task
class AssociativeRecallTask(_LMTask):
    """Given key-value pairs and query keys, produce each query's value.

    ``queries`` > 1 asks several keys in one sequence (``.. q_1 a_1 q_2 a_2 ..``, the
    multi-query form of Arora et al., 2024, "Zoology"): more supervised answers per
    example, the same skill. Queries are distinct keys.
    """

    name = "associative-recall"
    option_defaults: dict[str, Any] = {"pairs": 8, "keys": 16, "values": 16, "queries": 4, "val_size": 1024}
    train_defaults = {**_LMTask.train_defaults, "steps": 1000, "batch_size": 64}

    def model_config(self) -> dict[str, Any]:
        o = self.options
        if o["pairs"] < 1 or o["keys"] < o["pairs"] or o["values"] < 2 or o["val_size"] < 1 or \
                not 1 <= o["queries"] <= o["pairs"]:
            raise ValueError(f"associative-recall needs 1 <= queries <= pairs <= keys, values >= 2, val_size >= 1, "
                             f"got {o}")
        return {"vocab_size": 1 + o["keys"] + o["values"], "max_len": max(256, 2 * o["pairs"] + 2 * o["queries"])}

    def _examples(self, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        P, K, V, Q = self.options["pairs"], self.options["keys"], self.options["values"], self.options["queries"]
        keys = torch.rand(n, K, generator=g).argsort(dim=1)[:, :P] + 1  # (n, P) distinct ids 1..K
        values = torch.randint(1 + K, 1 + K + V, (n, P), generator=g)  # (n, P)
        which = torch.rand(n, P, generator=g).argsort(dim=1)[:, :Q]  # (n, Q) distinct pairs asked
        pairs = torch.stack([keys, values], dim=2).reshape(n, 2 * P)  # (n, 2P) k1 v1 k2 v2 ...
        asked = torch.stack([keys.gather(1, which), values.gather(1, which)], dim=2).reshape(n, 2 * Q)  # (n, 2Q)
        tokens = torch.cat([pairs, asked], dim=1)  # (n, 2P+2Q)
        mask = torch.zeros(n, 2 * P + 2 * Q - 1, dtype=torch.bool)  # over tokens[:, 1:]
        mask[:, 2 * P::2] = True  # the answers a_1 .. a_Q
        return tokens, mask


@register_task
class MQARTask(_LMTask):
    """Multi-query associative recall over a long sequence (Zoology's MQAR).

    A sequence of ``length`` tokens (``N``, the model reads ``N - 1`` of them) is filler (a
    token of its own vocabulary, one filler token by default) with a block of ``pairs``
    key-value pairs ``k_1 v_1 .. k_P v_P`` in it; every key is then asked once, in a random
    order, at a position after the block (``.. q a ..``, with ``a`` the value the key was
    paired with). Keys are distinct within a sequence; values may repeat. The loss and the
    accuracy count only the ``P`` answers.

    Where things go:

    * ``layout="random"`` (default): the block starts at an offset drawn uniformly from
      ``0 .. N - 4P`` (room for the queries after it); ``"start"``: at position 0.
    * ``placement="uniform"`` (default): the queries take distinct (query, answer) slots after
      the block, uniformly; ``"power"``: slot ``s`` (counted from the block's end) is drawn with
      weight ``a * (s + 1) ** (a - 1)``, ``a = power_a``, without replacement (Zoology's power
      law: most queries near the block, a long tail far from it).

    The defaults keep the vocabulary small (keys ``2P``, 16 values, one filler): with
    64 keys and values and 16 random fillers the arena's 2-layer model stayed at 10 %
    for 800 steps at N = 256, where with these it learns the task in a few hundred.

    Vocabulary: ``0`` padding (unused), keys ``1..K``, values ``K+1..K+V``, filler
    ``K+V+1..K+V+F`` (``keys``, ``values``, ``fillers`` options; ``keys >= pairs``).

    In a length curriculum (:meth:`at_length`) a phase shorter than ``4 * pairs`` asks as many
    pairs as fit, ``length / 4``, drawn from a share of the keys in proportion (``keys_used``; the
    vocabulary stays the target's, so every token keeps its meaning across phases): the block
    and its queries then fill the sequence (the short phase of associative recall the arena
    starts with), and the target length has them all. (Measured with the arena model: 8 pairs
    drawn from 16 keys at N = 32 are learned in 300 steps; drawn from 32 keys, not in 1,000.)

    Options:
        length: tokens per sequence ``N`` (>= 4 * pairs).
        pairs: key-value pairs ``P``, each asked once.
        keys, values, fillers: vocabulary sizes.
        keys_used: draw the keys from the first ``keys_used`` key ids only (0: all ``keys``).
        layout: ``random`` or ``start`` (where the block of pairs is).
        placement, power_a: where the queries go (``uniform`` or ``power``) and the power law's exponent.
        val_size: validation and test examples each.
    """

    name = "mqar"
    option_defaults: dict[str, Any] = {"length": 256, "pairs": 16, "keys": 32, "keys_used": 0, "values": 16,
                                       "fillers": 1, "layout": "random", "placement": "uniform", "power_a": 0.01,
                                       "val_size": 512}
    train_defaults = {**_LMTask.train_defaults, "steps": 1000, "batch_size": 32}
    length_range = (8, 65536)

    def options_at_length(self, n: int) -> dict[str, Any]:
        """Length ``n``, with as many of the pairs as fit (``n / 4``) and the keys in proportion: a short
        phase asks fewer pairs, from a smaller key vocabulary."""
        o = self.options
        pairs = max(1, min(o["pairs"], n // 4))
        used = 0 if pairs == o["pairs"] else max(pairs, o["keys"] * pairs // o["pairs"])
        return {"length": n, "pairs": pairs, "keys_used": used}

    def model_config(self) -> dict[str, Any]:
        o = self.options
        if o["pairs"] < 1 or o["keys"] < o["pairs"] or o["values"] < 2 or o["fillers"] < 1 or o["val_size"] < 1:
            raise ValueError(f"mqar needs 1 <= pairs <= keys, values >= 2, fillers >= 1 and val_size >= 1, got {o}")
        if o["keys_used"] and not o["pairs"] <= o["keys_used"] <= o["keys"]:
            raise ValueError(f"mqar needs pairs <= keys_used <= keys (or keys_used 0: all), got {o}")
        if o["length"] < 4 * o["pairs"]:
            raise ValueError(f"mqar needs length >= 4 * pairs (pairs, then room for every query and answer), "
                             f"got length={o['length']} pairs={o['pairs']}")
        if o["layout"] not in ("random", "start") or o["placement"] not in ("uniform", "power"):
            raise ValueError(f"mqar layout must be 'random' or 'start' and placement 'uniform' or 'power', got "
                             f"layout={o['layout']!r} placement={o['placement']!r}")
        if not 0 < o["power_a"] <= 1:
            raise ValueError(f"mqar power_a must be in (0, 1], got {o['power_a']}")
        return {"vocab_size": 1 + o["keys"] + o["values"] + o["fillers"], "max_len": max(256, o["length"])}

    def _slots(self, g: torch.Generator, n: int, free: Tensor) -> Tensor:
        """``(n, P)`` distinct (query, answer) slots per row, slot ``s < free[row]`` (counted from the block's end)."""
        o = self.options
        most = int(free.max())
        s = torch.arange(most)  # (S,)
        if o["placement"] == "power":
            a = o["power_a"]
            logw = math.log(a) + (a - 1) * torch.log1p(s.double())  # (S,) log of a (s+1)^(a-1)
            gumbel = -torch.log(-torch.log(torch.rand(n, most, generator=g, dtype=torch.float64).clamp_min(1e-300)))
            score = logw + gumbel  # Gumbel top-k: sampling without replacement by weight
        else:
            score = torch.rand(n, most, generator=g, dtype=torch.float64)
        score = score.masked_fill(s[None, :] >= free[:, None], float("-inf"))  # slots past the end
        return score.topk(o["pairs"], dim=1).indices  # (n, P)

    def _examples(self, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        o = self.options
        N, P, K, V, F = o["length"], o["pairs"], o["keys"], o["values"], o["fillers"]
        drawn = o["keys_used"] or K
        keys = torch.rand(n, drawn, generator=g).argsort(dim=1)[:, :P] + 1  # (n, P) distinct ids 1..keys_used
        values = torch.randint(1 + K, 1 + K + V, (n, P), generator=g)  # (n, P)
        tokens = torch.randint(1 + K + V, 1 + K + V + F, (n, N), generator=g)  # (n, N) filler everywhere
        if o["layout"] == "random":
            offset = torch.randint(0, N - 4 * P + 1, (n,), generator=g)  # (n,) where the block starts
        else:
            offset = torch.zeros(n, dtype=torch.long)
        rows = torch.arange(n)[:, None]
        block = offset[:, None] + torch.arange(2 * P)  # (n, 2P)
        tokens[rows, block] = torch.stack([keys, values], dim=2).reshape(n, 2 * P)
        # queries sit at even offsets after the block, so a query and its answer never overlap another pair
        free = (N - offset - 2 * P) // 2  # (n,) (q, a) slots after the block, each >= P
        q_pos = offset[:, None] + 2 * P + 2 * self._slots(g, n, free)  # (n, P) query positions
        order = torch.rand(n, P, generator=g).argsort(dim=1)  # (n, P) which pair each chosen slot asks
        tokens[rows, q_pos] = keys.gather(1, order)
        tokens[rows, q_pos + 1] = values.gather(1, order)
        mask = torch.zeros(n, N - 1, dtype=torch.bool)  # over tokens[:, 1:]: the answer at q_pos + 1
        mask[rows, q_pos] = True
        return tokens, mask
