"""The schema of ``results.json`` (JSON Schema, draft 2020-12) and its validator.

One file per run. ``cases`` holds one record per (suite, name, mask, N, mode): the raw
figures when ``status`` is ``ok``, else the reason. Units: seconds, bytes, FLOPs.
Derived figures (``gflops``, ``frac_of_ceiling``) are stored beside the raw ones so
that a reader needs nothing else; ``verdicts`` are computed from ``cases``.

:func:`validate` checks an instance against a schema with ``jsonschema`` and,
beyond what JSON Schema can say, that every number is finite: ``json.dump`` writes NaN
and Infinity, which are not JSON, and a NaN passes every ``minimum``.

The schema is the common part here plus each suite's fragment (its case, verdict, settings
and top-level fields, see :class:`attnlab.bench.suite.Suite`): :func:`build_schema` joins
them, and the catalogue (:func:`attnlab.bench.suites.results_schema`) calls it with every
registered suite, so a new suite extends it by registering. This module names no suite.
"""

from __future__ import annotations

import math

from jsonschema import Draft202012Validator, ValidationError

SCHEMA_VERSION = 2

STATUSES = ("ok", "unsupported", "skipped", "timeout", "oom", "error")

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_POS_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}
_STR_OR_NULL = {"type": ["string", "null"]}

#: the case fields every suite shares; each suite adds its own (:attr:`attnlab.bench.suite.Suite.case_properties`)
BASE_CASE_PROPERTIES: dict[str, dict] = {
    "suite": {"type": "string", "description": "the suite that measured it (enum: the registered suites)"},
    "kind": {"type": "string",
             "description": "what was measured, e.g. an exact backend (or 'auto'), a mechanism, a whole attention "
                            "layer, a CausalLM generating (kv_cache / no_cache), or a model trained on a task"},
    "name": {"type": "string"},
    "mask": {"type": "string", "description": "none, causal, sliding_window (256 to the left), padding"},
    "N": {"type": "integer", "minimum": 1, "description": "queries = keys (generate: prompt length)"},
    "B": {"type": "integer", "minimum": 1},
    "H": {"type": "integer", "minimum": 1},
    "D": {"type": "integer", "minimum": 1},
    "dtype": {"type": "string"},
    "device": {"type": "string"},
    "mode": {"type": "string",
             "description": "e.g. forward under no_grad, forward + backward, a whole generation, or a whole "
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
    "note": {"type": "string"},
    "wall_s": {"type": "number", "minimum": 0, "description": "seconds the whole case took"},
    "isolated": {"type": "boolean", "description": "ran in its own process"},
    "node": {"type": "string", "description": "the machine that ran it (executor ray: host name and Ray node IP)"},
    "reused": {"type": "object", "required": ["measured"],
               "properties": {"measured": {"type": "string"}, "cache": {"type": "string"}},
               "description": "taken from the result cache: when it was measured (same code, torch and CPU)"},
    "tokens_per_s": {**_POS_OR_NULL, "description": "generate: new tokens x batch per second; tasks: training "
                                                    "tokens per second"},
}

BASE_CASE_REQUIRED = ["suite", "kind", "name", "mask", "N", "B", "H", "D", "dtype", "device", "mode", "settings",
                      "status", "reason", "time_s", "times_s", "peak_bytes", "flops", "gflops", "frac_of_ceiling",
                      "error", "wall_s"]

#: the fields every verdict has; suites add theirs (:attr:`attnlab.bench.suite.Suite.verdict_properties`)
BASE_VERDICT_PROPERTIES: dict[str, dict] = {
    "suite": {"type": "string"}, "N": {"type": "integer"}, "mask": {"type": "string"}, "mode": {"type": "string"},
    "text": {"type": "string"}, "fastest": _STR_OR_NULL, "frugal": _STR_OR_NULL,
}

#: the run settings every results.json has; suites add theirs (``settings_properties``)
BASE_SETTINGS_PROPERTIES: dict[str, dict] = {
    "suites": {"type": "array", "items": {"type": "string"}},
    "profile": {"type": "string", "enum": ["quick", "standard", "full"]},
    "device": {"type": "string"},
    "dtype": {"type": "string"},
    "lengths": {"type": "object", "description": "suite -> list of N",
                "additionalProperties": {"type": "array", "items": {"type": "integer"}}},
    "timeout_s": {"type": "number", "exclusiveMinimum": 0},
    "repeats": {"type": "integer", "minimum": 1},
    "budget_s": {"type": "number"},
    "isolate": {"type": "boolean"},
    "jobs": {"type": "integer", "minimum": 1, "description": "lanes the parallel suites' cases ran in"},
    "executor": {"type": "string", "enum": ["local", "ray"], "description": "this machine, or a Ray cluster"},
    "names": {"type": ["array", "null"], "items": {"type": "string"},
              "description": "only these backends/mechanisms (null: all)"},
}

_MACHINE = {
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
}

_CEILINGS = {
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
}


def _merge(into: dict[str, dict], extra: dict[str, dict], where: str, suite: str) -> None:
    """Add a suite's schema fragment; two suites that define one key differently are a bug, said here."""
    for key, val in extra.items():
        if key in into and into[key] != val:
            raise ValueError(f"suite {suite!r} redefines {where} field {key!r} differently from another suite "
                             f"or the common schema; give it another name or share one definition")
        into[key] = val


def build_schema(suites: dict) -> dict:
    """The results.json schema: the common part plus the fragments of ``suites`` (name -> Suite)."""
    case_props, verdict_props = dict(BASE_CASE_PROPERTIES), dict(BASE_VERDICT_PROPERTIES)
    settings_props, results_props = dict(BASE_SETTINGS_PROPERTIES), {}
    required: dict[str, list[str]] = {}
    kinds: list[str] = []
    modes: list[str] = []
    for name, suite in suites.items():
        _merge(case_props, suite.case_properties, "case", name)
        _merge(verdict_props, suite.verdict_properties, "verdict", name)
        _merge(settings_props, suite.settings_properties, "settings", name)
        _merge(results_props, suite.results_properties, "results", name)
        required[name] = list(suite.results_required)
        kinds += [k for k in suite.kinds if k not in kinds]
        modes += [m for m in suite.modes if m not in modes]
    case_props["suite"] = {**case_props["suite"], "enum": list(suites)}
    if kinds:
        case_props["kind"] = {**case_props["kind"], "enum": kinds}
    if modes:
        case_props["mode"] = {**case_props["mode"], "enum": modes}
    case = {"type": "object", "description": "One measured (or declined) case.", "required": list(BASE_CASE_REQUIRED),
            "properties": case_props, "additionalProperties": False}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "attnlab bench results",
        "type": "object",
        "required": ["schema_version", "created", "elapsed_s", "settings", "machine", "ceilings", "cases",
                     "verdicts", "plots", "key_plots", "notes"],
        # each suite that ran fills its own top-level keys (validate() checks them by settings.suites)
        "x-suite-required": required,
        "properties": {
            "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
            "created": {"type": "string", "description": "ISO 8601 time the run started"},
            "elapsed_s": {"type": "number", "minimum": 0},
            "settings": {"type": "object",
                         "required": ["suites", "profile", "device", "dtype", "lengths", "timeout_s", "repeats",
                                      "isolate", "jobs"],
                         "properties": settings_props},
            "machine": _MACHINE,
            "ceilings": _CEILINGS,
            "cases": {"type": "array", "items": case},
            **results_props,
            "verdicts": {"type": "array", "items": {"type": "object",
                                                    "required": ["suite", "N", "mask", "mode", "text"],
                                                    "properties": verdict_props}},
            "plots": {"type": "array", "items": {"type": "string"}, "description": "PNG files beside results.json"},
            "key_plots": {"type": "array", "items": {"type": "string"},
                          "description": "the plots the report shows first (a subset of plots)"},
            "notes": {"type": "array", "items": {"type": "string"}},
        },
    }


#: the last schema :func:`validate` compiled, and its validator (the catalogue's schema, run after run)
_compiled: list = [None, None]


def _validator(schema: dict) -> Draft202012Validator:
    if _compiled[0] is not schema:
        _compiled[:] = [schema, Draft202012Validator(schema)]
    return _compiled[1]


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


def validate(instance, schema: dict, path: str = "$") -> list[str]:
    """Every way ``instance`` violates ``schema``, as ``"path: problem"`` lines; empty when it is valid.

    results.json's schema is :func:`attnlab.bench.suites.results_schema` (the registered suites'),
    which :func:`attnlab.bench.suites.validate` checks against.
    """
    errors = sorted(_validator(schema).iter_errors(instance),
                    key=lambda e: [(isinstance(p, str), p) for p in e.absolute_path])
    lines = [line for err in errors for line in _problems(err, path)]
    if isinstance(instance, dict) and isinstance(instance.get("settings"), dict):
        by_suite = schema.get("x-suite-required", {})
        for suite in instance["settings"].get("suites") or []:
            lines += [f"{path}: missing required key {k!r} (suite {suite})" for k in by_suite.get(suite, [])
                      if k not in instance]
    lines += _non_finite(instance, path)
    return list(dict.fromkeys(lines))  # the missing keys of one object come once per key


__all__ = ["BASE_CASE_PROPERTIES", "SCHEMA_VERSION", "STATUSES", "build_schema", "validate"]
