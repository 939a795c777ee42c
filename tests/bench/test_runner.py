"""The runner: options, isolation (timeout, OOM), lanes and needs, the journal, the CLI, the progress lines.

Numbers are never asserted (speed and memory are measured, not tested): what is checked is
that every figure is present and finite, that cases a backend cannot serve carry the reason,
that lanes and needs run what they say, and that the files are complete.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from attnlab import attention, masks
from attnlab.bench import RunOptions, Suite, load, run, validate
from attnlab.bench.isolate import Runner
from attnlab.bench.measure import allowed_pairs, make_mask, oracle_rows
from attnlab.bench.progress import BenchProgress
from attnlab.bench.suite import REGISTRY, Job, register_suite
from attnlab.bench.suites.kernels import KernelCase
from helpers import UnitCase, bench_options


@dataclass(frozen=True)
class _SleepOptions:
    fail: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Sleep(UnitCase):
    """A case that sleeps (and fails, when asked)."""

    suite: ClassVar[str] = "sleeper"


_seen: list[tuple[str, float, float, list]] = []
_lock = threading.Lock()


class _Sleeper(Suite):
    """A suite whose cases sleep: lanes and needs are seen in their start and end times."""

    name = "sleeper"
    parallel = True
    Options = _SleepOptions
    kinds = ("sleep",)
    modes = ("sleep",)

    def cases(self, opts):
        fail = opts.of(self).fail
        return [Job(_Sleep(name=name, kind="sleep", mode="sleep", fail=name in fail), id=name, needs=needs)
                for name, needs in (("a", ()), ("b", ()), ("c", ("a",)), ("d", ("b",)))]

    def run_case(self, case, ctx):
        t0 = time.perf_counter()
        time.sleep(0.4)
        with _lock:
            _seen.append((case.name, t0, time.perf_counter(), sorted(ctx.needed)))
        if case.fail:
            raise RuntimeError("failed on purpose")
        return {"time_s": 0.4, "times_s": [0.4]}


@pytest.fixture
def sleeper():
    register_suite(_Sleeper)
    _seen.clear()
    yield
    REGISTRY.unregister("sleeper")


@pytest.mark.serial  # times the lanes against sleeps
def test_lanes_run_parallel_cases_side_by_side_and_needs_wait(sleeper, tmp_path):
    t0 = time.perf_counter()
    res = run("sleeper", bench_options(tmp_path, isolate=False, jobs=2, lengths=None))
    took = time.perf_counter() - t0
    assert [c["name"] for c in res["cases"]] == ["a", "b", "c", "d"]  # spec order, whatever finished first
    assert all(c["status"] == "ok" for c in res["cases"])
    at = {name: (start, end, needed) for name, start, end, needed in _seen}
    assert at["c"][0] >= at["a"][1] and at["d"][0] >= at["b"][1]  # a need ends before its case starts
    assert at["c"][2] == ["a"] and at["d"][2] == ["b"]  # the needed records are handed over
    assert at["b"][0] < at["a"][1]  # a and b ran side by side
    assert took < 4 * 0.4 + 1.0  # not one after another (1.6 s), give or take the ceilings
    assert res["settings"]["jobs"] == 2 and validate(res) == []


def test_a_failed_need_skips_its_case_with_the_reason(sleeper, tmp_path):
    res = run("sleeper", bench_options(tmp_path, isolate=False, jobs=2, lengths=None,
                                        suite_options={"sleeper": {"fail": ("a",)}}))
    by = {c["name"]: c for c in res["cases"]}
    assert by["a"]["status"] == "error" and by["c"]["status"] == "skipped"
    assert "needs a, which ended error" in by["c"]["reason"] and by["d"]["status"] == "ok"


def test_resume_reuses_the_journal(sleeper, tmp_path):
    first = run("sleeper", bench_options(tmp_path, isolate=False, lengths=None))
    _seen.clear()
    again = run("sleeper", bench_options(tmp_path, isolate=False, lengths=None, resume=True))
    assert _seen == [] and any("resumed: 4 finished" in n for n in again["notes"])
    assert [c["wall_s"] for c in again["cases"]] == [c["wall_s"] for c in first["cases"]]


def test_isolated_case_timeout_and_oom(tmp_path):
    res = run(["kernels"], bench_options(tmp_path, lengths=(64,), names=("sdpa",),
                                         suite_options={"kernels": {"mask_kinds": ("causal",), "layer_n": None}}))
    assert validate(res) == []
    assert len(res["cases"]) == 2 and all(c["isolated"] and c["status"] == "ok" for c in res["cases"])
    def spec(mode):
        return {**Job(KernelCase(kind="backend", name="math", mask="none", N=4096, mode=mode)).spec(), "repeats": 3,
                "budget_s": 10.0}

    slow = Runner(isolate=True, timeout_s=0.2)(spec("fwd_bwd"))
    assert slow["status"] == "timeout" and "timeout" in slow["reason"]
    # an address-space cap of 0.1% of free memory makes the 512 MB score matrix fail to allocate
    oom = Runner(isolate=True, timeout_s=60)({**spec("fwd"), "mem_fraction": 0.001})
    assert oom["status"] == "oom" and "allocate" in oom["reason"], oom


def test_stop_kills_the_children_in_flight_and_starts_no_more():
    """Ctrl-C on a run: the parent stops its lanes' children at once instead of waiting for them."""
    spec = {**Job(KernelCase(kind="backend", name="math", mask="none", N=4096, mode="fwd_bwd")).spec(),
            "repeats": 50, "budget_s": 60.0}
    runner, out = Runner(isolate=True, timeout_s=120), {}
    lane = threading.Thread(target=lambda: out.update(runner(spec)))
    lane.start()
    deadline = time.monotonic() + 60
    while not runner._live and time.monotonic() < deadline:  # the child has started
        time.sleep(0.05)
    assert runner._live
    t0 = time.perf_counter()
    runner.stop()
    lane.join(30)
    assert not lane.is_alive() and time.perf_counter() - t0 < 15
    assert out["status"] != "ok" and not runner._live  # killed, not a result
    with pytest.raises(KeyboardInterrupt):
        runner(spec)


@pytest.mark.parametrize("fields,match", [
    ({"profile": "fast"}, "profile must be one of"), ({"dtype": "int8"}, "dtype"), ({"lengths": "512,abc"}, "lengths"),
    ({"device": "tpu"}, "device"), ({"jobs": 0}, "jobs must be a positive int"), ({"repeats": 0}, "repeats"),
    ({"threads": -1}, "threads"), ({"suite_options": []}, "suite_options must map")])
def test_options_are_validated(fields, match):
    with pytest.raises(ValueError, match=match):
        RunOptions(**fields)


def test_run_rejects_unknown_suites_and_names(tmp_path):
    with pytest.raises(ValueError, match="suites must be among"):
        run("kernel", bench_options(tmp_path))
    with pytest.raises(ValueError, match="names must be among"):
        run("kernels", bench_options(tmp_path, names=("nope",)))
    with pytest.raises(ValueError, match="suite_options keys must be suite names"):
        run("kernels", bench_options(tmp_path, suite_options={"kernel": {}}))


def test_cli_compare_summary_and_one_line_errors(tmp_path, capsys):
    from attnlab.cli import main

    out = tmp_path / "cli"
    assert main(["bench", "kernels", "--lengths", "64", "--masks", "none", "--only", "sdpa", "--repeats", "1",
                 "--no-isolate", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("which attention to use") and "sdpa" in printed
    results = str(out / "results.json")
    assert validate(load(results)) == []
    assert main(["bench", "compare", results, results]) == 0
    assert "B/A time" in capsys.readouterr().out
    assert main(["bench", "summary", results]) == 0
    assert capsys.readouterr().out.startswith("which attention to use")
    for argv, words in ((["bench", "nosuchsuite"], "suites must be among"), (["bench", "compare", results],
                                                                              "compare needs two"),
                        (["bench", "summary"], "summary needs one"), (["bench", "--jobs", "0"], "jobs must be")):
        assert main([*argv, "--quiet", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attnlab bench: ") and words in err and err.count("\n") == 1


def test_progress_off_a_terminal_writes_few_lines(monkeypatch):
    from attnlab.bench import progress as progress_mod

    now = [0.0]
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    bar = BenchProgress({"kernels": 200, "mechanisms": 50}, stream=out)
    for suite, count in (("kernels", 200), ("mechanisms", 50)):
        for i in range(count):
            bar.start(suite, f"{suite} case {i}")
            now[0] += 1.0
            bar.step(suite, 1.0)
    lines = out.getvalue().splitlines()
    # a start and an end line per suite, and one a minute between them (at 60, 120 and 180 s of kernels)
    assert len(lines) == 2 * 2 + 3, lines
    assert lines[0] == "attnlab bench: kernels: 200 cases" and "kernels: done in 3:20" in lines[4]
    assert any(re.search(r"cases done, elapsed .* left; now ", line) for line in lines)
    assert "\r" not in out.getvalue()


@pytest.mark.parametrize("kind", ["none", "causal", "sliding_window", "padding"])
def test_allowed_pairs_counts_the_dense_mask(kind):
    n, b = 300, 2  # above the window of 256, batch of two different lengths
    m = make_mask(kind, n, b)
    dense = torch.ones(b, 1, n, n, dtype=torch.bool) if m is None else m.dense(n, n, batch=b).expand(b, 1, n, n)
    assert allowed_pairs(m, b, n, n) == int(dense.sum())


@pytest.mark.parametrize("kind", ["none", "causal", "sliding_window", "padding"])
def test_oracle_rows_match_the_reference(kind):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 97, 40, generator=g) for _ in range(3))
    m = make_mask(kind, 97, 2)
    rows = torch.tensor([0, 1, 50, 96])
    ref = attention(q, k, v, mask=m, backend="reference").double()[:, :, rows]
    torch.testing.assert_close(oracle_rows(q, k, v, m, rows), ref, rtol=1e-6, atol=1e-6)


def test_oracle_rows_fully_masked_row_is_zero():
    q = k = v = torch.randn(1, 1, 8, 4)
    out = oracle_rows(q, k, v, masks.padding([0]), torch.arange(8))
    torch.testing.assert_close(out, torch.zeros(1, 1, 8, 4, dtype=torch.float64))


def test_validator_finds_problems(tmp_path):
    res = json.loads(json.dumps(run(["kernels"], bench_options(
        tmp_path, isolate=False, lengths=(64,), names=("sdpa",),
        suite_options={"kernels": {"mask_kinds": ("none",), "layer_n": None}}))))
    assert validate(res) == []
    assert any("missing required key 'cases'" in e for e in validate({k: v for k, v in res.items() if k != "cases"}))
    bad = json.loads(json.dumps(res))
    bad["cases"][0]["time_s"] = float("nan")
    bad["cases"][1]["status"] = "fine"
    errs = validate(bad)
    assert any("cases[0].time_s" in e and "finite" in e for e in errs) and any("cases[1].status" in e for e in errs)


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
    assert method.startswith("VmHWM-VmRSS") and 60 * 2**20 <= peak < 76 * 2**20, peak
    _, small, _ = peak_memory(lambda: None, "cpu")
    assert small < 8 * 2**20, small
