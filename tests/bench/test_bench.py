"""Tests of attnlab.bench: tiny runs of each suite, the schema, isolation, reports, compare.

Numbers themselves are never asserted (speed and memory are measured, not tested);
what is checked is that every figure is present, positive and finite, that cases a
backend cannot serve carry the reason, and that the files are complete.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import re

import pytest
import torch

import attnlab.bench
from attnlab import attention, masks
from attnlab.bench import DEFAULT_SUITES, SCHEMA, SUITES, compare, compare_table, load, run, validate
from attnlab.bench import generate as gen_suite
from attnlab.bench import tasks as task_suite
from attnlab.bench.cli import add_bench_parser
from attnlab.bench.common import allowed_pairs, make_mask, oracle_rows
from attnlab.bench.isolate import Runner, execute
from attnlab.bench.report import terminal_summary
from attnlab.bench.verdict import generate_verdicts
from attnlab.mechanisms import mechanisms
from attnlab.models import generate

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
TINY = {"lengths": [64, 128], "repeats": 1, "budget_s": 0.05, "ceiling_size": 128, "copy_mb": 4,
        "progress": False, "echo": False}


@pytest.fixture(scope="module")
def one_thread():
    """In-process tiny runs are quicker and steadier on one thread of a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def kernels_run(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("kernels")
    res = run(["kernels"], out_dir=str(out), isolate=False, mask_kinds=["none", "causal"],
              names=["math", "chunked", "sdpa", "flex", "flash", "auto"], **TINY)
    return res, str(out)


@pytest.fixture(scope="module")
def mechanisms_run(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("mechanisms")
    wanted = ["exact", "local", "performer", "linformer"]
    names = [n for n in wanted if n in mechanisms()]
    res = run("mechanisms", out_dir=str(out), isolate=False, names=names, **TINY)
    return res, str(out)


#: a generate run small enough for a unit test (odd sizes on purpose: 3 heads, head dim 8)
GEN_TINY = {"prompt_len": 17, "new_tokens": 9, "layers": 1, "dim": 24, "heads": 3, "vocab_size": 61}


@pytest.fixture(scope="module")
def generate_run(tmp_path_factory):
    """Isolated (the real path): each case in its own process, tokens compared across processes."""
    out = tmp_path_factory.mktemp("generate")
    res = run("generate", out_dir=str(out), generate_sizes=GEN_TINY, **{**TINY, "repeats": 2})
    return res, str(out)


def _check_outputs(res: dict, out: str) -> None:
    for f in ("results.json", "report.md", "report.html"):
        assert os.path.getsize(os.path.join(out, f)) > 0, f
    with open(os.path.join(out, "results.json")) as f:
        on_disk = json.load(f)
    assert validate(on_disk) == []
    assert on_disk["cases"] == json.loads(json.dumps(res["cases"]))
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    assert pngs == sorted(res["plots"])
    if HAS_MPL:
        assert pngs, "matplotlib is installed but no plot was written"
    else:
        assert any("pip install matplotlib" in n for n in res["notes"])
    with open(os.path.join(out, "report.html")) as f:
        page = f.read()
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,[A-Za-z0-9+/=]+"', page)) == len(pngs)
    assert "http://" not in page and "https://" not in page
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    for p in pngs:
        assert f"({p})" in md
    for v in res["verdicts"]:
        assert v["text"] in md


def _check_figures(res: dict) -> None:
    for c in res["cases"]:
        if c["status"] == "ok":
            assert c["reason"] is None
            assert c["time_s"] > 0 and math.isfinite(c["time_s"])
            assert c["times_s"] and all(t > 0 and math.isfinite(t) for t in c["times_s"])
            assert c["peak_bytes"] is not None and c["peak_bytes"] >= 0
            if c["flops"] is not None:
                assert c["flops"] > 0 and c["gflops"] > 0 and math.isfinite(c["gflops"])
                assert c["frac_of_ceiling"] > 0
            if c["mode"] == "fwd" and c["kind"] != "layer":
                assert c["error"] is not None and 0 <= c["error"] < float("inf")
        else:
            assert c["reason"], f"{c['name']} {c['status']} without a reason"
    for k, v in res["ceilings"]["matmul_gflops"].items():
        assert v is not None and v > 0 and math.isfinite(v), k
    assert res["ceilings"]["copy_gbps"] > 0


def test_kernels_run_files_and_schema(kernels_run):
    res, out = kernels_run
    _check_outputs(res, out)
    _check_figures(res)
    if HAS_MPL:
        assert "kernels_time_none.png" in res["plots"]
        # at these tiny sizes a case may allocate less than RSS can resolve (0 bytes); a
        # log-scale memory plot exists exactly when some causal case measured > 0
        measured = any(c["status"] == "ok" and c["mask"] == "causal" and (c["peak_bytes"] or 0) > 0
                       for c in res["cases"] if c["suite"] == "kernels" and c["kind"] == "backend")
        assert ("kernels_memory_causal.png" in res["plots"]) == measured


def test_kernels_run_cases_and_reasons(kernels_run):
    res, _ = kernels_run
    cases = [c for c in res["cases"] if c["kind"] == "backend"]
    # every backend x mask x N x mode appears, measured or with its reason
    keys = {(c["name"], c["mask"], c["N"], c["mode"]) for c in cases}
    assert len(keys) == len(cases) == 6 * 2 * 2 * 2
    by = {(c["name"], c["mask"], c["N"], c["mode"]): c for c in cases}
    for mask in ("none", "causal"):
        for n in (64, 128):
            for mode in ("fwd", "fwd_bwd"):
                for name in ("math", "chunked", "sdpa", "auto"):
                    assert by[(name, mask, n, mode)]["status"] == "ok", by[(name, mask, n, mode)]
                # exact backends agree with the oracle to float32 rounding
                assert by[("sdpa", mask, n, "fwd")]["error"] < 1e-4
    if importlib.util.find_spec("flash_attn") is None:
        flash = by[("flash", "none", 64, "fwd")]
        assert flash["status"] == "unsupported" and "flash-attn" in flash["reason"]
    flex = by[("flex", "causal", 128, "fwd_bwd")]
    assert flex["status"] in ("skipped", "unsupported") and "flex" in flex["reason"].lower()
    assert by[("auto", "none", 64, "fwd")]["chosen"] in ("math", "chunked", "sdpa", "flash")
    # causal counts about half the pairs of no mask
    f_none, f_causal = by[("math", "none", 128, "fwd")]["flops"], by[("math", "causal", 128, "fwd")]["flops"]
    assert f_causal == pytest.approx(f_none * (128 + 1) / (2 * 128))
    assert by[("math", "none", 128, "fwd_bwd")]["flops"] == pytest.approx(2.5 * f_none)
    assert {(r["mask"], r["N"], r["mode"]) for r in res["auto_vs_sdpa"]} == {
        (m, n, mode) for m in ("none", "causal") for n in (64, 128) for mode in ("fwd", "fwd_bwd")}
    verdicts = [v for v in res["verdicts"] if v["suite"] == "kernels"]
    assert len(verdicts) == 8
    assert all(v["fastest"] in ("math", "chunked", "sdpa") and v["fastest"] in v["text"] for v in verdicts)


def test_kernels_layer_comparison(kernels_run):
    res, _ = kernels_run
    layers = [c for c in res["cases"] if c["kind"] == "layer"]
    assert {c["name"] for c in layers} == {"attnlab.MultiHeadAttention", "torch.nn.MultiheadAttention"}
    try:
        from attnlab.layers import MultiHeadAttention  # noqa: F401
    except ImportError:
        assert all(c["status"] == "unsupported" for c in layers)
        return
    ours = next(c for c in layers if c["name"].startswith("attnlab") and c["mode"] == "fwd")
    assert ours["status"] == "ok", ours
    if ours.get("weights_copied"):
        assert ours["error"] < 1e-4  # same weights, same function


def test_mechanisms_run(mechanisms_run):
    res, out = mechanisms_run
    _check_outputs(res, out)
    _check_figures(res)
    names = set(res["settings"]["names"])
    assert {c["name"] for c in res["cases"]} == names
    exact = [c for c in res["cases"] if c["name"] == "exact" and c["mode"] == "fwd"]
    assert exact and all(c["error"] < 1e-4 for c in exact)
    for c in res["cases"]:
        if c["status"] == "ok":
            assert c["cost"] is not None and c["cost"]["flops"] > 0
    if HAS_MPL:
        assert "mechanisms_error_vs_cost.png" in res["plots"]
    assert [v["N"] for v in res["verdicts"]] == [64, 128]
    # beside random q, k, v: the error on MiniLM's own q, k, v over real sentences
    if task_suite.default_data_dir() is None:
        pytest.skip("no shared data folder: the real-activation error has no text")
    for c in res["cases"]:
        if c["mode"] == "fwd" and c["status"] == "ok":
            (src,) = c["real_error"]
            assert src.startswith("minilm (review sentences, 6 layers)"), c["real_error"]
            err = c["real_error"][src]
            assert isinstance(err, float) and err >= 0
            if c["name"] == "exact":
                assert err < 1e-4
        if c["mode"] == "fwd_bwd":
            assert "real_error" not in c
    perf = [c for c in res["cases"] if c["name"] == "performer" and c["mode"] == "fwd"]
    assert all(next(iter(c["real_error"].values())) > 1e-3 for c in perf)  # an approximation, not exact
    with open(os.path.join(out, "report.md")) as f:
        assert "minilm (review sentences, 6 layers)" in f.read()


def test_real_activation_error_from_a_char_lm_checkpoint(tmp_path):
    from attnlab.bench.mechanisms import real_errors
    from attnlab.train import RunSpec, train

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    run_dir = tmp_path / "chars"
    train(RunSpec(task="chars", data=str(text), task_options={"context": 32},
                  model={"dim": 16, "heads": 2, "layers": 2},
                  train={"steps": 3, "batch_size": 2, "progress": False, "precision": "fp32", "threads": 1}),
          run_dir, quiet=True)
    got = real_errors({"name": "local", "N": 32, "data_dir": None, "activations": str(run_dir)})
    lm = {k: v for k, v in got.items() if k.startswith("char LM")}
    (src, err), = lm.items()
    assert "2 layers" in src and isinstance(err, float) and 0.0 <= err
    assert "no real text" in got["minilm"]
    longer = real_errors({"name": "local", "N": 64, "data_dir": None, "activations": str(run_dir)})
    assert "context is 32" in next(v for k, v in longer.items() if k.startswith("char LM"))
    causal = real_errors({"name": "nystrom", "N": 32, "data_dir": None, "activations": str(run_dir)})
    assert next(v for k, v in causal.items() if k.startswith("char LM")).startswith("cannot serve")


def test_generate_run_files_and_figures(generate_run):
    res, out = generate_run
    _check_outputs(res, out)
    _check_figures(res)
    assert res["settings"]["suites"] == ["generate"]
    assert res["settings"]["generate"] == {**gen_suite.DEFAULT_SIZES, **GEN_TINY}
    assert res["settings"]["lengths"] == {"generate": [GEN_TINY["prompt_len"]]}
    cases = {c["name"]: c for c in res["cases"]}
    assert set(cases) == {"kv_cache", "no_cache"} and len(res["cases"]) == 2
    for name, c in cases.items():
        assert c["status"] == "ok" and c["isolated"], c
        assert c["suite"] == "generate" and c["kind"] == "generation" and c["mode"] == "generate"
        assert c["settings"]["use_cache"] is (name == "kv_cache")
        assert (c["N"], c["H"], c["D"]) == (GEN_TINY["prompt_len"], 3, 8)
        assert c["tokens_per_s"] > 0 and math.isfinite(c["tokens_per_s"])
        assert c["tokens_per_s"] == pytest.approx(GEN_TINY["new_tokens"] / c["time_s"])
        assert c["peak_bytes"] is not None and c["peak_method"].startswith("VmHWM")
        assert 1 <= len(c["times_s"]) <= 2
    kv, full = cases["kv_cache"], cases["no_cache"]
    speedup = full["time_s"] / kv["time_s"]
    for c in (kv, full):
        assert c["speedup"] == pytest.approx(speedup) and math.isfinite(c["speedup"])
        assert c["tokens_match"] is True
    assert kv["tokens_digest"] == full["tokens_digest"]
    # the child processes generated what this process generates from the same seeds
    model, prompt = gen_suite.build(kv["settings"], "cpu", "float32")
    ref = generate(model, prompt, max_new_tokens=GEN_TINY["new_tokens"], eos_id=None, use_cache=False)
    assert gen_suite.digest(ref) == kv["tokens_digest"]
    if HAS_MPL:
        assert res["plots"] == ["generate_tokens_per_s.png"]


def test_generate_verdict_and_tables(generate_run):
    res, out = generate_run
    cases = {c["name"]: c for c in res["cases"]}
    (v,) = res["verdicts"]
    assert v["suite"] == "generate" and v["tokens_match"] is True
    assert v["speedup"] == pytest.approx(cases["kv_cache"]["speedup"])
    kv_tps, full_tps = cases["kv_cache"]["tokens_per_s"], cases["no_cache"]["tokens_per_s"]
    assert v["text"].startswith("generation on this machine: KV cache ")
    assert f"({kv_tps:,.1f} vs {full_tps:,.1f} tokens/s;" in v["text"]
    words = "faster" if v["speedup"] >= 1.05 else "slower" if v["speedup"] <= 1 / 1.05 else "about as fast"
    assert words in v["text"] and "same tokens" in v["text"]
    assert "target" not in v["text"]  # no internal targets in what a user reads
    summary = terminal_summary(res)
    assert "generate (greedy, CausalLM):" in summary and v["text"] in summary
    for f in ("report.md", "report.html"):
        with open(os.path.join(out, f)) as fh:
            page = fh.read()
        assert "Generation" in page and "kv_cache" in page and "no_cache" in page and f"{kv_tps:,.1f}" in page
    same = compare(res, res)
    assert len(same) == 2 and all(r["status"] == "ok" and r["time_ratio"] == 1.0 for r in same)


def test_generate_verdict_flags_different_tokens_and_failures(generate_run):
    cases = copy.deepcopy(generate_run[0]["cases"])
    by = {c["name"]: c for c in cases}
    by["no_cache"]["tokens_digest"] = "0" * 16
    gen_suite.link_cases(cases)
    assert by["kv_cache"]["tokens_match"] is False and by["no_cache"]["tokens_match"] is False
    (v,) = generate_verdicts(cases)
    assert v["tokens_match"] is False and "DIFFER" in v["text"]
    by["no_cache"].update(status="timeout", reason="timeout: exceeded 1 s", time_s=None, tokens_per_s=None)
    gen_suite.link_cases(cases)
    assert by["kv_cache"]["speedup"] is None and by["kv_cache"]["tokens_match"] is None
    (v,) = generate_verdicts(cases)
    assert v["speedup"] is None and "not compared" in v["text"] and "no_cache: timeout" in v["text"]
    bad = copy.deepcopy(generate_run[0])
    bad["cases"][0]["tokens_match"] = "yes"
    bad["cases"][1]["speedup"] = 0.0
    errs = validate(bad)
    assert any("cases[0].tokens_match" in e for e in errs) and any("cases[1].speedup" in e for e in errs)


def test_generate_cli_passes_sizes_and_default_runs_every_suite(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(attnlab.bench, "run", lambda suites, **kw: seen.append((suites, kw)) or {})
    parser = argparse.ArgumentParser(prog="attnlab")
    add_bench_parser(parser.add_subparsers(dest="command"))
    for argv in (["bench", "generate", "--prompt-len", "33", "--new-tokens", "5"], ["bench"]):
        args = parser.parse_args([*argv, "--quiet", "--out", str(tmp_path)])
        assert args.func(args) == 0
    assert seen[0][0] == ["generate"] and seen[0][1]["generate_sizes"] == {"prompt_len": 33, "new_tokens": 5}
    assert seen[1][0] == list(DEFAULT_SUITES) and "generate" in seen[1][0] and seen[1][1]["generate_sizes"] is None
    assert "tasks" in SUITES and "tasks" not in DEFAULT_SUITES  # training runs only when asked for


def test_isolated_case_and_timeout_and_oom(tmp_path):
    res = run(["kernels"], out_dir=str(tmp_path), names=["sdpa"], mask_kinds=["causal"], layer_n=None,
              **{**TINY, "lengths": [64]})
    assert validate(res) == []
    cases = res["cases"]
    assert len(cases) == 2 and all(c["isolated"] and c["status"] == "ok" for c in cases), cases
    assert all(c["peak_bytes"] is not None and c["peak_method"].startswith("VmHWM") for c in cases)
    spec = {"suite": "kernels", "kind": "backend", "name": "math", "mask": "none", "N": 4096, "B": 1, "H": 8,
            "D": 64, "dtype": "float32", "device": "cpu", "settings": {}, "repeats": 3, "budget_s": 10.0}
    slow = Runner(isolate=True, timeout_s=0.2)({**spec, "mode": "fwd_bwd"})
    assert slow["status"] == "timeout" and "timeout" in slow["reason"]
    # an address-space cap of 0.1% of free memory makes the 512 MB score matrix fail to allocate
    oom = Runner(isolate=True, timeout_s=60)({**spec, "mode": "fwd", "mem_fraction": 0.001})
    assert oom["status"] == "oom" and "allocate" in oom["reason"], oom


def test_flex_backward_on_cpu_has_a_reason():
    spec = {"suite": "kernels", "kind": "backend", "name": "flex", "mask": "causal", "N": 64, "B": 1, "H": 2,
            "D": 16, "dtype": "float32", "device": "cpu", "mode": "fwd_bwd", "settings": {}, "repeats": 1}
    res = execute(spec)
    assert res["status"] == "unsupported"
    assert "cpu" in res["reason"] and "forward only" in res["reason"]


def test_unbuildable_mechanism_has_a_reason():
    spec = {"suite": "mechanisms", "kind": "mechanism", "name": "exact", "mask": "none", "N": 32, "B": 1, "H": 2,
            "D": 16, "dtype": "float32", "device": "cpu", "mode": "fwd", "settings": {"no_such_setting": 1},
            "repeats": 1}
    res = execute(spec)
    assert res["status"] == "unsupported" and "no_such_setting" in res["reason"]


@pytest.mark.parametrize("kind", ["none", "causal", "sliding_window", "padding"])
def test_allowed_pairs_counts_the_dense_mask(kind):
    n, b = 300, 2  # above the window of 256, batch of two different lengths
    m = make_mask(kind, n, b)
    dense = torch.ones(b, 1, n, n, dtype=torch.bool) if m is None else m.dense(n, n, batch=b).expand(b, 1, n, n)
    assert allowed_pairs(m, b, n, n) == int(dense.sum())


@pytest.mark.parametrize("kind", ["none", "causal", "sliding_window", "padding"])
def test_oracle_rows_match_the_reference(kind):
    g = torch.Generator().manual_seed(3)
    n = 97
    q, k, v = (torch.randn(2, 3, n, 40, generator=g) for _ in range(3))
    m = make_mask(kind, n, 2)
    rows = torch.tensor([0, 1, 50, 96])
    ref = attention(q, k, v, mask=m, backend="reference").double()[:, :, rows]
    torch.testing.assert_close(oracle_rows(q, k, v, m, rows), ref, rtol=1e-6, atol=1e-6)


def test_oracle_rows_fully_masked_row_is_zero():
    q = k = v = torch.randn(1, 1, 8, 4)
    out = oracle_rows(q, k, v, masks.padding([0]), torch.arange(8))
    torch.testing.assert_close(out, torch.zeros(1, 1, 8, 4, dtype=torch.float64))


def test_validator_finds_problems(kernels_run):
    res = json.loads(json.dumps(kernels_run[0]))
    assert validate(res) == []
    assert any("missing required key 'cases'" in e for e in validate({k: v for k, v in res.items() if k != "cases"}))
    bad = json.loads(json.dumps(res))
    bad["cases"][0]["time_s"] = float("nan")
    bad["cases"][1]["status"] = "fine"
    bad["cases"][2]["N"] = "64"
    errs = validate(bad)
    assert any("cases[0].time_s" in e and "finite" in e for e in errs)
    assert any("cases[1].status" in e for e in errs)
    assert any("cases[2].N" in e for e in errs)
    assert SCHEMA["properties"]["cases"]["items"]["additionalProperties"] is False


def test_compare_and_cli(kernels_run, mechanisms_run, one_thread, capsys, tmp_path):
    a = os.path.join(kernels_run[1], "results.json")
    b = os.path.join(mechanisms_run[1], "results.json")
    same = compare(a, a)
    ok = [r for r in same if r["status"] == "ok"]
    assert ok and all(r["time_ratio"] == 1.0 for r in ok)
    mixed = compare(load(a), b)
    assert {r["status"] for r in mixed} >= {"only in A", "only in B"}
    assert "B/A time" in compare_table(mixed)

    parser = argparse.ArgumentParser(prog="attnlab")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "compare", a, a])
    assert args.func(args) == 0
    assert "B/A time" in capsys.readouterr().out

    out = tmp_path / "cli"
    args = parser.parse_args(["bench", "kernels", "--lengths", "64", "--masks", "none", "--only", "sdpa",
                              "--repeats", "1", "--no-isolate", "--quiet", "--out", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("which attention to use") and "sdpa" in printed and "details:" in printed
    assert validate(load(str(out / "results.json"))) == []

    with pytest.raises(SystemExit, match="suites must be among"):
        args = parser.parse_args(["bench", "nosuchsuite", "--no-isolate", "--quiet", "--out", str(out)])
        args.func(args)


def test_run_rejects_bad_arguments(tmp_path):
    for kwargs, match in (({"suites": ["kernel"]}, "suites"), ({"profile": "fast"}, "profile"),
                          ({"dtype": "int8"}, "dtype"), ({"lengths": "512,abc"}, "lengths"),
                          ({"device": "tpu"}, "device"), ({"names": ["nope"]}, "names"),
                          ({"generate_sizes": {"layer": 2}}, "generate sizes"),
                          ({"generate_sizes": {"new_tokens": 0}}, "new_tokens"),
                          ({"generate_sizes": {"dim": 30, "heads": 4}}, "divisible")):
        with pytest.raises(ValueError, match=match):
            run(**{"out_dir": str(tmp_path), **kwargs})


# -- the tasks suite: the arena ---------------------------------------------------------


#: arena runs small enough for a unit test (seconds): recall (causal) and ListOps (padding)
ARENA_TINY = [task_suite.Run("mqar", 64, steps=12, batch_size=4, eval_every=4),
              task_suite.Run("listops", 64, steps=6, batch_size=4, eval_every=3)]
ARENA_NAMES = ["exact", "exact-naive", "local", "nystrom"]


@pytest.fixture(scope="module")
def tasks_run(tmp_path_factory):
    """Isolated (the real path): each contender trained in its own process."""
    out = tmp_path_factory.mktemp("tasks")
    mp = pytest.MonkeyPatch()
    mp.setitem(task_suite.PROFILES, "quick", ARENA_TINY)
    try:
        res = run("tasks", out_dir=str(out), names=ARENA_NAMES, **TINY)
    finally:
        mp.undo()
    return res, str(out)


def test_arena_trains_each_contender_and_reports(tasks_run):
    from attnlab.train import RunSpec, train

    res, out = tasks_run
    _check_outputs(res, out)
    assert res["settings"]["suites"] == ["tasks"] and res["settings"]["lengths"] == {"tasks": [64]}
    cases = {(c["settings"]["task"], c["name"]): c for c in res["cases"]}
    assert set(cases) == {(t, n) for t in ("mqar", "listops") for n in ARENA_NAMES}
    for (task, name), c in cases.items():
        if (task, name) == ("mqar", "nystrom"):
            continue
        assert c["status"] == "ok" and c["isolated"], c
        assert (c["suite"], c["kind"], c["mode"]) == ("tasks", "training", "train")
        assert c["mask"] == ("causal" if task == "mqar" else "padding")
        assert (c["N"], c["H"], c["D"]) == (64, 2, 32)
        want_steps = min(12 if task == "mqar" else 6, task_suite.NAIVE_STEPS)
        assert c["steps"] == want_steps and c["steps_per_s"] == pytest.approx(want_steps / c["time_s"])
        assert 0.0 <= c["score"] <= 1.0 and c["score_name"] == "accuracy" and c["tokens_per_s"] > 0
        assert c["peak_bytes"] is not None and c["peak_method"].startswith("VmHWM")
        assert c["curve"] and all(0.0 <= acc <= 1.0 for _, acc in c["curve"])
        assert c["activation_error"] is not None and c["activation_error"] >= 0
        assert c["mem_vs_naive"] == pytest.approx(c["peak_bytes"] / cases[(task, "exact-naive")]["peak_bytes"])
        assert c["mem_vs_lean"] == pytest.approx(c["peak_bytes"] / cases[(task, "exact")]["peak_bytes"])
        if name == "exact":
            assert c["score_ratio"] == 1.0 and c["activation_error"] < 1e-5  # sdpa vs the math formula
        if name == "local":
            assert c["score_ratio"] == pytest.approx(c["score"] / cases[(task, "exact")]["score"])
            assert c["activation_error"] > 0  # a window of N/4 is not exact attention
    assert cases[("mqar", "local")]["settings"]["mechanism_settings"] == {"block_size": 16}
    assert cases[("mqar", "exact-naive")]["settings"]["mechanism_settings"] == {"backend": "math"}
    # a causal task: Nystrom cannot serve it, and says so instead of training
    ny = cases[("mqar", "nystrom")]
    assert ny["status"] == "unsupported" and "causal" in ny["reason"] and ny.get("score") is None
    # the child trained exactly what this process trains from the same spec
    c = cases[("listops", "exact")]
    st = c["settings"]
    again = train(RunSpec(task=st["task"], task_options=st["task_options"],
                          model={**st["model"], "mechanism": "exact", "mechanism_settings": {}},
                          train={"steps": st["steps"], "batch_size": st["batch_size"], "seed": st["seed"],
                                 "precision": "fp32", "progress": False, "eval_every": st["eval_every"],
                                 "eval_batch_size": st["batch_size"], "eval_batches": 8}),
                  out + "/again", quiet=True)
    assert again.metrics["test"]["accuracy"] == pytest.approx(c["accuracy"])
    # one line per task and N, then the short answer at the top of every report
    lines = {v["task"]: v for v in res["verdicts"] if v["suite"] == "tasks"}
    assert set(lines) == {"mqar", "listops"}
    assert lines["mqar"]["text"].startswith("mqar at N=64 (causal, 12 steps): exact ")
    assert "nystrom (unsupported)" in lines["mqar"]["text"]
    learned = cases[("listops", "exact")]["exact_learned"]
    assert isinstance(cases[("listops", "exact")]["baseline_score"], float) and learned in (True, False)
    held = {n for n in ("local", "nystrom") if cases[("listops", n)]["score_ratio"] >= 0.9} if learned else set()
    assert set(lines["listops"]["close_to_exact"]) == held
    if not learned:  # a few steps: exact has not beaten the majority class, and the line says so
        assert "did not learn the task within this run" in lines["listops"]["text"]
    summary = terminal_summary(res)
    # the short answer first: the decision table (when a task was learned), then one line per task
    assert summary.startswith(("which attention to use", "accuracy at length")) and lines["mqar"]["text"] in summary
    assert "target" not in summary
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert md.index("## Which attention to use") < md.index("## Machine") < md.index("## Arena: accuracy at length")
    assert "| exact | mqar | 64 | 12 |" in md and "| exact-naive | mqar | 64 | 12 | (cost only) | same function |" in md
    if HAS_MPL:
        assert {"tasks_mqar_64.png", "tasks_listops_64.png", "pareto_listops_64.png"} <= set(res["plots"])


def test_arena_resumes_after_sigkill_without_changing_finished_cases(tmp_path):
    """Kill the arena once it has finished a case, resume it: the finished figures stay as they were."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "arena"
    script = (
        "import sys\n"
        "from attnlab.bench import tasks as T, run\n"
        "if __name__ == '__main__':\n"
        "    T.PROFILES['quick'] = [T.Run('mqar', 64, steps=8, batch_size=4, eval_every=4)]\n"
        f"    run('tasks', out_dir={str(out)!r}, names=['exact', 'local', 'linear'], resume='--resume' in sys.argv,\n"
        "        lengths=None, repeats=1, budget_s=0.05, ceiling_size=128, copy_mb=4, progress=False, echo=False)\n"
    )
    (tmp_path / "arena.py").write_text(script)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "arena.py")])
    journal = out / "cases.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (journal.exists() and journal.read_text().count("\n") >= 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = [json.loads(line) for line in journal.read_text().splitlines()]
    assert first and not (out / "results.json").exists(), "the run finished before it could be killed"
    subprocess.run([sys.executable, str(tmp_path / "arena.py"), "--resume"], check=True, timeout=300)
    res = load(str(out / "results.json"))
    assert [c["name"] for c in res["cases"]] == ["exact", "linear", "local"]  # contenders() order
    assert all(c["status"] == "ok" for c in res["cases"])
    assert any("resumed: " in n for n in res["notes"])
    by_name = {c["name"]: c for c in res["cases"]}
    for row in first:
        rec = row["record"]
        kept = by_name[rec["name"]]
        for key in ("time_s", "peak_bytes", "score", "curve", "activation_error", "tokens_per_s", "wall_s"):
            assert kept[key] == rec[key], key


def test_arena_settings_and_bad_input():
    for n in (64, 129, 1000, 4096):
        for name in ("local", "longformer", "reformer", "linformer", "nystrom", "bigbird"):
            st = task_suite.mechanism_settings(name, n, max_len=4096)
            size = next(v for k, v in st.items() if k in ("block_size", "window", "bucket_size", "k", "num_landmarks"))
            assert 2 <= size <= max(2, n // 4), (name, n, st)
            lra = task_suite.LRA_SETTINGS[name]
            key = next(k for k in st if k in lra and k != "seed" and k != "n_hashes")
            assert st[key] == max(2, min(lra[key], n // 4)), (name, n, st)
    assert task_suite.mechanism_settings("nystrom", 4096, 4096)["num_landmarks"] == 128  # LRA's setting
    assert task_suite.mechanism_settings("performer", 64, 64)["features"] == 256
    assert task_suite.mechanism_settings("exact", 24, 256) == {}
    with pytest.raises(task_suite.Unsupported, match="nystrom cannot serve this task's causal mask"):
        task_suite.check_mask_support("nystrom", {"num_landmarks": 4}, "causal", 16, 8)
    task_suite.check_mask_support("nystrom", {"num_landmarks": 4}, "padding", 16, 8)  # key padding: fine
    with pytest.raises(ValueError, match="profile must be one of"):
        task_suite.cases("huge", "cpu", "float32")
    with pytest.raises(ValueError, match="arena task must be one of"):
        task_suite.cases("quick", "cpu", "float32", task_names=["sudoku"])
    with pytest.raises(ValueError, match="arena contenders must be among"):
        task_suite.cases("quick", "cpu", "float32", names=["flashy"])
    with pytest.raises(ValueError, match="length 100000 is beyond what task 'listops' supports"):
        task_suite.cases("full", "cpu", "float32", task_names=["listops"], lengths=[100000])
    specs = task_suite.cases("standard", "cpu", "float32", data_dir="/nonexistent")
    chars = [s for s in specs if s["settings"]["task"] == "chars"]
    assert chars and all(s["skip"]["status"] == "unsupported" and "ATTNLAB_DATA" in s["skip"]["reason"]
                         for s in chars)
    assert {s["N"] for s in specs} == {256, 1024, 2000}
    short = task_suite.cases("standard", "cpu", "float32", task_names=["mqar", "listops"], lengths=[256])
    assert {(s["settings"]["task"], s["N"]) for s in short} == {("mqar", 256)}
    with pytest.raises(ValueError, match="has no run of tasks"):
        task_suite.cases("standard", "cpu", "float32", task_names=["mqar"], lengths=[999])
    assert len(task_suite.cases("full", "cpu", "float32", task_names=["mqar"], lengths=[256, 512])) == 2 * len(
        task_suite.contenders())


@pytest.mark.parametrize("argv,match", [
    (["tasks", "--tasks", "sudoku"], "arena task must be one of"),
    (["tasks", "--only", "flashy"], "names must be backends or mechanisms"),
    (["tasks", "--profile", "huge"], "profile must be one of"),
    (["tasks", "--profile", "full", "--tasks", "mqar", "--lengths", "9"], "beyond what task 'mqar' supports"),
])
def test_arena_cli_bad_input_is_one_line(argv, match, tmp_path, capsys):
    from attnlab.cli import main

    assert main(["bench", *argv, "--out", str(tmp_path), "--quiet"]) == 2
    msg = capsys.readouterr().err
    assert re.search(match, msg) and msg.count("\n") == 1 and msg.startswith("attnlab bench: ")


def test_peak_memory_sees_a_known_allocation():
    """``peak_memory`` returns the call's result and counts what the call allocated, not what was held before."""
    from attnlab.bench.measure import peak_memory

    held = torch.ones(16 * 2**20 // 4)  # 16 MiB held before the call: not counted

    def alloc():
        t = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        return float(t[-1] + held[-1])

    out, peak, method = peak_memory(alloc, "cpu")
    assert out == 2.0
    if peak is None:
        pytest.skip(f"no peak counter here: {method}")
    assert method.startswith("VmHWM-VmRSS")
    assert 60 * 2**20 <= peak < 76 * 2**20, peak
    _, small, _ = peak_memory(lambda: None, "cpu")
    assert small < 8 * 2**20, small
