"""The kernels suite: every exact backend x mask x N x mode, the layer comparison, verdicts against sdpa."""

from __future__ import annotations

import importlib.util
import re

import pytest

from attnlab.bench import run
from attnlab.bench.isolate import execute
from attnlab.bench.suite import Job
from attnlab.bench.suites import kernels
from helpers import bench_options, check_bench_figures, check_bench_outputs

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_kernels_suite")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def kernels_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels")
    res = run(["kernels"], bench_options(out, isolate=False, names=("math", "chunked", "sdpa", "flex", "flash", "auto"),
                                         suite_options={"kernels": {"mask_kinds": ("none", "causal")}}))
    return res, str(out)


def test_files_schema_and_figures(kernels_run):
    res, out = kernels_run
    check_bench_outputs(res, out)
    check_bench_figures(res)
    assert res["settings"]["mask_kinds"] == ["none", "causal"]
    if HAS_MPL:
        assert "kernels_time_none.png" in res["plots"] and res["key_plots"] == ["kernels_overview.png"]


def test_cases_reasons_and_flops(kernels_run):
    res, _ = kernels_run
    cases = [c for c in res["cases"] if c["kind"] == "backend"]
    keys = {(c["name"], c["mask"], c["N"], c["mode"]) for c in cases}
    assert len(keys) == len(cases) == 6 * 2 * 2 * 2
    by = {(c["name"], c["mask"], c["N"], c["mode"]): c for c in cases}
    for mask in ("none", "causal"):
        for n in (64, 128):
            for mode in ("fwd", "fwd_bwd"):
                for name in ("math", "chunked", "sdpa", "auto"):
                    assert by[(name, mask, n, mode)]["status"] == "ok", by[(name, mask, n, mode)]
                assert by[("sdpa", mask, n, "fwd")]["error"] < 1e-4
    if importlib.util.find_spec("flash_attn") is None:
        flash = by[("flash", "none", 64, "fwd")]
        assert flash["status"] == "unsupported" and "flash-attn" in flash["reason"]
    flex = by[("flex", "causal", 128, "fwd_bwd")]
    assert flex["status"] in ("skipped", "unsupported") and "flex" in flex["reason"].lower()
    assert by[("auto", "none", 64, "fwd")]["chosen"] in ("math", "chunked", "sdpa", "flash")
    f_none, f_causal = by[("math", "none", 128, "fwd")]["flops"], by[("math", "causal", 128, "fwd")]["flops"]
    assert f_causal == pytest.approx(f_none * (128 + 1) / (2 * 128))
    assert by[("math", "none", 128, "fwd_bwd")]["flops"] == pytest.approx(2.5 * f_none)


def test_verdicts_and_decision_rows_compare_with_sdpa(kernels_run):
    res, _ = kernels_run
    verdicts = [v for v in res["verdicts"] if v["suite"] == "kernels"]
    assert len(verdicts) == 8
    for v in verdicts:
        assert v["fastest"] in ("math", "chunked", "sdpa") and v["fastest"] in v["text"]
        against = "sdpa" if v["fastest"] != "sdpa" else None
        if against:
            assert "than sdpa" in v["text"] or "same as sdpa" in v["text"], v["text"]
        # the time is compared with sdpa, never with math (unless sdpa itself is the fastest)
        assert not re.search(r"(faster|slower) than math", v["text"]) or v["fastest"] == "sdpa"
    mine = [c for c in res["cases"] if c["suite"] == "kernels"]
    rows = kernels.decision_rows(mine)
    assert rows and all(len(r) == 4 for r in rows)
    for _situation, use, gain, versus in rows:
        assert use.startswith("exact, ") and versus
        if "sdpa" not in use:
            assert versus == "sdpa" and "sdpa" in gain
    assert {(r["mask"], r["N"], r["mode"]) for r in res["auto_vs_sdpa"]} == {
        (m, n, mode) for m in ("none", "causal") for n in (64, 128) for mode in ("fwd", "fwd_bwd")}
    for r in res["auto_vs_fastest"]:
        assert r["auto_over_fastest"] > 0 and r["fastest"] in ("math", "chunked", "sdpa")


def test_layer_comparison(kernels_run):
    res, _ = kernels_run
    layers = [c for c in res["cases"] if c["kind"] == "layer"]
    assert {c["name"] for c in layers} == {"attnlab.MultiHeadAttention", "torch.nn.MultiheadAttention"}
    ours = next(c for c in layers if c["name"].startswith("attnlab") and c["mode"] == "fwd")
    assert ours["status"] == "ok" and ours["weights_copied"] and ours["error"] < 1e-4
    assert all(c["N"] == 128 for c in layers)  # layer_n "auto": the longest length asked for


def test_flex_backward_on_cpu_has_a_reason():
    case = kernels.KernelCase(kind="backend", name="flex", mask="causal", N=64, B=1, H=2, D=16, mode="fwd_bwd")
    res = execute({**Job(case).spec(), "repeats": 1})
    assert res["status"] == "unsupported" and "cpu" in res["reason"] and "forward only" in res["reason"]


def test_options_are_validated():
    with pytest.raises(ValueError, match="mask kinds must be among"):
        kernels.KernelsOptions(mask_kinds=("diagonal",))
    with pytest.raises(ValueError, match="layer_n"):
        kernels.KernelsOptions(layer_n=0)
    assert kernels.KernelsOptions(mask_kinds="none,causal").mask_kinds == ("none", "causal")


def test_the_parent_decides_what_needs_no_run_and_times_each_kernel_once():
    from attnlab.exact import native

    jobs = kernels.cases(kernels.LENGTHS["quick"], "cpu", "float32", "quick", ("none", "causal"), layer_n=None,
                         names=["math", "chunked", "native", "edges", "auto"])
    assert kernels.LENGTHS["quick"] == [1024, 4096]
    by = {(j.case.name, j.case.mask, j.case.N, j.case.mode): j for j in jobs}
    edges = by[("edges", "none", 1024, "fwd")]  # a dense mask: the edges backend refuses it, here, with no child
    assert edges.skip["status"] == "unsupported" and edges.skip["reason"]
    for mode in ("fwd", "fwd_bwd"):  # the N x N formula only up to QUICK_MATH_MAX_N in the quick profile
        assert by[("math", "none", 1024, mode)].skip is None
        slow = by[("math", "causal", 4096, mode)].skip
        assert slow["status"] == "skipped" and "--profile standard" in slow["reason"]
    standard = kernels.cases([4096], "cpu", "float32", "standard", ("none",), layer_n=None, names=["math"])
    assert all(j.skip is None for j in standard)
    if native.status() is not None:
        pytest.skip(f"the native kernel is not built here: {native.status()}")
    for mask in ("none", "causal"):
        for mode in ("fwd", "fwd_bwd"):
            chunked, auto = by[("chunked", mask, 4096, mode)], by[("auto", mask, 4096, mode)]
            assert chunked.same_as == {"id": f"kernels/native/{mask}/4096/{mode}", "result": {"ran": "native"}}
            if auto.same_as["result"]["ran"] == "native":
                assert auto.same_as["id"] == chunked.same_as["id"]
            assert auto.same_as["result"]["chosen"]


def test_a_case_timed_as_another_copies_its_figures(tmp_path):
    res = run(["kernels"], bench_options(tmp_path, isolate=False, names=("sdpa", "native", "chunked", "auto"),
                                         suite_options={"kernels": {"mask_kinds": ("causal",), "layer_n": None}}))
    by = {(c["name"], c["N"], c["mode"]): c for c in res["cases"] if c["kind"] == "backend"}
    for c in by.values():
        if c.get("timed_as"):
            src = next(x for x in res["cases"] if f"kernels/{x['name']}/{x['mask']}/{x['N']}/{x['mode']}"
                       == c["timed_as"])
            assert c["status"] == src["status"] and c["time_s"] == src["time_s"] and c["ran"] == src["name"]
            assert any("timed once there" in note for note in c["notes"])
    if not any(c.get("timed_as") for c in by.values()):
        pytest.skip("no backend ran another's kernel here (the native kernel is not built)")
    assert all(v["fastest"] != "chunked" or not by[("chunked", v["N"], v["mode"])].get("timed_as")
               for v in res["verdicts"] if v["suite"] == "kernels")
