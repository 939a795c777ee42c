"""The ``tasks`` suite, the arena: which attention keeps its accuracy at length, at what cost.

Speed and memory say what a mechanism costs; this suite says what it is worth. The same
model (:data:`~.plan.ARENA_MODEL`: 2 layers, width 64, 2 heads, the Long Range Arena reruns'
configuration) is trained on the same task with every registered mechanism, with the same
seed, data and length curriculum: short phases first, then the target length ``N``
(:mod:`.plan`). Exact attention also trains once per (task, N) and keeps its run: every
mechanism is then swapped into that trained model and scored with no training and after a
few fine-tuning steps at ``N`` ("can I put X in my trained model?"). Two exact baselines:
``exact`` (memory-lean: the op's ``auto`` choice) and ``exact-naive`` (the ``math`` backend,
the N x N formula, trained a few steps for its memory and speed only).

Tasks at length (:data:`~.plan.PROFILES`): ``mqar`` (Zoology's multi-query associative
recall, the pairs at a random offset), ``listops`` (Long Range Arena's, 500-1999 tokens at
N = 2000), ``passkey`` (a number hidden at a random depth of a Shakespeare passage, asked for
at the end) and ``chars`` (tinyshakespeare at context N, scored in bits per character against
a smoothed bigram model). Profiles: ``quick`` (the main job's short arena: MQAR at N = 512),
``standard`` (every task at 1K-2K: 1 h 39 min for the training rows and 35 min for the
swap-ins on two one-thread lanes of a 2-core CPU, ``--jobs 2``), ``full`` (the tasks and lengths the user names).

Videos (``--tasks moving-digits``, in any profile): the direction of a moving scene of digits,
the video model's attention variants (joint, divided space-time, space-only, axial) trained at
T = 8 frames and continued from each one's T = 8 checkpoint at T = 16, with the time and memory
of each variant's training step at the task's own patches (:data:`~.plan.VIDEO_RUNS`).

What is recorded and derived: :mod:`.child` and :mod:`.results`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ...format import is_ok
from ...measure import Unsupported
from ...suite import Job, RunOptions, Suite, register_suite, split_names
from . import results
from .child import check_mask_support, run_case
from .plan import (
    ARENA_MODEL,
    DATA,
    TASKS,
    VIDEO_MODEL,
    VIDEO_TASKS,
    ArenaCase,
    Contender,
    Recipe,
    _case,
    case_id,
    contenders,
    continue_step,
    runs_of,
    video_contenders,
)

#: scheduling only: rough training cost per token of each mechanism relative to exact's at the arena's lengths, so
#: the longest cases start first and no lane idles at the end (a wrong figure costs wall time, never a result)
COST = {"topk": 5.0, "performer": 3.0, "reformer": 3.0, "nystrom": 1.5, "linformer": 1.2, "bigbird": 1.5, "longformer": 1.3}

SUITE = "tasks"
#: a case's hard time limit in seconds (a training run takes far longer than one kernel call)
TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class TasksOptions:
    """The arena's own options.

    Attributes:
        tasks: the tasks to run (None: the profile's).
        swap_in: also swap every mechanism into exact's trained model.
        scale: shrink every run, for tests: ``{"steps": fraction of each phase's steps, "batch": batch of
            every phase, "swap_steps": ..., "eval_every": ..., "options": {task: options}}`` (None: the
            profile's runs as they are).
    """

    tasks: tuple[str, ...] | None = None
    swap_in: bool = True
    scale: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", split_names(self.tasks, "tasks"))
        keys = {"steps", "batch", "swap_steps", "eval_every", "options"}
        bad = sorted(set(self.scale or {}) - keys)
        if bad:
            raise ValueError(f"tasks scale keys must be among {sorted(keys)}, got {bad}")


def lane_threads(opts: RunOptions) -> int | None:
    """Torch threads of each training case: the user's, else the cores shared among the lanes (None: torch's)."""
    if opts.threads:
        return opts.threads
    return max(1, (os.cpu_count() or 1) // opts.jobs) if opts.jobs > 1 else None


def cases(opts: RunOptions, own: TasksOptions) -> list[Job]:
    """The jobs: per run of the profile, every contender trained, then every mechanism swapped in.

    A contender whose first phases are exact attention continues from exact's checkpoint at their
    end (it ``needs`` exact's case); one that cannot serve the task's mask is decided here,
    without a child process. The cases that train longest start first (their ``priority``).
    """
    names = list(opts.names) if opts.names is not None else None
    known = {c.label for c in (*contenders(), *video_contenders())}
    unknown = [x for x in names or [] if x not in known]
    if unknown:
        raise ValueError(f"arena contenders must be among {sorted(known)}, got {unknown}")
    folder = opts.find_data(DATA)
    files = {} if folder is None else {DATA: os.path.join(folder, "input.txt")}
    place = {"threads": lane_threads(opts), "out_dir": os.path.abspath(opts.out_dir), "data_files": files,
             "timeout_s": float(opts.timeout_s or TIMEOUT_S)}
    where = {"dtype": opts.dtype, "device": opts.device}
    jobs = []
    recipes = runs_of(opts.profile, list(own.tasks) if own.tasks else None, list(opts.lengths) if opts.lengths else None)
    for recipe in recipes:
        if own.scale:
            recipe = recipe.scaled(**own.scale)
        if recipe.task in VIDEO_TASKS:
            ran = {r.n for r in recipes if r.task == recipe.task}
            jobs += _video_jobs(recipe, [c for c in video_contenders() if names is None or c.label in names],
                                place, where, ran)
            continue
        skip = None
        if recipe.uses_data and not files:
            skip = {"status": "unsupported", "reason": f"{recipe.task} reads {DATA}: {opts.missing_data(DATA)}"}
        chosen = [c for c in contenders() if names is None or c.label in names]
        exact_id = case_id(recipe, "exact", "train")
        starts = {c.label: continue_step(recipe, c) for c in chosen}
        if not any(c.label == "exact" for c in chosen):
            starts = dict.fromkeys(starts, 0)  # no exact run to continue from: every contender from scratch
        saves = tuple(sorted({s for s in starts.values() if s}))
        for c in chosen:
            kind = "naive" if c.label == "exact-naive" else "train"
            case = _case(recipe, c, kind, save_steps=saves, start=starts[c.label], **where)
            jobs.append(_job(recipe, case, skip, place, priority=_priority(case),
                             artifacts=(case.run_dir,) if case.run_dir else (),  # exact's run: the others' start
                             needs=(exact_id,) if case.continue_step else ()))
        if own.swap_in:
            for c in chosen:
                if c.label not in ("exact", "exact-naive"):
                    jobs.append(_job(recipe, _case(recipe, c, "swap_in", **where), skip, place, needs=(exact_id,)))
    return jobs


def _video_jobs(recipe: Recipe, chosen: list[Contender], place: dict, where: dict, ran: set[int]) -> list[Job]:
    """A video run's jobs: each variant trained (continuing from its own shorter run when the recipe continues one
    that this run has, else from scratch through that run's phases) and its training step's cost."""
    jobs = []
    for c in chosen:
        case = _case(recipe, c, "train", **where)
        needs: tuple[str, ...] = ()
        if recipe.continues is not None and recipe.continues in ran:
            needs = (f"{recipe.task}@{recipe.continues}/{c.label}/train",)
        else:
            case = dataclasses.replace(case, continue_step=0, source_dir=None)
        jobs.append(_job(recipe, case, None, place, priority=_priority(case), artifacts=(case.run_dir,), needs=needs))
        if recipe.cost_options is not None:
            cost = _case(recipe, c, "cost", **where)
            jobs.append(_job(recipe, cost, None, place, priority=_priority(cost)))
    return jobs


def _job(recipe: Recipe, case: ArenaCase, skip: dict | None, place: dict, **more: Any) -> Job:
    """The job of ``case``: skipped as the run is (``skip``) or as its mechanism cannot serve the task's mask."""
    # one machine per (task, N) on a cluster: the ratios against exact compare cases of one group
    return Job(case, id=case_id(recipe, case.contender, case.kind), skip=skip or _unsupported(recipe, case),
               group=f"{recipe.task}@{recipe.n}", **place, **more)


def _priority(case: ArenaCase) -> float:
    """The runner's start order of a training case: exact first (the others need it), then the longest trainings."""
    tokens = sum(length * steps * batch for length, steps, batch in case.curriculum
                 ) - sum(length * steps * batch for length, steps, batch in _done(case))
    return 1e30 if case.contender == "exact" else tokens * COST.get(case.mechanism, 1.0)


def _done(case: ArenaCase) -> list:
    """The phases a continuing case does not train (they are exact's)."""
    out, step = [], 0
    for p in case.curriculum:
        if step + p[1] <= case.continue_step:
            out.append(p)
        step += p[1]
    return out


def _unsupported(recipe: Recipe, case: ArenaCase) -> dict | None:
    """The skip result of a case whose mechanism cannot apply the task's mask (decided here, in the parent)."""
    from ....tasks import tasks

    if case.attention is not None:  # a video variant: exact attention under the variant's own structure
        return None
    try:
        check_mask_support(case.mechanism, case.mechanism_settings, tasks()[recipe.task].attention_mask, recipe.n,
                           ARENA_MODEL["dim"] // ARENA_MODEL["heads"])
    except Unsupported as e:
        return {"status": "unsupported", "reason": str(e)}
    return None


_NUM_OR_NULL = {"type": ["number", "null"]}
_POS_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}


@register_suite
class TasksSuite(Suite):
    """The arena: every mechanism trained on the same tasks with a length curriculum, and swapped into exact's model."""

    name = SUITE
    summary = ("the arena: every mechanism trained on the same tasks at length (a length curriculum) and swapped "
               "into a trained exact model: accuracy kept, memory, speed")
    default = True  # the main job's short arena (quick profile: MQAR at N = 512)
    title = "The arena: accuracy at length"
    order = 40
    parallel = True
    cached = True
    headline = True
    Options = TasksOptions
    kinds = ("training", "swap_in")
    modes = ("train", "swap_in")
    result_keys = ("accuracy", "eval_loss", "steps", "score", "score_name", "score_split", "curve",
                   "activation_error", "tokens_per_s", "phases", "baseline_score", "score_0", "continued_from",
                   "accuracy_frames_shuffled")
    record_defaults = {"accuracy": None}
    case_properties = {
        "accuracy": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                     "description": "tasks: accuracy on the task's held-out split after training"},
        "eval_loss": {**_NUM_OR_NULL, "description": "tasks: loss on the held-out split"},
        "steps": {"type": "integer", "minimum": 0, "description": "tasks: optimizer steps taken"},
        "score": {**_NUM_OR_NULL, "description": "tasks: the task's score (accuracy, sequence accuracy, bits per char)"},
        "score_name": {"type": "string", "enum": ["accuracy", "sequence_accuracy", "bits_per_char"]},
        "score_split": {"type": "string", "description": "tasks: the split the score is measured on"},
        "score_0": {**_NUM_OR_NULL, "description": "tasks, swap-in: the score with no fine-tuning"},
        "baseline_score": {**_NUM_OR_NULL, "description": "tasks: the trivial predictor's score on that split"},
        "curve": {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                  "description": "tasks: [step, validation score] during training"},
        "phases": {"type": "array", "items": {"type": "object"},
                   "description": "tasks: per curriculum phase: length, batch size, steps, tokens, seconds"},
        "phase_exact": {"type": "array", "items": {"type": "boolean"},
                        "description": "tasks: per phase, whether the mechanism computes exact attention there"},
        "activation_error": {"type": ["number", "null"], "minimum": 0,
                             "description": "tasks: max|out-exact|/max|exact| on the trained model's own q, k, v "
                                            "(largest over layers)"},
        "score_ratio": {**_NUM_OR_NULL, "description": "tasks: score as a fraction of exact's (bits per char: "
                                                       "exact's / this)"},
        "score_0_ratio": {**_NUM_OR_NULL, "description": "tasks, swap-in: score_0 as a fraction of exact's"},
        "mem_vs_naive": {**_POS_OR_NULL, "description": "tasks: peak memory / exact-naive's"},
        "mem_vs_lean": {**_POS_OR_NULL, "description": "tasks: peak memory / exact's (memory-lean)"},
        "speed_vs_exact": {**_POS_OR_NULL, "description": "tasks: tokens/s at N / exact's"},
        "exact_learned": {"type": ["boolean", "null"],
                          "description": "tasks: exact attention beat the trivial predictor (else the ratios say "
                                         "nothing about accuracy; null: no trivial predictor)"},
        "run_void": {"type": ["boolean", "null"],
                     "description": "tasks: exact attention stayed below its task's gate, so the run says nothing "
                                    "about the approximations (null: exact did not finish)"},
        "continued_from": {"type": "object", "description": "tasks: the case continued from exact's checkpoint of "
                                                             "this step (its first phases are exact attention); "
                                                             "seconds: exact's time up to there, counted in time_s"},
        "exact_still_rising": {"type": ["boolean", "null"],
                               "description": "tasks: exact's validation score still rose over its last interval"},
        "time_to_reach_s": {**_POS_OR_NULL, "description": "tasks: training seconds until the validation score "
                                                           "reached 90 % of exact's final score"},
        "accuracy_frames_shuffled": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                                     "description": "tasks, videos: test accuracy with every video's frames shuffled"},
        "steps_to_target": {"type": ["integer", "null"], "minimum": 0,
                            "description": "tasks, videos: steps at the last phase's length until the validation "
                                           "score was first at least target_score (a continuing run: from its "
                                           "checkpoint)"},
        "target_score": {**_NUM_OR_NULL, "description": "tasks, videos: the score steps_to_target counts to"},
        "time_vs_joint": {**_POS_OR_NULL, "description": "tasks, videos, cost: training step time / joint "
                                                         "attention's at the same frames"},
    }
    settings_properties = {"tasks": {"type": "array", "items": {"type": "string"}, "description": "arena tasks asked for"}}
    verdict_properties = {"task": {"type": "string"},
                          "close_to_exact": {"type": "array", "items": {"type": "string"},
                                             "description": "tasks: mechanisms that kept 90 % of exact's score"},
                          "swapped_close": {"type": "array", "items": {"type": "string"},
                                            "description": "tasks: mechanisms that kept it when swapped in"}}

    def add_arguments(self, group) -> None:
        group.add_argument("--tasks", default=None,
                           help=f"tasks (the arena): tasks to run ({','.join(TASKS)}; default the profile's; "
                                f"{','.join(VIDEO_TASKS)} only when named)")
        group.add_argument("--no-swap-in", action="store_true",
                           help="tasks: do not swap each mechanism into exact's trained model")

    def options_from_args(self, args) -> dict:
        out: dict[str, Any] = {}
        if args.tasks:
            out["tasks"] = args.tasks
        if args.no_swap_in:
            out["swap_in"] = False
        return out

    def cases(self, opts: RunOptions) -> list[Job]:
        return cases(opts, opts.of(self))

    run_case = staticmethod(run_case)  # the child's: the suite adds nothing

    def known_names(self) -> set[str]:
        return {c.label for c in (*contenders(), *video_contenders())}

    def settings(self, opts: RunOptions) -> dict:
        own = opts.of(self)
        return {"tasks": list(own.tasks)} if own.tasks else {}

    def finish(self, records: list[dict]) -> None:
        results.derive(records)

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return results.verdicts(records)

    def decision_rows(self, records: list[dict]) -> list[list[str]]:
        return results.decision_rows(records)

    def headline_tables(self, results_: dict) -> list[tuple[str, list[str], list[list[str]]]]:
        mine = self.own(results_["cases"])
        out = []
        seq, video = [c for c in mine if not results.is_video(c)], [c for c in mine if results.is_video(c)]
        if seq:
            head, rows = results.accuracy_rows(seq)
            out.append(("Accuracy at length (the arena): each attention's score as a share of exact attention's, "
                        "trained from scratch and swapped into exact's trained model (no training → after "
                        "fine-tuning); its training memory against the naive N×N formula and against memory-lean "
                        "exact (below 1x: less); its tokens/s against exact's.", head, rows))
        if video:
            head, rows = results.video_rows(video)
            out.append(("Moving digits (the arena's videos): the video model with each attention, trained at T = 8 "
                        "and continued from its T = 8 checkpoint at T = 16; test accuracy (and with every video's "
                        f"frames shuffled), training steps until the validation accuracy first reached "
                        f"{100 * results.TARGETS['moving-digits']:.0f} % (checked "
                        "every 50 steps; at T = 16 from the checkpoint), and the median time and the peak memory "
                        "of one training step (forward, backward, AdamW; batch 32) at the cost patches.", head, rows))
        return out

    rows = staticmethod(results.rows)

    def about(self, records: list[dict]) -> str:
        return ("Each mechanism trains the same model (2 layers, width 64, 2 heads: the Long Range Arena reruns' "
                "configuration) on each task with the same seed, data and length curriculum (short phases, then "
                "the target length N); only the attention differs. Positions are rotary except for Reformer, "
                "which learns absolute positions (its buckets hash the queries), and on ListOps, where every "
                "mechanism has sinusoidal positions (a bidirectional classifier: rotary gives no absolute "
                "position). Swap-in: exact's trained model "
                "with the mechanism put in every layer, scored with no training ('untrained swap') and after the "
                "fine-tuning steps shown; parameters a mechanism adds keep the initialisation it gives them when "
                "created. Score: the task's held-out split (chars: validation bits per character). 'vs exact': "
                "the score as a fraction of exact's. Memory: peak of the whole training call beyond what the "
                "process held, as a ratio to exact through the naive N×N formula (exact-naive) and to "
                "memory-lean exact. Tokens/s: at the target length (the last phase). 'to 90 %': training seconds "
                "until the validation score first reached 90 % of exact's final score. 'act. error': "
                "max|out−exact| / max|exact| on the trained model's own q, k, v (largest over layers). Settings: "
                "each mechanism's LRA settings, capped at N/4. Videos (moving-digits): the video model "
                f"({VIDEO_MODEL['layers']} layers, width {VIDEO_MODEL['dim']}, {VIDEO_MODEL['heads']} heads) "
                "with each attention variant instead of each mechanism, trained at T = 8 and continued from "
                "its own T = 8 checkpoint at T = 16; its N is tokens (frames x patches per frame).")

    def plots(self, results_: dict, cases_: list[dict], out_dir: str, plt) -> list[str]:
        return results.overview_plot(cases_, out_dir, plt) + results.curve_plots(cases_, out_dir, plt)

    def key_plots(self, files: list[str]) -> list[str]:
        return [f for f in files if f == "arena_overview.png"]

    def tiny_options(self) -> dict | None:
        return {"lengths": (64,), "profile": "full", "names": ("exact", "local"),
                "suite_options": {SUITE: {"tasks": ("mqar",), "scale": {
                    "steps": 0.005, "batch": 2, "swap_steps": 1, "eval_every": 2,
                    "options": {"mqar": {"pairs": 4, "keys": 8, "val_size": 8}}}}}}


__all__ = ["SUITE", "TIMEOUT_S", "TasksOptions", "TasksSuite", "cases", "is_ok", "lane_threads"]
