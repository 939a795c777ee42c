"""The mechanisms suite: every mechanism x N, error against exact on random and on real q, k, v."""

from __future__ import annotations

import importlib.util

import pytest

from attnlab.bench import run
from attnlab.bench.isolate import execute
from attnlab.bench.suite import Job
from attnlab.bench.suites.mechanisms import MechanismCase, MechanismsOptions, real_errors
from attnlab.mechanisms import mechanisms
from helpers import bench_options, check_bench_figures, check_bench_outputs, fetched

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_mechanisms_suite")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def mechanisms_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mechanisms")
    names = tuple(n for n in ("exact", "local", "performer", "linformer") if n in mechanisms())
    return run("mechanisms", bench_options(out, isolate=False, names=names)), str(out)


def test_run_files_figures_and_real_error(mechanisms_run):
    res, out = mechanisms_run
    check_bench_outputs(res, out)
    check_bench_figures(res)
    assert {c["name"] for c in res["cases"]} == set(res["settings"]["names"])
    exact = [c for c in res["cases"] if c["name"] == "exact" and c["mode"] == "fwd"]
    assert exact and all(c["error"] < 1e-4 for c in exact)
    assert all(c["cost"]["flops"] > 0 for c in res["cases"] if c["status"] == "ok")
    if HAS_MPL:
        assert "mechanisms_error_vs_cost.png" in res["plots"]
    assert [v["N"] for v in res["verdicts"]] == [64, 128]
    fetched("sentiment")  # the real-activation error reads review sentences
    for c in res["cases"]:
        if c["mode"] == "fwd" and c["status"] == "ok":
            (src,) = c["real_error"]
            assert src.startswith("minilm (review sentences, 6 layers)"), c["real_error"]
            err = c["real_error"][src]
            assert isinstance(err, float) and err >= 0 and (err < 1e-4 or c["name"] != "exact")
        if c["mode"] == "fwd_bwd":
            assert "real_error" not in c
    perf = [c for c in res["cases"] if c["name"] == "performer" and c["mode"] == "fwd"]
    assert all(next(iter(c["real_error"].values())) > 1e-3 for c in perf)


def test_real_activation_error_from_a_char_lm_checkpoint(tmp_path):
    from attnlab.train import RunSpec, train

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    run_dir = tmp_path / "chars"
    train(RunSpec(task="chars", data=str(text), task_options={"context": 32},
                  model={"dim": 16, "heads": 2, "layers": 2},
                  train={"steps": 3, "batch_size": 2, "progress": False, "precision": "fp32", "threads": 1}),
          run_dir, quiet=True)
    got = real_errors(MechanismCase(name="local", N=32, mode="fwd", activations=str(run_dir)))
    (src, err), = {k: v for k, v in got.items() if k.startswith("char LM")}.items()
    assert "2 layers" in src and isinstance(err, float) and 0.0 <= err
    assert "no real text" in got["minilm"]
    longer = real_errors(MechanismCase(name="local", N=64, mode="fwd", activations=str(run_dir)))
    assert "context is 32" in next(v for k, v in longer.items() if k.startswith("char LM"))
    causal = real_errors(MechanismCase(name="nystrom", N=32, mode="fwd", activations=str(run_dir)))
    assert next(v for k, v in causal.items() if k.startswith("char LM")).startswith("cannot serve")


def test_unbuildable_mechanism_has_a_reason():
    case = MechanismCase(name="exact", N=32, mode="fwd", kwargs={"no_such_setting": 1}, B=1, H=2, D=16)
    res = execute({**Job(case).spec(), "repeats": 1})
    assert res["status"] == "unsupported" and "no_such_setting" in res["reason"]


def test_options_are_validated():
    with pytest.raises(ValueError, match="max_error must be a positive number"):
        MechanismsOptions(max_error=0)
