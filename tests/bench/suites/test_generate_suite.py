"""The generate suite: greedy generation with and without the KV cache, isolated, same tokens."""

from __future__ import annotations

import copy
import importlib.util
import math
import os

import pytest

from attnlab.bench import compare, run, validate
from attnlab.bench.measure import token_digest
from attnlab.bench.report import terminal_summary
from attnlab.bench.suites import generate as gen_suite
from attnlab.models import generate
from helpers import bench_options, check_bench_figures, check_bench_outputs

HAS_MPL = importlib.util.find_spec("matplotlib") is not None

#: a generate run small enough for a unit test (odd sizes on purpose: 3 heads, head dim 8)
GEN_TINY = {"prompt_len": 17, "new_tokens": 9, "layers": 1, "dim": 24, "heads": 3, "vocab_size": 61}


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_generate_suite")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def generate_run(tmp_path_factory):
    """Isolated (the real path): each case in its own process, tokens compared across processes."""
    out = tmp_path_factory.mktemp("generate")
    return run("generate", bench_options(out, repeats=2, suite_options={"generate": GEN_TINY})), str(out)


def test_files_and_figures(generate_run):
    res, out = generate_run
    check_bench_outputs(res, out)
    check_bench_figures(res)
    assert res["settings"]["suites"] == ["generate"]
    assert res["settings"]["generate"] == {**gen_suite.DEFAULT_SIZES, **GEN_TINY}
    assert res["settings"]["lengths"] == {"generate": [GEN_TINY["prompt_len"]]}
    cases = {c["name"]: c for c in res["cases"]}
    assert set(cases) == {"kv_cache", "no_cache"} and len(res["cases"]) == 2
    for name, c in cases.items():
        assert c["status"] == "ok" and c["isolated"], c
        assert (c["suite"], c["kind"], c["mode"]) == ("generate", "generation", "generate")
        assert c["settings"]["use_cache"] is (name == "kv_cache")
        assert (c["N"], c["H"], c["D"]) == (GEN_TINY["prompt_len"], 3, 8)
        assert c["tokens_per_s"] == pytest.approx(GEN_TINY["new_tokens"] / c["time_s"])
        assert c["peak_bytes"] is not None and c["peak_method"].startswith("VmHWM")
        assert 1 <= len(c["times_s"]) <= 2
    kv, full = cases["kv_cache"], cases["no_cache"]
    for c in (kv, full):
        assert c["speedup"] == pytest.approx(full["time_s"] / kv["time_s"]) and math.isfinite(c["speedup"])
        assert c["tokens_match"] is True
    # the child processes generated what this process generates from the same seeds
    model, prompt = gen_suite.build(gen_suite.GenerateCase(name="kv_cache", **kv["settings"]))
    ref = generate(model, prompt, max_new_tokens=GEN_TINY["new_tokens"], eos_id=None, use_cache=False)
    assert token_digest(ref) == kv["tokens_digest"]
    if HAS_MPL:
        assert res["plots"] == ["generate_tokens_per_s.png"]


def test_verdict_and_tables(generate_run):
    res, out = generate_run
    cases = {c["name"]: c for c in res["cases"]}
    (v,) = res["verdicts"]
    assert v["suite"] == "generate" and v["tokens_match"] is True
    kv_tps, full_tps = cases["kv_cache"]["tokens_per_s"], cases["no_cache"]["tokens_per_s"]
    assert v["text"].startswith("generation: KV cache ")
    assert f"({kv_tps:,.1f} vs {full_tps:,.1f} tokens/s;" in v["text"] and "same tokens" in v["text"]
    assert "target" not in v["text"]
    assert v["text"] in terminal_summary(res)
    for f in ("report.md", "report.html"):
        with open(os.path.join(out, f)) as fh:
            page = fh.read()
        assert "Generation" in page and "kv_cache" in page and f"{kv_tps:,.1f}" in page
    same = compare(res, res)
    assert len(same) == 2 and all(r["status"] == "ok" and r["time_ratio"] == 1.0 for r in same)


def test_verdict_flags_different_tokens_and_failures(generate_run):
    cases = copy.deepcopy(generate_run[0]["cases"])
    by = {c["name"]: c for c in cases}
    by["no_cache"]["tokens_digest"] = "0" * 16
    gen_suite.link_cases(cases)
    assert by["kv_cache"]["tokens_match"] is False
    (v,) = gen_suite.verdicts(cases)
    assert v["tokens_match"] is False and "DIFFER" in v["text"]
    by["no_cache"].update(status="timeout", reason="timeout: exceeded 1 s", time_s=None, tokens_per_s=None)
    gen_suite.link_cases(cases)
    assert by["kv_cache"]["speedup"] is None
    (v,) = gen_suite.verdicts(cases)
    assert v["speedup"] is None and "not compared" in v["text"] and "no_cache: timeout" in v["text"]
    bad = copy.deepcopy(generate_run[0])
    bad["cases"][0]["tokens_match"] = "yes"
    bad["cases"][1]["speedup"] = 0.0
    errs = validate(bad)
    assert any("cases[0].tokens_match" in e for e in errs) and any("cases[1].speedup" in e for e in errs)


@pytest.mark.parametrize("fields,match", [({"layers": 0}, "layers"), ({"dim": 30, "heads": 4}, "divisible")])
def test_bad_sizes_are_refused(fields, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run("generate", bench_options(tmp_path, suite_options={"generate": fields}))
    with pytest.raises(ValueError, match="options of suite 'generate' must be among"):
        run("generate", bench_options(tmp_path, suite_options={"generate": {"layer": 2}}))
