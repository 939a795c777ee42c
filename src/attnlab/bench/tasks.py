"""The ``tasks`` suite: every mechanism trained on the same task, accuracy against time.

Speed and memory say what a mechanism costs; this suite says what it is worth. Each case
trains one small model from scratch with :func:`attnlab.train.train` (fixed seed, fixed
number of steps, the task's own defaults otherwise), with the case's mechanism in every
attention layer, then records the test accuracy, the training wall time, steps per
second and the peak memory of the whole run. Same seed, data and steps for every
mechanism: only the attention differs.

Runs per profile (:data:`RUNS`):

* ``associative-recall`` (both profiles): 8 key-value pairs, then 4 of the keys asked
  again; N = 24 tokens, causal. Content-based lookup at any distance: exact attention
  reaches 100 %, mechanisms that see only nearby keys cannot.
* ``listops`` (``full``): nested MIN/MAX/MED/SM expressions of 16-128 tokens, padded
  and bidirectional (Long Range Arena's task, CPU-sized).

Each approximation gets settings sized to the task's length ``N``
(:func:`mechanism_settings`): a window, block, bucket, projection or landmark count of
about ``N / 4``, so that none degenerates into exact attention. A mechanism that cannot
apply the task's mask (Linformer and Nystrom on a causal task) is recorded as
``unsupported`` with the reason, found by calling it once on that mask before training.

Cost of one case: the training run itself (``steps`` optimizer steps of the task's
model) plus one evaluation of the test split.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from .. import masks
from ..mechanisms import create, mechanisms
from .measure import Unsupported, peak_memory

SUITE = "tasks"

#: the training runs of each profile: task, task options, model overrides, steps
RUNS: dict[str, list[dict[str, Any]]] = {
    "quick": [
        {"task": "associative-recall", "options": {}, "model": {}, "steps": 1000},
    ],
    "full": [
        {"task": "associative-recall", "options": {}, "model": {}, "steps": 1000},
        {"task": "listops", "options": {"min_length": 16, "max_length": 128},
         "model": {"dim": 64, "ff_dim": 128}, "steps": 1500},
    ],
}

#: a case's hard time limit in seconds (a training run takes far longer than one kernel call)
TIMEOUT_S = 1800.0

#: the seed of every run
SEED = 0

#: trainer precision for each bench dtype
PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def mechanism_settings(name: str, n: int, max_len: int) -> dict[str, Any]:
    """Settings of mechanism ``name`` for sequences of ``n`` tokens (model ``max_len``).

    Every approximation gets a budget of about ``n / 4`` keys, buckets, projections or
    landmarks per query, so none degenerates into exact attention at this length.
    """
    quarter = max(2, n // 4)
    table: dict[str, dict[str, Any]] = {
        "performer": {"features": 64, "seed": SEED},
        "linformer": {"max_len": max_len, "k": quarter},
        "nystrom": {"num_landmarks": quarter},
        "local": {"block_size": quarter},
        "longformer": {"window": quarter},
        "bigbird": {"block_size": max(2, n // 12), "seed": SEED},  # window of 3 blocks = n / 4
        "reformer": {"bucket_size": quarter, "seed": SEED},
    }
    return dict(table.get(name, {}))


def _task_shape(run: dict[str, Any]) -> tuple[int, str, dict[str, Any], int]:
    """``(N, mask kind, model config, batch size)`` of a run, from the task itself."""
    from ..tasks import create_task

    task = create_task(run["task"], seed=SEED, **run["options"])
    model = {**task.model_defaults, **task.model_config(), **run["model"]}
    n = _sequence_length(task)
    mask = "causal" if task.model_type == "CausalLM" else "padding"
    return n, mask, model, int(task.train_defaults.get("batch_size", 32))


def _sequence_length(task) -> int:
    """The longest input the task feeds its model."""
    if "max_length" in task.options:  # batches are padded to their longest item: the option bounds it
        return int(task.options["max_length"]) + 1  # + the CLS token
    n = int(task.train_batch(0, 2)["tokens"].shape[-1])
    return n - 1 if task.model_type == "CausalLM" else n  # a language model reads all tokens but the last


def cases(profile: str, device: str, dtype: str, names=None) -> list[dict]:
    """The case specs of this suite: every registered mechanism (or ``names``) x run of ``profile``."""
    if profile not in RUNS:
        raise ValueError(f"profile must be one of {sorted(RUNS)}, got {profile!r}")
    specs = []
    for run in RUNS[profile]:
        n, mask, model, batch = _task_shape(run)
        heads = int(model.get("heads", 4))
        max_len = int(model.get("max_len", 256))
        for name in mechanisms():
            if names is not None and name not in names:
                continue
            specs.append({"suite": SUITE, "kind": "training", "name": name, "mask": mask, "N": n, "B": batch,
                          "H": heads, "D": int(model.get("dim", 64)) // heads, "dtype": dtype, "device": device,
                          "mode": "train",
                          "settings": {"task": run["task"], "task_options": dict(run["options"]),
                                       "model": dict(run["model"]), "steps": run["steps"], "seed": SEED,
                                       "mechanism_settings": mechanism_settings(name, n, max_len)},
                          "skip": None})
    return specs


def check_mask_support(name: str, settings: dict[str, Any], mask_kind: str, n: int, head_dim: int) -> None:
    """Raise :class:`Unsupported` when mechanism ``name`` cannot apply the task's mask.

    Calls the mechanism once on random ``(1, 2, n, head_dim)`` inputs with ``causal()``
    (causal tasks) or a key-padding mask (padded tasks).
    """
    torch.manual_seed(SEED)
    mech = create(name, **settings)
    q, k, v = (torch.randn(1, 2, n, head_dim) for _ in range(3))
    if mask_kind == "causal":
        mask = masks.causal()
    else:
        mask = masks.padding([n - n // 4])  # the last quarter is padding
    try:
        with torch.no_grad():
            mech(q, k, v, mask)
    except ValueError as e:
        raise Unsupported(f"{name} cannot serve this task's {mask_kind} mask: {e}") from e


def run_case(spec: dict) -> dict:
    """Train the case's model and measure it (see the module docstring)."""
    from ..train import RunSpec, train

    st = spec["settings"]
    check_mask_support(spec["name"], st["mechanism_settings"], spec["mask"], spec["N"], spec["D"])
    if spec["dtype"] not in PRECISION:
        raise ValueError(f"dtype must be one of {sorted(PRECISION)}, got {spec['dtype']!r}")
    run = RunSpec(task=st["task"], task_options=st["task_options"],
                  model={**st["model"], "mechanism": spec["name"], "mechanism_settings": st["mechanism_settings"]},
                  train={"steps": st["steps"], "seed": st["seed"], "device": spec["device"],
                         "precision": PRECISION[spec["dtype"]], "progress": False, "eval_every": 0,
                         "save_every": 0, "keep_checkpoints": 1})
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-task-") as out:
        res, peak, method = peak_memory(lambda: train(run, out, quiet=True), spec["device"])
    test = res.metrics.get("test", {})
    if "accuracy" not in test:
        raise ValueError(f"task {st['task']!r} reported no test accuracy (got {sorted(test)})")
    seconds = float(res.seconds)
    return {"time_s": seconds, "times_s": [seconds], "peak_bytes": peak, "peak_method": method + " (whole training run)",
            "accuracy": float(test["accuracy"]), "eval_loss": float(test["loss"]) if "loss" in test else None,
            "steps": int(res.step), "steps_per_s": res.step / seconds if seconds > 0 else None}


__all__ = ["RUNS", "SUITE", "TIMEOUT_S", "cases", "check_mask_support", "mechanism_settings", "run_case"]
