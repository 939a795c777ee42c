"""The schema of ``results.json`` (JSON Schema, draft 2020-12) and its validator.

One file per run. ``cases`` holds one record per (suite, name, mask, N, mode): the raw
figures when ``status`` is ``ok``, else the reason. Units: seconds, bytes, FLOPs.
Derived figures (``gflops``, ``frac_of_ceiling``) are stored beside the raw ones so
that a reader needs nothing else; ``verdicts`` are computed from ``cases``.

:func:`validate` checks an instance against :data:`SCHEMA` with ``jsonschema`` and,
beyond what JSON Schema can say, that every number is finite: ``json.dump`` writes NaN
and Infinity, which are not JSON, and a NaN passes every ``minimum``.

A ``generate`` case (``kind`` ``generation``, ``mode`` ``generate``) is one whole greedy
generation: ``N`` is the prompt length, ``H``/``D`` the model's heads and head dim,
``settings`` the model and run sizes; it adds ``tokens_per_s``, ``tokens_digest``, and
``speedup``/``tokens_match`` shared by the pair with and without the KV cache.

A ``tasks`` case (``kind`` ``training``, ``mode`` ``train``) is one whole training run of
a mechanism on a task: ``N`` is the longest input, ``B`` the batch, ``settings`` the task,
its options, the steps and the mechanism's settings; ``time_s`` is the training wall
time, and it adds ``accuracy`` (test split), ``eval_loss``, ``steps``, ``steps_per_s``,
``tokens_per_s``, ``score`` (accuracy or bits per char), the validation ``curve``, the
``activation_error`` on the trained model's own q, k, v, and the figures relative to
exact attention (``score_ratio``, ``mem_vs_naive``, ``mem_vs_lean``, ``time_to_reach_s``).
"""

from __future__ import annotations

import math

from jsonschema import Draft202012Validator, ValidationError

SCHEMA_VERSION = 1

STATUSES = ("ok", "unsupported", "skipped", "timeout", "oom", "error")

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_POS_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}
_STR_OR_NULL = {"type": ["string", "null"]}

CASE = {
    "type": "object",
    "description": "One measured (or declined) case.",
    "required": ["suite", "kind", "name", "mask", "N", "B", "H", "D", "dtype", "device", "mode", "settings",
                 "status", "reason", "time_s", "times_s", "peak_bytes", "flops", "gflops", "frac_of_ceiling",
                 "error", "wall_s"],
    "properties": {
        "suite": {"type": "string", "enum": ["kernels", "mechanisms", "generate", "tasks"]},
        "kind": {"type": "string", "enum": ["backend", "mechanism", "layer", "generation", "training"],
                 "description": "an exact backend (or 'auto'), a mechanism, a whole attention layer, "
                                "a CausalLM generating (kv_cache / no_cache), or a model trained on a task"},
        "name": {"type": "string"},
        "mask": {"type": "string", "description": "none, causal, sliding_window (256 to the left), padding"},
        "N": {"type": "integer", "minimum": 1, "description": "queries = keys (generate: prompt length)"},
        "B": {"type": "integer", "minimum": 1},
        "H": {"type": "integer", "minimum": 1},
        "D": {"type": "integer", "minimum": 1},
        "dtype": {"type": "string"},
        "device": {"type": "string"},
        "mode": {"type": "string", "enum": ["fwd", "fwd_bwd", "generate", "train"],
                 "description": "forward under no_grad, forward + backward, a whole generation, or a whole "
                                "training run"},
        "settings": {"type": "object",
                     "description": "constructor settings of a mechanism or layer; generate: model and run sizes"},
        "notes": {"type": "array", "items": {"type": "string"}},
        "status": {"type": "string", "enum": list(STATUSES)},
        "reason": {**_STR_OR_NULL, "description": "why the case is not ok (None when ok)"},
        "time_s": {**_POS_OR_NULL, "description": "median seconds of one call (generate: one whole generation; "
                                                   "tasks: the training run)"},
        "times_s": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}},
        "peak_bytes": {"type": ["integer", "null"], "minimum": 0,
                       "description": "peak memory the call allocated beyond its inputs"},
        "peak_method": _STR_OR_NULL,
        "flops": {**_POS_OR_NULL, "description": "useful FLOPs of one call (kernels: allowed pairs only)"},
        "gflops": _POS_OR_NULL,
        "frac_of_ceiling": {**_POS_OR_NULL, "description": "gflops / matmul ceiling of this dtype"},
        "error": {"type": ["number", "null"], "minimum": 0,
                  "description": "kernels: max|out-ref|/max|ref|; mechanisms: ||out-ref||_F/||ref||_F"},
        "error_oracle": _STR_OR_NULL,
        "cost": {"type": ["object", "null"], "properties": {"flops": _NUM, "bytes": _NUM},
                 "description": "the mechanism's own cost() estimate for one forward call"},
        "chosen": {**_STR_OR_NULL, "description": "the backend auto chose"},
        "weights_copied": {"type": "boolean"},
        "note": {"type": "string"},
        "wall_s": {"type": "number", "minimum": 0, "description": "seconds the whole case took"},
        "isolated": {"type": "boolean", "description": "ran in its own process"},
        "tokens_per_s": {**_POS_OR_NULL, "description": "generate: new tokens x batch per second"},
        "tokens_digest": {**_STR_OR_NULL, "description": "generate: digest of the generated tokens"},
        "speedup": {**_POS_OR_NULL,
                    "description": "generate: seconds without the cache / seconds with it (null unless both ran)"},
        "tokens_match": {"type": ["boolean", "null"],
                         "description": "generate: both cases generated the same tokens (null unless both ran)"},
        "accuracy": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                     "description": "tasks: accuracy on the task's test split after training"},
        "eval_loss": {**_NUM_OR_NULL, "description": "tasks: loss on the test split"},
        "steps": {"type": "integer", "minimum": 0, "description": "tasks: optimizer steps taken"},
        "steps_per_s": {**_POS_OR_NULL, "description": "tasks: training steps per second"},
        "score": {**_NUM_OR_NULL, "description": "tasks: the task's score (accuracy, or bits per char for chars)"},
        "score_name": {"type": "string", "enum": ["accuracy", "bits_per_char"]},
        "score_split": {"type": "string", "description": "tasks: the split the score is measured on"},
        "curve": {"type": "array", "items": {"type": "array", "items": _NUM},
                  "description": "tasks: [step, validation score] during training"},
        "activation_error": {"type": ["number", "null"], "minimum": 0,
                             "description": "tasks: max|out-exact|/max|exact| on the trained model's own q, k, v "
                                            "(largest over layers)"},
        "real_error": {"type": ["object", "null"],
                       "description": "mechanisms: error against exact on q, k, v captured from real models, "
                                      "by source"},
        "score_ratio": {**_NUM_OR_NULL, "description": "tasks: score as a fraction of exact's (bits per char: "
                                                       "exact's / this)"},
        "mem_vs_naive": {**_POS_OR_NULL, "description": "tasks: peak memory / exact-naive's"},
        "mem_vs_lean": {**_POS_OR_NULL, "description": "tasks: peak memory / exact's (memory-lean)"},
        "exact_learned": {"type": ["boolean", "null"],
                          "description": "tasks: exact attention beat the trivial baseline (else the ratios say "
                                         "nothing about accuracy; null: no baseline)"},
        "baseline_score": {**_NUM_OR_NULL, "description": "tasks (exact's case): the score of a predictor that "
                                                          "ignores the input"},
        "time_to_reach_s": {**_POS_OR_NULL, "description": "tasks: training seconds until the validation score "
                                                           "reached 90 % of exact's final score"},
    },
    "additionalProperties": False,
}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "attnlab bench results",
    "type": "object",
    "required": ["schema_version", "created", "elapsed_s", "settings", "machine", "ceilings", "cases",
                 "auto_vs_sdpa", "verdicts", "plots", "notes"],
    "properties": {
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "created": {"type": "string", "description": "ISO 8601 time the run started"},
        "elapsed_s": {"type": "number", "minimum": 0},
        "settings": {
            "type": "object",
            "required": ["suites", "profile", "device", "dtype", "lengths", "timeout_s", "repeats", "isolate",
                         "max_error"],
            "properties": {
                "suites": {"type": "array", "items": {"type": "string"}},
                "profile": {"type": "string", "enum": ["quick", "standard", "full"]},
                "device": {"type": "string"},
                "dtype": {"type": "string"},
                "lengths": {"type": "object", "description": "suite -> list of N",
                            "additionalProperties": {"type": "array", "items": {"type": "integer"}}},
                "mask_kinds": {"type": "array", "items": {"type": "string"}},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0},
                "repeats": {"type": "integer", "minimum": 1},
                "budget_s": {"type": "number"},
                "isolate": {"type": "boolean"},
                "max_error": {"type": "number", "exclusiveMinimum": 0},
                "names": {"type": ["array", "null"], "items": {"type": "string"},
                          "description": "only these backends/mechanisms (null: all)"},
                "generate": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1},
                             "description": "model and run sizes of the generate suite"},
                "tasks": {"type": "array", "items": {"type": "string"}, "description": "arena tasks asked for"},
            },
        },
        "machine": {
            "type": "object",
            "required": ["cpu_model", "logical_cpus", "python", "torch", "numpy", "attnlab", "device"],
            "properties": {
                "cpu_model": {"type": "string"},
                "logical_cpus": {"type": "integer"},
                "physical_cores": {"type": ["integer", "null"]},
                "torch_threads": {"type": "integer"},
                "memory_total_bytes": {"type": ["integer", "null"]},
                "python": {"type": "string"},
                "torch": {"type": "string"},
                "numpy": {"type": "string"},
                "attnlab": {"type": "string"},
                "device": {"type": "string"},
                "device_name": {"type": "string"},
            },
        },
        "ceilings": {
            "type": "object",
            "required": ["matmul_gflops", "copy_gbps"],
            "properties": {
                "matmul_gflops": {"type": "object", "additionalProperties": _POS_OR_NULL,
                                  "description": "dtype -> GFLOP/s of a square matmul"},
                "matmul_size": {"type": "object"},
                "copy_gbps": {**_POS_OR_NULL, "description": "GB/s of a large copy (read + write)"},
                "copy_bytes": {"type": ["integer", "null"]},
                "status": {"type": "string"},
                "reason": _STR_OR_NULL,
            },
        },
        "cases": {"type": "array", "items": CASE},
        "auto_vs_sdpa": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mask", "N", "mode", "auto_s", "sdpa_s", "ratio"],
                "properties": {"mask": {"type": "string"}, "N": {"type": "integer"}, "mode": {"type": "string"},
                               "auto_s": _NUM, "sdpa_s": _NUM, "ratio": _NUM, "chosen": _STR_OR_NULL},
            },
        },
        "verdicts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["suite", "N", "mask", "mode", "text"],
                "properties": {"suite": {"type": "string"}, "N": {"type": "integer"}, "mask": {"type": "string"},
                               "mode": {"type": "string"}, "text": {"type": "string"},
                               "fastest": _STR_OR_NULL, "frugal": _STR_OR_NULL,
                               "under_error": {"type": "array", "items": {"type": "string"}},
                               "speedup": _POS_OR_NULL, "tokens_match": {"type": ["boolean", "null"]},
                               "task": {"type": "string"},
                               "close_to_exact": {"type": "array", "items": {"type": "string"},
                                                  "description": "tasks: mechanisms that hold 90 % of exact's score"}},
            },
        },
        "plots": {"type": "array", "items": {"type": "string"}, "description": "PNG files beside results.json"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}

_VALIDATOR = Draft202012Validator(SCHEMA)


def _where(root: str, parts) -> str:
    """``'$', ['cases', 0, 'N'] -> '$.cases[0].N'``."""
    return root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _clip(text: str, width: int = 200) -> str:
    """Shorten a message that quotes a large instance, keeping its end (what is wrong)."""
    return text if len(text) <= width else text[: width // 2] + " ... " + text[-width // 2:]


def _problems(err: ValidationError, root: str) -> list[str]:
    where = _where(root, err.absolute_path)
    if err.validator == "required":  # one line per missing key, in the words readers grep for
        return [f"{where}: missing required key {k!r}" for k in err.validator_value if k not in err.instance]
    return [f"{where}: {_clip(err.message)}"]


def _non_finite(instance, where: str):
    if isinstance(instance, float) and not math.isfinite(instance):
        yield f"{where}: {instance!r} is not finite"
    elif isinstance(instance, dict):
        for key, val in instance.items():
            yield from _non_finite(val, f"{where}.{key}")
    elif isinstance(instance, list):
        for i, val in enumerate(instance):
            yield from _non_finite(val, f"{where}[{i}]")


def validate(instance, schema: dict = SCHEMA, path: str = "$") -> list[str]:
    """Every way ``instance`` violates ``schema``, as ``"path: problem"`` lines (empty when valid)."""
    validator = _VALIDATOR if schema is SCHEMA else Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])
    lines = [line for err in errors for line in _problems(err, path)]
    lines += _non_finite(instance, path)
    return list(dict.fromkeys(lines))  # the missing keys of one object come once per key


__all__ = ["CASE", "SCHEMA", "SCHEMA_VERSION", "STATUSES", "validate"]
