"""Tests of attnlab.bench: tiny runs of each suite, the schema, isolation, reports, compare.

Numbers themselves are never asserted (speed and memory are measured, not tested);
what is checked is that every figure is present, positive and finite, that cases a
backend cannot serve carry the reason, and that the files are complete.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re

import pytest
import torch

from attnlab import attention, masks
from attnlab.bench import SCHEMA, compare, compare_table, load, run, validate
from attnlab.bench.cli import add_bench_parser
from attnlab.bench.common import allowed_pairs, make_mask, oracle_rows
from attnlab.bench.isolate import Runner, execute
from attnlab.mechanisms import mechanisms

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
        assert {"kernels_time_none.png", "kernels_memory_causal.png"} <= set(res["plots"])


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
    assert "sdpa" in printed and "verdict" in printed
    assert validate(load(str(out / "results.json"))) == []

    with pytest.raises(SystemExit, match="suites must be among"):
        args = parser.parse_args(["bench", "nosuchsuite", "--no-isolate", "--quiet", "--out", str(out)])
        args.func(args)


def test_run_rejects_bad_arguments(tmp_path):
    for kwargs, match in (({"suites": ["kernel"]}, "suites"), ({"profile": "fast"}, "profile"),
                          ({"dtype": "int8"}, "dtype"), ({"lengths": "512,abc"}, "lengths"),
                          ({"device": "tpu"}, "device"), ({"names": ["nope"]}, "names")):
        with pytest.raises(ValueError, match=match):
            run(**{"out_dir": str(tmp_path), **kwargs})
