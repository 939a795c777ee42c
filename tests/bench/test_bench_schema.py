"""attnlab.bench.schema: SCHEMA is valid Draft 2020-12, and validate() reports problems as "path: problem" lines."""

from __future__ import annotations

import copy

import pytest
from jsonschema import Draft202012Validator

from attnlab.bench.schema import SCHEMA_VERSION
from attnlab.bench.suites import CASE, SCHEMA, validate


def _case(**kw) -> dict:
    rec = {"suite": "kernels", "kind": "backend", "name": "sdpa", "mask": "causal", "N": 97, "B": 1, "H": 9, "D": 40,
           "dtype": "float32", "device": "cpu", "mode": "fwd", "settings": {}, "status": "ok", "reason": None,
           "time_s": 0.01, "times_s": [0.01, 0.011], "peak_bytes": 0, "flops": 1e6, "gflops": 0.1,
           "frac_of_ceiling": 0.5, "error": 1e-7, "wall_s": 0.2}
    return {**rec, **kw}


@pytest.fixture
def results() -> dict:
    """The smallest valid results.json: one case, nothing else."""
    return {
        "schema_version": SCHEMA_VERSION, "created": "2025-01-01T00:00:00+00:00", "elapsed_s": 1.5,
        "settings": {"suites": ["kernels"], "profile": "quick", "device": "cpu", "dtype": "float32",
                     "lengths": {"kernels": [97]}, "timeout_s": 10.0, "repeats": 1, "isolate": False,
                     "jobs": 1},
        "machine": {"cpu_model": "x", "logical_cpus": 2, "python": "3", "torch": "2", "numpy": "1",
                    "attnlab": "0.1", "device": "cpu"},
        "ceilings": {"matmul_gflops": {"float32": 10.0}, "copy_gbps": 1.0},
        "cases": [_case()], "auto_vs_sdpa": [], "auto_vs_fastest": [], "verdicts": [], "plots": [], "key_plots": [],
        "notes": [],
    }


def test_schema_is_valid_draft_2020_12():
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["properties"]["cases"]["items"] is CASE


def test_valid_results_have_no_problems(results):
    assert validate(results) == []


def test_problems_name_the_path(results):
    bad = copy.deepcopy(results)
    del bad["notes"], bad["plots"]
    bad["cases"] = [_case(status="fine"), _case(N="97"), _case(speedup=0.0), _case(surprise=1)]
    bad["cases"][0].pop("wall_s")
    errs = validate(bad)
    assert errs[:2] == ["$: missing required key 'plots'", "$: missing required key 'notes'"]
    assert "$.cases[0]: missing required key 'wall_s'" in errs
    assert any(e.startswith("$.cases[0].status: 'fine' is not one of") for e in errs)
    assert any(e.startswith("$.cases[1].N: '97' is not of type 'integer'") for e in errs)
    assert any(e.startswith("$.cases[2].speedup: ") for e in errs)
    assert any(e.startswith("$.cases[3]: ") and "'surprise'" in e for e in errs)
    assert len(errs) == 7, errs


def test_paths_come_in_document_order(results):
    bad = copy.deepcopy(results)
    bad["cases"] = [_case(N=0) for _ in range(11)]
    errs = validate(bad)
    assert [e.split(":")[0] for e in errs] == [f"$.cases[{i}].N" for i in range(11)]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_rejected_anywhere(results, value):
    bad = copy.deepcopy(results)
    bad["cases"][0]["time_s"] = value
    bad["cases"][0]["settings"] = {"eps": [1.0, value]}  # free-form: the schema says nothing of it
    errs = validate(bad)
    assert f"$.cases[0].time_s: {value!r} is not finite" in errs
    assert f"$.cases[0].settings.eps[1]: {value!r} is not finite" in errs


def test_any_schema_and_root_name():
    schema = {"type": "object", "required": ["a"], "properties": {"b": {"type": "array", "items": {"type": "integer"}}}}
    assert validate({"a": 1, "b": [1, 2]}, schema) == []
    assert validate({"b": [1, True]}, schema, path="doc") == ["doc: missing required key 'a'",
                                                              "doc.b[1]: True is not of type 'integer'"]


def test_long_messages_are_shortened_keeping_the_end(results):
    bad = copy.deepcopy(results)
    bad["cases"] = {str(i): "x" * 50 for i in range(100)}
    (err,) = validate(bad)
    assert err.startswith("$.cases: ") and err.endswith("is not of type 'array'") and len(err) < 250
