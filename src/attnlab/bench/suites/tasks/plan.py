"""The arena's plan: which runs a profile has, and the typed case each contender of a run becomes.

A *run* (:class:`Recipe`) is one task at one length ``N`` with its training schedule: a
length curriculum (short phases, then ``N``), the batch size of each phase, the evaluation
interval and the swap-in's fine-tuning steps. Every contender of a run trains with the same
recipe, seed and data: only the attention differs. A *case* (:class:`ArenaCase`) is what the
parent hands the child process that measures it: one of

* ``train``: a contender trained from scratch with the curriculum (``exact`` keeps its run
  directory, whose checkpoints the swap-in cases and the contenders below start from). A
  contender whose first phases are exact attention (its window, blocks or ``k`` cover those
  lengths: :func:`exact_up_to`) continues from exact's checkpoint at the end of those phases,
  optimizer state and RNGs included: the same run as from scratch, without replaying them;
* ``naive``: ``exact-naive``, exact attention through the ``math`` backend (the N x N
  formula), trained a few steps at ``N`` only: its memory and speed are the baseline that
  memory-lean exact and the approximations are compared with (it computes exact's function);
* ``swap_in``: exact's trained model with the mechanism put in its place, scored with no
  training and after ``swap_steps`` fine-tuning steps at ``N``;
* ``cost``: a video variant's training step at the recipe's cost options (the task's own
  patches), timed and its memory measured, no accuracy (see below).

The video task (:data:`VIDEO_TASKS`: ``moving-digits``, asked for with ``--tasks``) has other
contenders: the :class:`~attnlab.models.VideoTransformer`'s attention variants (``joint``,
``divided``, ``space``, ``axial``: :func:`video_contenders`), each trained at T = 8 and at T = 16
frames, the T = 16 run continuing from the same variant's T = 8 checkpoint (:attr:`Recipe.continues`).
Its ``N`` is tokens, ``frames * (canvas / patch)^2``.

Mechanism settings are each one's Long Range Arena settings (:data:`LRA_SETTINGS`), every
budget of keys, buckets, projections or landmarks capped at ``N / 4`` so that none becomes
exact attention at the target length. Positions are rotary for every mechanism but Reformer
(:data:`LEARNED_POSITIONS`), which hashes the queries into buckets: rotary turns each
position's query by another angle before the hash, so equal content at different positions
falls into different buckets; it learns absolute positions instead. A recipe may give every
mechanism other positions: ListOps, a bidirectional classifier, has sinusoidal ones.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ....mechanisms import mechanisms
from ....models.config import VIDEO_ATTENTIONS
from ...suite import Case

#: the seed of every run
SEED = 0

#: the arena model: the LRA configuration of the PyTorch reruns (Nystromformer, xFormers)
ARENA_MODEL: dict[str, Any] = {"dim": 64, "heads": 2, "layers": 2, "ff_dim": 128}

#: each mechanism's settings in the LRA reruns (budgets are capped at N / 4, see :func:`mechanism_settings`)
LRA_SETTINGS: dict[str, dict[str, Any]] = {
    "nystrom": {"num_landmarks": 128},
    "performer": {"features": 256, "seed": SEED},
    "linformer": {"k": 256},
    "local": {"block_size": 256},
    "longformer": {"window": 256},
    "bigbird": {"block_size": 64, "seed": SEED},
    "reformer": {"bucket_size": 64, "n_hashes": 2, "seed": SEED},
    "topk": {"k": 32},
    # not an LRA contender: the paper's largest span (enwik8, 8192), capped at N / 4 like the budgets above so
    # that its spans cannot grow to exact causal attention at the target length (it serves causal tasks only)
    "adaptive-span": {"max_span": 8192},
}

#: the budget of each mechanism that the N / 4 cap applies to
BUDGET_KEYS = {"nystrom": "num_landmarks", "linformer": "k", "local": "block_size", "longformer": "window",
               "bigbird": "block_size", "reformer": "bucket_size", "topk": "k", "performer": "features",
               "adaptive-span": "max_span"}

#: the data set of the recipes that read one (``uses_data``)
DATA = "tinyshakespeare"

#: sequences of each evaluation during training (the final test evaluates the whole split)
EVAL_SEQUENCES = 128

#: mechanisms that learn absolute positions instead of rotary ones, and why
LEARNED_POSITIONS = {"reformer": "it hashes the queries into buckets, and rotary turns each position's query by "
                                 "another angle before the hash (equal content at different positions would fall "
                                 "into different buckets), so it learns absolute positions"}

#: steps ``exact-naive`` trains (it computes exact's function: only its memory and speed are new)
NAIVE_STEPS = 10

#: the case kinds, and the ``mode`` their records carry
KINDS = {"train": "train", "naive": "train", "swap_in": "swap_in", "cost": "train"}

#: tasks whose contenders are the video model's attention variants (:func:`video_contenders`), not mechanisms
VIDEO_TASKS = ("moving-digits",)


@dataclass(frozen=True)
class Contender:
    """One row of the arena: a label, the registered mechanism and its fixed settings."""

    label: str
    mechanism: str
    settings: dict[str, Any] = field(default_factory=dict)
    attention: str | None = None  # a VideoTransformer's attention variant (None: a sequence model's mechanism)


def contenders() -> list[Contender]:
    """``exact``, ``exact-naive``, then every other registered mechanism (sorted)."""
    out = [Contender("exact", "exact"), Contender("exact-naive", "exact", {"backend": "math"})]
    out += [Contender(name, name) for name in sorted(mechanisms()) if name != "exact"]
    return out


def video_contenders() -> list[Contender]:
    """The video model's attention variants (exact attention under each one's structure)."""
    return [Contender(a, "exact", attention=a) for a in VIDEO_ATTENTIONS]


def contenders_of(task: str) -> list[Contender]:
    """The contenders of a run of ``task``: the video variants for :data:`VIDEO_TASKS`, else :func:`contenders`."""
    return video_contenders() if task in VIDEO_TASKS else contenders()


def mechanism_settings(name: str, n: int, max_len: int) -> dict[str, Any]:
    """Settings of mechanism ``name`` for sequences of ``n`` tokens (model ``max_len``): LRA's, capped at ``n / 4``."""
    st = dict(LRA_SETTINGS.get(name, {}))
    key = BUDGET_KEYS.get(name)
    if key is not None:
        st[key] = max(2, min(st[key], n // 4))
    if name == "linformer":
        st["max_len"] = max_len
    return st


def exact_up_to(name: str, settings: dict[str, Any], lengths: list[int]) -> list[bool]:
    """For each length: whether mechanism ``name`` with ``settings`` computes exact attention there.

    From the mechanism's own :meth:`~attnlab.mechanisms.Mechanism.exact_settings`: a length is
    covered when every numeric setting that would make it exact is reached (a window or a
    block holding every position, a landmark per position).
    """
    cls = mechanisms()[name]
    out = []
    for n in lengths:
        need = cls.exact_settings(n)
        if need is None:
            out.append(False)
            continue
        numeric = {k: v for k, v in need.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out.append(all(settings.get(k, 0) >= v for k, v in numeric.items()) and bool(numeric or not need))
    return out


class _Phases:
    """The two figures of a curriculum a recipe and a case both read."""

    curriculum: tuple[tuple[int, int, int], ...]

    @property
    def steps(self) -> int:
        """Optimizer steps over every phase."""
        return sum(p[1] for p in self.curriculum)

    @property
    def batch_size(self) -> int:
        """The batch of the last phase (the one at the target length)."""
        return self.curriculum[-1][2]


@dataclass(frozen=True)
class Recipe(_Phases):
    """One arena run: a task at length ``n`` and its training schedule.

    Attributes:
        task: the task's registry name.
        n: the target length (the last phase's).
        options: the task's options besides its length (pairs, vocabulary sizes, ...).
        curriculum: the phases ``(length, steps, batch)``; the last is at ``n``.
        eval_every: validation every so many steps of the last phase (at ``n``); the earlier
            phases are evaluated once each, at their end and at their own length.
        train: other trainer settings of the run (lr, warm-up).
        swap_steps: fine-tuning steps of the swap-in at ``n``.
        uses_data: the task reads Tiny Shakespeare (the :data:`DATA` data set).
        positional: the positions of every mechanism but those of :data:`LEARNED_POSITIONS`.
        model: the model's fields (None: :data:`ARENA_MODEL`).
        continues: ``N`` of the profile's run of the same task whose curriculum is this one's first
            phases: each contender continues from its own checkpoint at the end of that run (None: none).
        cost_options: task options of the ``cost`` cases (None: no cost cases), e.g. other patches.
    """

    task: str
    n: int
    options: dict[str, Any]
    curriculum: tuple[tuple[int, int, int], ...]
    eval_every: int = 50
    train: dict[str, Any] = field(default_factory=dict)
    swap_steps: int = 50
    uses_data: bool = False
    positional: str = "rotary"
    model: dict[str, Any] | None = None
    continues: int | None = None
    cost_options: dict[str, Any] | None = None

    def scaled(self, steps: float = 1.0, batch: int | None = None, swap_steps: int | None = None,
               eval_every: int | None = None, options: dict[str, dict] | None = None) -> Recipe:
        """A smaller copy for tests: every phase's steps times ``steps``, every batch ``batch``, and
        ``options[task]`` merged into the task's options (smaller splits); a ``wsd`` decay is scaled like the
        steps, within the last phase."""
        phases = tuple((n, max(1, round(s * steps)), batch or b) for n, s, b in self.curriculum)
        train = dict(self.train)
        if train.get("decay_steps"):
            train["decay_steps"] = min(max(1, round(train["decay_steps"] * steps)), phases[-1][1])
        return dataclasses.replace(self, curriculum=phases, train=train, swap_steps=swap_steps or self.swap_steps,
                                   eval_every=eval_every or self.eval_every,
                                   options={**self.options, **(options or {}).get(self.task, {})})


#: a constant learning rate after the warm-up: a cosine over every phase leaves the last, long phase
#: too little (MQAR, 16 pairs, 32:600,64:400,1024:100:16: 12.2 % with a cosine from 3e-3, 99.9 % at 1e-3
#: constant; passkey at 2048: 87 % constant)
CONSTANT = {"schedule": "constant", "lr": 1e-3, "warmup": 50}


#: passkey's: the constant rate, then down to 1e-4 over the last 100 steps. Exact attention's test score (each run
#: on one thread, two runs side by side): 128:600,512:200,2048:150 constant 85.5 % (2048:300: 92.5 %); 1,000 steps
#: at 128 (100 % there), 512:200, 1024:100, 2048:100: 95.5 % constant, 98.5 % with the decay (the same curriculum
#: with 150 steps at 1024 and at 2048: 96.5 % and 99.5 %; with 200 at 1024 and 100 at 2048, constant: 79.5 %: a
#: constant rate leaves the score jumping between evaluations, the decay settles it)
PASSKEY_TRAIN = {**CONSTANT, "schedule": "wsd", "decay_steps": 100, "min_lr": 1e-4}


def _mqar(n: int, pairs: int, curriculum, **kw) -> Recipe:
    return Recipe("mqar", n, {"pairs": pairs, "keys": 2 * pairs, "values": 16, "fillers": 1, "val_size": 256},
                  curriculum, train=dict(CONSTANT), **kw)


def _listops(curriculum, n: int = 2000, **kw) -> Recipe:
    # a bidirectional classifier with mean pooling: rotary gives it no absolute position, and exact attention
    # reached 23.4 % on ListOps 2K with rotary against 36.2 % with sinusoidal positions (this curriculum)
    return Recipe("listops", n, {"train_size": 6000, "val_size": 500, "test_size": 500}, curriculum,
                  train={"lr": 1e-3, "warmup": 50}, positional="sinusoidal", **kw)


#: the main job's short arena: recall at N = 512 (a few minutes on two one-thread lanes), also the standard
#: profile's MQAR-512 run. MQAR's first phases are as long as their pairs need (4 per pair): the block of pairs,
#: then every query, with no room to move; with the block at a random offset from the start, exact attention
#: stayed at 20-25 % for 1,500 steps at N = 64 (8 pairs), while after 300 steps at N = 32 it reached 100 % at
#: N = 512 (attnlab train mqar --curriculum 32:300,512:100 --schedule constant --lr 1e-3, arena model, rotary)
QUICK_MQAR = _mqar(512, 8, ((32, 300, 32), (512, 100, 16)))

#: the runs of each profile; ``full`` takes the user's tasks and lengths (:func:`full_runs`)
PROFILES: dict[str, list[Recipe]] = {
    "quick": [QUICK_MQAR],
    # MQAR at 512 is the quick run itself: its cases have the same keys, so a standard run after the main job
    # reuses those rows from the result cache (and a --fresh one trains them again)
    "standard": [
        QUICK_MQAR,
        _mqar(1024, 16, ((32, 600, 32), (64, 400, 32), (1024, 100, 16))),
        _mqar(2048, 16, ((32, 600, 32), (64, 400, 32), (2048, 100, 16))),
        _listops(((256, 500, 32), (2000, 100, 16))),
        Recipe("passkey", 2048, {"digits": 5, "val_size": 200},
               ((128, 1000, 32), (512, 200, 32), (1024, 100, 16), (2048, 100, 16)), uses_data=True, train=dict(PASSKEY_TRAIN)),
        Recipe("chars", 1024, {}, ((128, 600, 32), (1024, 200, 8)), uses_data=True,
               train={"lr": 3e-3, "warmup": 50, "min_lr": 1e-4, "eval_batches": 8}),
    ],
}


#: the video model of the moving-digits runs: the task's own (width 48, 4 heads, 2 layers)
VIDEO_MODEL: dict[str, Any] = {"dim": 48, "heads": 4, "layers": 2, "ff_dim": 96}


def _moving_digits(frames: int, curriculum, continues: int | None = None) -> Recipe:
    # patches of 4 (16 tokens a frame) for the accuracy runs: at the task's patches of 2 a training step of joint
    # attention at T = 16 is 1,024 tokens, too slow for the table's budget; the costs are measured at patches of 2
    # (cost_options). With a constant 2e-3 after 50 warm-up steps, divided attention at T = 8 reached 98 % validation
    # accuracy after 250 steps and joint 96 % after 1,000 (attnlab train moving-digits --task-opt patch_size=4
    # --schedule constant --lr 2e-3 --warmup 50 --eval-every 50); a constant rate also makes the T = 8 run the first
    # phase of the T = 16 one, whatever the total
    return Recipe("moving-digits", frames * 16, {"patch_size": 4, "val_size": 256, "test_size": 512}, curriculum,
                  train={"schedule": "constant", "lr": 2e-3, "warmup": 50, "weight_decay": 0.05}, eval_every=50,
                  positional="sinusoidal", model=dict(VIDEO_MODEL), continues=continues,
                  cost_options={"patch_size": 2})


#: the video runs (``--tasks moving-digits`` in any profile): T = 8, then T = 16 from each variant's T = 8 checkpoint
VIDEO_RUNS: list[Recipe] = [_moving_digits(8, ((128, 1200, 32),)),
                            _moving_digits(16, ((128, 1200, 32), (256, 400, 32)), continues=128)]


def full_runs(task_names: list[str] | None, lengths: list[int] | None) -> list[Recipe]:
    """The ``full`` profile: every named task (default all) at every length (default 1024, 2048).

    Each keeps the short phases of its ``standard`` recipe that are shorter than ``N`` (none left:
    400 steps at ``N / 4``), then trains 300 steps at ``N`` in batches that keep about 16K tokens
    per step.
    """
    from ....tasks import tasks

    out = []
    for name in task_names or list(TASKS):
        if name in VIDEO_TASKS:
            continue
        if name not in TASKS:
            raise ValueError(f"arena task must be one of {sorted(TASKS)}, got {name!r}")
        base = {r.task: r for r in PROFILES["standard"]}[name]
        for n in lengths or [1024, 2048]:
            tasks()[name](data=None).check_length(n)
            batch = max(4, min(32, 16384 // n))
            short = tuple(p for p in base.curriculum[:-1] if p[0] < n) or ((max(16, n // 4), 400, 32),)
            out.append(dataclasses.replace(base, n=n, curriculum=(*short, (n, 300, batch))))
    return out


#: the arena's tasks: name -> whether the task reads Tiny Shakespeare (the video task runs only when named)
TASKS: dict[str, bool] = {"mqar": False, "listops": False, "passkey": True, "chars": True, "moving-digits": False}


def runs_of(profile: str, task_names: list[str] | None = None, lengths: list[int] | None = None) -> list[Recipe]:
    """The runs of ``profile`` (``quick``, ``standard`` or ``full``), filtered to ``task_names``.

    For ``full``, ``lengths`` are the lengths to run; for the other profiles they keep only
    the profile's runs at those lengths. The video task (:data:`VIDEO_RUNS`) runs when named,
    in any profile, at its own lengths (``lengths`` keep some of them).
    """
    for name in task_names or []:
        if name not in TASKS:
            raise ValueError(f"arena task must be one of {sorted(TASKS)}, got {name!r}")
    video = [r for r in VIDEO_RUNS if r.task in (task_names or ()) and (not lengths or r.n in lengths)]
    rest = [t for t in task_names or () if t not in VIDEO_TASKS]
    if task_names and not rest:
        if not video:
            raise ValueError(f"the video runs are at lengths {[r.n for r in VIDEO_RUNS]}, got lengths {lengths}")
        return video
    if profile == "full":
        return full_runs(rest or None, lengths) + video
    runs = [r for r in PROFILES[profile] if (not rest or r.task in rest) and (not lengths or r.n in lengths)]
    if not runs:
        have = sorted({(r.task, r.n) for r in PROFILES[profile]})
        raise ValueError(f"profile {profile!r} has no run of tasks {task_names} at lengths {lengths}; it has {have}")
    return runs + video


@dataclass(frozen=True)
class ArenaCase(Case, _Phases):
    """What the child process of one arena case needs, handed over from the parent.

    Nothing in it depends on where the run is kept or how many threads it has: the journal
    and the result cache key on it. Paths are relative to the run's folder (the child gets that
    folder as its job's ``out_dir``, :attr:`~attnlab.bench.suite.Context.out_dir`). Its record's
    ``settings`` are its fields but ``dtype`` and ``device`` (:meth:`settings`).

    Attributes:
        kind: ``train``, ``naive``, ``swap_in`` or ``cost`` (see the module docstring).
        contender: the row's label (``exact``, ``exact-naive`` or a mechanism's name).
        mechanism, mechanism_settings: the attention of every layer.
        positional: ``rotary``, or ``learned`` for the mechanisms of :data:`LEARNED_POSITIONS`.
        task, n, task_options: the task at the target length (its options include the length).
        data: the data set the task reads (``tinyshakespeare``; None: it makes its own); the child
            finds its file in its job's ``data_files``.
        curriculum: the phases ``[length, steps, batch]`` (``naive``: one short phase at ``n``).
        eval_every: validation interval (steps) in the last phase; each earlier phase is evaluated
            at its end, at its own length (:attr:`eval_steps`).
        train: other trainer settings (lr, warm-up).
        run_dir: ``train`` of exact: where its run (and the checkpoints others start from) is kept.
        source_dir: ``swap_in``, and a ``train`` with ``continue_step``: exact's run to start from.
        continue_step: ``train``: continue from exact's checkpoint of this step (its first phases
            are exact attention for this contender); 0: from scratch.
        save_steps: ``train`` of exact: the steps whose checkpoints other contenders continue from.
        swap_steps: ``swap_in``: fine-tuning steps at ``n``.
        attention: the video model's attention variant (None: a sequence model with ``mechanism``).
        model: the model's fields (empty: :data:`ARENA_MODEL`).
    """

    suite: ClassVar[str] = "tasks"

    kind: str
    contender: str
    mechanism: str
    mechanism_settings: dict[str, Any]
    positional: str
    task: str
    n: int
    task_options: dict[str, Any]
    data: str | None
    curriculum: tuple[tuple[int, int, int], ...]
    eval_every: int
    train: dict[str, Any] = field(default_factory=dict)
    run_dir: str | None = None
    source_dir: str | None = None
    continue_step: int = 0
    save_steps: tuple[int, ...] = ()
    swap_steps: int = 0
    seed: int = SEED
    attention: str | None = None
    model: dict[str, Any] = field(default_factory=dict)

    @property
    def model_fields(self) -> dict[str, Any]:
        """The model's fields: :attr:`model`, else :data:`ARENA_MODEL`."""
        return dict(self.model or ARENA_MODEL)

    @property
    def eval_steps(self) -> list[int]:
        """Steps evaluated during training: each earlier phase's end, then every ``eval_every`` of the last phase."""
        ends, total = [], 0
        for p in self.curriculum[:-1]:
            total += p[1]
            ends.append(total)
        last = range(total + self.eval_every, self.steps, self.eval_every) if self.eval_every else ()
        return [s for s in [*ends, *last] if self.continue_step < s < self.steps]

    @property
    def eval_batches(self) -> tuple[int, int]:
        """``(batch size, batches)`` of an evaluation during training: :data:`EVAL_SEQUENCES` sequences."""
        size = min(self.batch_size, EVAL_SEQUENCES)
        return size, -(-EVAL_SEQUENCES // size)

    def header(self) -> dict[str, Any]:
        from ....tasks import tasks

        heads = self.model_fields["heads"]
        return {"kind": "swap_in" if self.kind == "swap_in" else "training", "name": self.contender,
                "mask": tasks()[self.task].attention_mask, "N": self.n, "B": self.batch_size, "H": heads,
                "D": self.model_fields["dim"] // heads, "mode": KINDS[self.kind]}

    def settings(self) -> dict[str, Any]:
        # the video fields only where set: a sequence case keeps the journal and cache key it had before them
        return {k: v for k, v in self.to_dict().items()
                if k not in ("dtype", "device") and not (k in ("attention", "model") and not v)}

    def label(self) -> str:
        how = {"train": "trains", "naive": "costs", "swap_in": "swapped in", "cost": "costs a step"}[self.kind]
        return f"tasks {self.contender} {how} on {self.task} at N={self.n}"


def case_id(recipe: Recipe, contender: str, kind: str) -> str:
    """The id a case carries in the run (swap-ins name exact's ``train`` case in their ``needs``)."""
    return f"{recipe.task}@{recipe.n}/{contender}/{kind}"


def exact_dir(recipe: Recipe) -> str:
    """Exact's run of ``recipe``, relative to the run's folder (swap-ins and continuing contenders start there)."""
    return run_dir_of(recipe.task, recipe.n, "exact")


def run_dir_of(task: str, n: int, contender: str) -> str:
    """The kept run of ``contender`` on ``task`` at ``n``, relative to the run's folder."""
    return os.path.join("arena-runs", f"{task}-{n}-{contender}")


#: timed training steps of a ``cost`` case (after one that builds the optimizer's state)
COST_STEPS = 5


def continue_step(recipe: Recipe, c: Contender) -> int:
    """The step up to which contender ``c`` trains as exact attention (its leading exact phases; 0: none).

    ``exact`` and ``exact-naive`` themselves never continue: exact's run is the source.
    """
    if c.label in ("exact", "exact-naive"):
        return 0
    settings = {**mechanism_settings(c.mechanism, recipe.n, recipe.n), **c.settings}
    step = 0
    for (_, steps, _), exact in zip(recipe.curriculum[:-1], exact_up_to(c.mechanism, settings,
                                                                        [p[0] for p in recipe.curriculum[:-1]])):
        if not exact:
            break
        step += steps
    return step


def _case(recipe: Recipe, c: Contender, kind: str, save_steps: tuple[int, ...] = (), start: int = 0, *,
          dtype: str = "float32", device: str = "cpu") -> ArenaCase:
    """Contender ``c``'s case of ``kind`` in ``dtype`` on ``device``; a ``train`` case with ``start`` continues from
    exact's checkpoint of that step (:func:`continue_step`), exact's own ``train`` case keeps the checkpoints of
    ``save_steps``. A video contender's case: :func:`_video_case`."""
    if c.attention is not None:
        return _video_case(recipe, c, kind, dtype=dtype, device=device)
    options = {**recipe.options, **_options_at_length(recipe.task, recipe.n, recipe.options)}
    curriculum = recipe.curriculum if kind != "naive" else ((recipe.n, NAIVE_STEPS, recipe.batch_size),)
    start = start if kind == "train" else 0
    is_exact = c.label == "exact" and kind == "train"
    train = dict(recipe.train)
    if train.get("decay_steps"):  # a wsd decay within the case's steps (``naive`` trains a few)
        train["decay_steps"] = min(train["decay_steps"], sum(p[1] for p in curriculum))
    return ArenaCase(
        kind=kind, contender=c.label, mechanism=c.mechanism,
        mechanism_settings={**mechanism_settings(c.mechanism, recipe.n, recipe.n), **c.settings},
        positional="learned" if c.mechanism in LEARNED_POSITIONS and recipe.positional == "rotary"
        else recipe.positional, task=recipe.task, n=recipe.n,
        task_options=options, data=DATA if recipe.uses_data else None, curriculum=curriculum,
        eval_every=min(recipe.eval_every, sum(p[1] for p in curriculum)), train=train,
        run_dir=exact_dir(recipe) if is_exact else None,
        source_dir=exact_dir(recipe) if kind == "swap_in" or start else None, continue_step=start,
        save_steps=save_steps if is_exact else (),
        swap_steps=recipe.swap_steps if kind == "swap_in" else 0, dtype=dtype, device=device)


def _video_case(recipe: Recipe, c: Contender, kind: str, *, dtype: str, device: str) -> ArenaCase:
    """A video variant's ``train`` case (its run kept: a longer run continues from it, or from its own shorter run
    when the recipe :attr:`~Recipe.continues` one) or ``cost`` case (:data:`COST_STEPS` steps at the cost options)."""
    options = {**recipe.options, **_options_at_length(recipe.task, recipe.n, recipe.options)}
    n, curriculum, start, source = recipe.n, recipe.curriculum, 0, None
    if kind == "cost":
        options = {**options, **(recipe.cost_options or {})}
        from ....tasks import tasks

        side = options.get("canvas", tasks()[recipe.task].option_defaults["canvas"]) // options["patch_size"]
        n = options["frames"] * side**2  # (T, H, W) tokens at the cost patches
        curriculum = ((n, COST_STEPS, recipe.batch_size),)
    elif recipe.continues is not None:
        start = sum(p[1] for p in recipe.curriculum if p[0] <= recipe.continues)
        source = run_dir_of(recipe.task, recipe.continues, c.label)
    return ArenaCase(
        kind=kind, contender=c.label, mechanism=c.mechanism, mechanism_settings=dict(c.settings),
        positional=recipe.positional, task=recipe.task, n=n, task_options=options, data=None, curriculum=curriculum,
        eval_every=min(recipe.eval_every, sum(p[1] for p in curriculum)), train=dict(recipe.train),
        run_dir=run_dir_of(recipe.task, recipe.n, c.label) if kind == "train" else None, source_dir=source,
        continue_step=start, attention=c.attention, model=dict(recipe.model or ARENA_MODEL), dtype=dtype,
        device=device)


def _options_at_length(task: str, n: int, options: dict[str, Any]) -> dict[str, Any]:
    """A task's length options at ``n`` given its other ``options``, asked of a throwaway instance (no data read)."""
    from ....tasks import tasks

    return tasks()[task](data=None, **options).options_at_length(n)
