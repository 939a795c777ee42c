"""The arena (the tasks suite): tiny runs of the real path, swap-in, the plan, resume after SIGKILL with lanes.

Scores are not asserted (a few steps learn nothing): what is checked is that every contender
trains or says why it cannot, that swap-ins start from exact's trained model, that the derived
figures are the ratios they claim to be, and that the verdict and the report say it in words.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.bench import load, run
from attnlab.bench.measure import Unsupported
from attnlab.bench.suites import tasks as arena
from attnlab.bench.suites.tasks import child, plan, results
from attnlab.bench.suites.tasks.plan import ArenaCase
from helpers import bench_options, check_bench_outputs

#: every run of a test shrunk to seconds: a two-phase curriculum of a few steps, small splits
SCALE = {"steps": 0.01, "batch": 4, "swap_steps": 2, "eval_every": 2,
         "options": {"mqar": {"pairs": 8, "keys": 16, "val_size": 16},
                     "listops": {"train_size": 64, "val_size": 16, "test_size": 16}}}
NAMES = ("exact", "exact-naive", "local", "nystrom")


# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_tasks_suite")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def arena_run(tmp_path_factory):
    """Isolated (the real path), in two lanes: each case in its own process, swap-ins after exact's run."""
    out = tmp_path_factory.mktemp("arena")
    res = run("tasks", bench_options(out, profile="full", lengths=(128,), names=NAMES, jobs=2, threads=1,
                                     suite_options={"tasks": {"tasks": ("mqar", "listops"), "scale": SCALE}}))
    return res, str(out)


def test_every_contender_trains_or_says_why(arena_run):
    res, out = arena_run
    check_bench_outputs(res, out)
    by = {(c["settings"]["task"], c["name"], c["mode"]): c for c in res["cases"]}
    trained = {(t, n) for t in ("mqar", "listops") for n in NAMES}
    swapped = {(t, n) for t in ("mqar", "listops") for n in ("local", "nystrom")}
    assert {(t, n) for t, n, m in by if m == "train"} == trained and {(t, n) for t, n, m in by if m == "swap_in"} == swapped
    for (task, name, mode), c in by.items():
        if task == "mqar" and name == "nystrom":  # a causal task: Nystrom cannot serve it, and says so
            assert c["status"] == "unsupported" and "causal" in c["reason"] and c.get("score") is None
            continue
        assert c["status"] == "ok" and c["isolated"], c
        assert c["mask"] == ("causal" if task == "mqar" else "padding") and (c["N"], c["H"], c["D"]) == (128, 2, 32)
        assert c["settings"]["positional"] == ("rotary" if task == "mqar" else "sinusoidal")
        assert 0.0 <= c["score"] <= 1.0 and c["score_name"] == "accuracy" and c["tokens_per_s"] > 0
        assert c["peak_bytes"] is not None and c["activation_error"] is not None
        assert c["baseline_score"] is not None
        if mode == "train" and name != "exact-naive":
            want = [32, 64, 128] if task == "mqar" else [32, 128]  # the standard recipe's short phases, or N / 4
            assert [p["length"] for p in c["phases"]] == want and c["steps"] == (6 + 4 + 3 if task == "mqar" else 4 + 3)
            assert c["mem_vs_naive"] == pytest.approx(c["peak_bytes"] / by[(task, "exact-naive", "train")]["peak_bytes"])
            assert c["tokens_per_s"] == pytest.approx(c["phases"][-1]["items"] / c["phases"][-1]["seconds"], rel=2e-2)
        if name == "exact-naive":
            assert c["settings"]["mechanism_settings"] == {"backend": "math"} and c["steps"] == plan.NAIVE_STEPS
            assert [p["length"] for p in c["phases"]] == [128]
        if mode == "swap_in":
            assert c["steps"] == 2 and c["score_0"] is not None and 0 <= c["score_0"] <= 1
            assert c["score_0_ratio"] == pytest.approx(c["score_0"] / by[(task, "exact", "train")]["score"])
    exact = by[("listops", "exact", "train")]
    assert exact["score_ratio"] == 1.0 and exact["activation_error"] < 1e-5  # sdpa vs the math formula
    local = by[("listops", "local", "train")]
    assert local["score_ratio"] == pytest.approx(local["score"] / exact["score"])
    assert local["phase_exact"] == [True, False]  # a block of 32 (N/4) holds the first phase's 32 positions
    assert local["settings"]["mechanism_settings"] == {"block_size": 32}


def test_verdicts_and_report_say_it_in_words(arena_run):
    res, out = arena_run
    lines = {v["task"]: v for v in res["verdicts"] if v["suite"] == "tasks"}
    assert {"mqar", "listops"} <= set(lines)
    assert lines["mqar"]["text"].startswith("mqar at N=128 (causal, curriculum 32→64→128, 13 steps): ")
    assert "nystrom (unsupported)" in lines["mqar"]["text"] and "nystrom swap-in (unsupported)" in lines["mqar"]["text"]
    for v in lines.values():
        exact = next(c for c in res["cases"] if c["settings"]["task"] == v["task"] and c["name"] == "exact"
                     and c["mode"] == "train")
        if exact["exact_learned"] is False:  # seven steps: exact has not beaten the trivial predictor, and says so
            assert "did not learn the task in this run" in v["text"] and v["close_to_exact"] == []
    assert "phase at 32 was exact attention for local" in lines["listops"]["text"]
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert md.index("# attnlab bench") < md.index("## The arena: accuracy at length")
    assert "| exact-naive | cost only | mqar | 128 |" in md and "same function" in md
    assert "arena_overview.png" not in res["plots"] or res["key_plots"] == ["arena_overview.png"]


def test_a_swapped_in_exact_is_the_trained_model_bit_for_bit(tmp_path):
    from attnlab.tasks import create_task
    from attnlab.train import RunSpec, train

    case = ArenaCase(kind="swap_in", contender="exact", mechanism="exact", mechanism_settings={}, positional="rotary",
                     task="mqar", n=64, task_options={"pairs": 4, "keys": 8, "length": 64, "val_size": 8}, data=None,
                     curriculum=((64, 2, 4),), eval_every=2, run_dir=str(tmp_path / "exact"))
    task = create_task("mqar", **case.task_options)
    spec = RunSpec(task="mqar", task_options=dict(case.task_options), model=child._model_overrides(case, task),
                   train={"steps": 3, "batch_size": 4, "progress": False, "threads": 1})
    trained = train(spec, case.run_dir, quiet=True, task=task).model.eval()
    swapped = child.swapped_model(case, task, case.run_dir)
    for (name, p), q in zip(trained.state_dict().items(), swapped.state_dict().values()):
        assert torch.equal(p, q), name
    tokens = task.example_batch("test", 4)["tokens"]
    with torch.no_grad():
        assert torch.equal(trained(tokens).logits, swapped(tokens).logits)


def test_plan_settings_coverage_and_runs():
    for n in (64, 129, 1000, 4096):
        for name in ("local", "longformer", "reformer", "linformer", "nystrom", "bigbird"):
            st = plan.mechanism_settings(name, n, max_len=4096)
            key = plan.BUDGET_KEYS[name]
            assert st[key] == max(2, min(plan.LRA_SETTINGS[name][key], n // 4)), (name, n, st)
    assert plan.mechanism_settings("nystrom", 4096, 4096)["num_landmarks"] == 128  # LRA's setting
    assert plan.exact_up_to("local", {"block_size": 256}, [64, 256, 257, 2048]) == [True, True, False, False]
    assert plan.exact_up_to("longformer", {"window": 256}, [64, 128, 129]) == [True, True, False]
    assert plan.exact_up_to("performer", {"features": 256}, [64]) == [False]  # never exact
    assert plan.exact_up_to("exact", {}, [64, 4096]) == [True, True]
    assert {(r.task, r.n) for r in plan.runs_of("standard")} == {
        ("mqar", 512), ("mqar", 1024), ("mqar", 2048), ("listops", 2000), ("passkey", 2048), ("chars", 1024)}
    for r in plan.runs_of("standard"):
        lengths = [p[0] for p in r.curriculum]
        assert lengths[-1] == r.n and lengths == sorted(set(lengths))
        if r.task == "mqar":
            assert r.options["pairs"] >= (16 if r.n >= 1024 else 8) and r.options["keys"] >= r.options["pairs"]
        if r.train.get("schedule") == "wsd":  # the decay within the last phase: the checkpoints others start from precede it
            assert 0 < r.train["decay_steps"] <= r.curriculum[-1][1]
            assert 0 < r.scaled(0.01).train["decay_steps"] <= r.scaled(0.01).curriculum[-1][1]
    assert [r.n for r in plan.runs_of("quick")] == [512]
    # the standard profile's MQAR-512 is the quick run: the same cases, so the main job's rows are reused
    assert plan.runs_of("standard", task_names=["mqar"], lengths=[512]) == plan.runs_of("quick")
    with pytest.raises(ValueError, match="arena task must be one of"):
        plan.runs_of("quick", task_names=["sudoku"])
    with pytest.raises(ValueError, match="beyond what task 'listops' supports"):
        plan.runs_of("full", task_names=["listops"], lengths=[100000])
    with pytest.raises(ValueError, match="has no run of tasks"):
        plan.runs_of("standard", task_names=["mqar"], lengths=[999])


def test_adaptive_span_in_the_arena_serves_causal_tasks_only():
    assert plan.mechanism_settings("adaptive-span", 1024, max_len=1024) == {"max_span": 256}
    assert not any(plan.exact_up_to("adaptive-span", {"max_span": 256}, [64, 1024]))  # spans start at 0
    child.check_mask_support("adaptive-span", {"max_span": 16}, "causal", 64, 32)
    with pytest.raises(Unsupported, match="padding mask: adaptive-span: needs a causal mask"):
        child.check_mask_support("adaptive-span", {"max_span": 16}, "padding", 64, 32)


def test_cases_need_exact_and_the_data(tmp_path):
    from attnlab.bench import RunOptions

    opts = RunOptions(profile="standard", data_dir=str(tmp_path), out_dir=str(tmp_path), jobs=2)
    specs = [j.spec() for j in arena.cases(opts, arena.TasksOptions())]
    swaps = [s for s in specs if s["mode"] == "swap_in"]
    assert swaps and all(s["needs"] == [f"{s['settings']['task']}@{s['N']}/exact/train"] for s in swaps)
    assert all(s["threads"] == max(1, (os.cpu_count() or 1) // 2) and "threads" not in s["settings"]["train"]
               for s in specs)
    assert not any(str(tmp_path) in json.dumps(s["settings"]) for s in specs)  # paths travel beside the settings
    for s in specs:
        if s["settings"]["task"] in ("passkey", "chars"):
            assert s["skip"]["status"] == "unsupported" and "attnlab data fetch tinyshakespeare" in s["skip"]["reason"]
        elif (s["name"] in ("linformer", "nystrom") and s["mask"] == "causal") or (
                s["name"] == "adaptive-span" and s["mask"] == "padding"):  # decided here, without a child
            assert s["skip"]["status"] == "unsupported" and f"{s['mask']} mask" in s["skip"]["reason"]
        else:
            assert s["skip"] is None
    ids = [s["id"] for s in specs]
    assert len(ids) == len(set(ids))
    reformer = next(s for s in specs if s["name"] == "reformer")
    assert reformer["settings"]["positional"] == "learned"
    with pytest.raises(ValueError, match="arena contenders must be among"):
        arena.cases(opts.with_(names=("flashy",)), arena.TasksOptions())
    with pytest.raises(ValueError, match="scale keys must be among"):
        arena.TasksOptions(scale={"epochs": 2})


def test_the_claim_is_answered_from_the_numbers():
    def case(name, ratio, naive, lean, mode="train"):
        return {"suite": "tasks", "name": name, "mode": mode, "status": "ok", "score": ratio, "score_name": "accuracy",
                "time_s": 1.0, "N": 512, "mask": "causal", "baseline_score": 0.05, "peak_bytes": int(100e6 * lean),
                "tokens_per_s": 100.0, "curve": [], "steps": 1,
                "settings": {"task": "mqar", "mechanism": "exact" if name.startswith("exact") else name,
                             "mechanism_settings": {}, "curriculum": [[512, 1, 4]], "kind": mode, "swap_steps": 0,
                             "positional": "rotary"}}
    cs = [case("exact", 1.0, 0.1, 1.0), {**case("exact-naive", 1.0, 1.0, 10.0), "score": None},
          case("local", 0.95, 0.05, 0.5), case("linear", 0.5, 0.05, 0.5)]
    cs[1]["peak_bytes"] = int(1000e6)
    results.derive(cs)
    (answer,) = [v for v in results.verdicts(cs) if v["mode"] == "claim"]
    assert answer["text"].startswith("Of 2 approximation-task pairs trained from scratch")
    assert "1 kept at least 90% of exact's score: local." in answer["text"]
    assert "20.0-20.0x less training memory than the naive N×N formula" in answer["text"]
    assert "holds on this machine for 1 of 2 pairs against naive attention and for 0 against memory-lean" in answer["text"]
    for c in cs[2:]:  # no approximation keeps the accuracy: the memory half is said to not arise
        c["score"] = 0.5
    results.derive(cs)
    (answer,) = [v for v in results.verdicts(cs) if v["mode"] == "claim"]
    assert "0 kept at least 90% of exact's score." in answer["text"]
    assert "the memory half does not arise; against memory-lean exact attention they used 2.00-2.00x less" in answer["text"]


@pytest.mark.slow  # a 36 s fault test; the runner's journal resume is tested in tests/bench/test_runner.py
def test_arena_resumes_after_sigkill_with_lanes_and_keeps_finished_figures(tmp_path):
    out = tmp_path / "arena"
    script = (
        "import sys\n"
        "from attnlab.bench import RunOptions, run\n"
        "if __name__ == '__main__':\n"
        f"    scale = {SCALE!r}\n"
        f"    run('tasks', RunOptions(out_dir={str(out)!r}, profile='full', lengths=(128,), jobs=2, threads=1,\n"
        "        names=('exact', 'local', 'linear'), resume='--resume' in sys.argv, repeats=1, budget_s=0.05,\n"
        f"        ceiling_size=128, copy_mb=4, progress=False, echo=False, cache_dir={str(tmp_path / 'cache')!r},\n"
        "        suite_options={'tasks': {'tasks': ('mqar',), 'scale': scale}}))\n")
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
    subprocess.run([sys.executable, str(tmp_path / "arena.py"), "--resume"], check=True, timeout=600)
    res = load(str(out / "results.json"))
    assert [(c["name"], c["mode"]) for c in res["cases"]] == [("exact", "train"), ("linear", "train"),
                                                              ("local", "train"), ("linear", "swap_in"),
                                                              ("local", "swap_in")]
    assert all(c["status"] == "ok" for c in res["cases"]) and any("resumed: " in n for n in res["notes"])
    by = {(c["name"], c["mode"]): c for c in res["cases"]}
    for row in first:
        rec = row["record"]
        kept = by[(rec["name"], rec["mode"])]
        for key in ("time_s", "peak_bytes", "score", "curve", "activation_error", "tokens_per_s", "wall_s"):
            assert kept[key] == rec[key], key


def test_a_case_keeps_its_journal_key_when_the_lanes_or_the_folder_change(tmp_path):
    from attnlab.bench import RunOptions
    from attnlab.bench.runner import case_key

    def keys(**kw):
        opts = RunOptions(profile="standard", data_dir=str(tmp_path), **kw)
        return [case_key(j.spec()) for j in arena.cases(opts, arena.TasksOptions())]

    one = keys(out_dir=str(tmp_path / "a"), jobs=1)
    assert one == keys(out_dir=str(tmp_path / "b"), jobs=2) == keys(out_dir=str(tmp_path / "a"), jobs=2, threads=1)


def test_contenders_exact_in_the_short_phases_continue_from_exact(tmp_path):
    from attnlab.bench import RunOptions

    opts = RunOptions(profile="standard", data_dir=str(tmp_path), out_dir=str(tmp_path))
    specs = {j.id: j.spec() for j in arena.cases(opts, arena.TasksOptions(tasks=("mqar",), swap_in=False))}
    exact = specs["mqar@1024/exact/train"]
    local = specs["mqar@1024/local/train"]  # a window of 256 covers phases at 32 and 64: 1,000 steps of exact
    assert local["settings"]["continue_step"] == 1000 and local["needs"] == ["mqar@1024/exact/train"]
    assert local["settings"]["source_dir"] == exact["settings"]["run_dir"] == "arena-runs/mqar-1024-exact"
    assert 1000 in exact["settings"]["save_steps"] and exact["priority"] > local["priority"]
    linear = specs["mqar@1024/linear/train"]  # never exact: from scratch
    assert linear["settings"]["continue_step"] == 0 and "needs" not in linear
    assert specs["mqar@1024/performer/train"]["settings"]["mechanism_settings"]["features"] == 256  # 1024 / 4
    assert specs["mqar@512/performer/train"]["settings"]["mechanism_settings"]["features"] == 128  # capped at N / 4
    nystrom = specs["mqar@512/nystrom/train"]  # no causal mask: decided here, no child process
    assert nystrom["skip"]["status"] == "unsupported" and "causal" in nystrom["skip"]["reason"]


def test_evaluations_run_at_phase_ends_and_in_the_last_phase_only():
    (quick,) = plan.runs_of("quick")
    case = plan._case(quick, plan.Contender("exact", "exact"), "train")
    assert case.eval_steps == [300, 350]  # the end of the phase at 32 (at 32), then every 50 steps at 512
    assert case.eval_batches == (16, 8)  # 128 sequences in the last phase's batches of 16
    later = dataclasses.replace(case, continue_step=300)
    assert later.eval_steps == [350]
    assert plan.ArenaCase.from_dict(case.to_dict()) == case


def test_a_run_whose_exact_misses_the_gate_is_void():
    exact = {"suite": "tasks", "name": "exact", "mode": "train", "status": "ok", "score": 0.80,
             "score_name": "accuracy", "time_s": 1.0, "N": 512, "mask": "causal", "baseline_score": 0.06,
             "peak_bytes": 100, "tokens_per_s": 100.0, "curve": [], "steps": 1,
             "settings": {"task": "mqar", "mechanism": "exact", "mechanism_settings": {}, "curriculum": [[512, 1, 4]],
                          "kind": "train", "swap_steps": 0, "positional": "rotary"}}
    local = {**exact, "name": "local", "score": 0.79, "settings": {**exact["settings"], "mechanism": "local"}}
    cases = [exact, local]
    results.derive(cases)
    assert all(c["run_void"] for c in cases)
    (line,) = [v for v in results.verdicts(cases) if v["mode"] == "train"]
    assert "void: exact attention reached 80.0 %, below the 95 %" in line["text"] and line["close_to_exact"] == []
    assert "void" in results.decision_rows(cases)[0][2]
    exact["score"] = 0.99
    results.derive(cases)
    assert not exact["run_void"] and "void" not in results.verdicts(cases)[0]["text"]


def test_plot_labels_do_not_overlap_and_the_title_fits(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    pts = [(1.0, 1.0), (1.02, 1.0), (1.0, 0.99), (1.05, 1.01), (0.98, 1.0), (3.0, 0.5)]
    ax.scatter(*zip(*pts))
    ax.set_xscale("log")
    results.place_labels(ax, pts, ["bigbird", "bigbird (swap)", "local", "longformer (swap)", "topk", "linear"])
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) == len(pts)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)
    case = {"name": "exact", "mode": "train", "score_ratio": 1.0, "mem_vs_naive": 0.5, "N": 512,
            "settings": {"task": "mqar"}}
    cases = [case] + [{**case, "name": n, "mode": m, "score_ratio": 0.9 + 0.01 * i, "mem_vs_naive": 0.4 + 0.01 * i}
                      for i, (n, m) in enumerate([("bigbird", "train"), ("bigbird", "swap_in"), ("local", "train")])]
    assert results.overview_plot(cases, str(tmp_path), plt) == ["arena_overview.png"]


def test_the_accuracy_table_has_a_row_per_contender(arena_run):
    res, out = arena_run
    head, rows = results.accuracy_rows([c for c in res["cases"] if c["suite"] == "tasks"])
    assert head[:4] == ["task", "contender", "from scratch", "swapped in"] and head[-1] == "serves the task"
    mqar = [r for r in rows if r[0] == "mqar at N=128"]
    assert [r[1] for r in mqar] == list(NAMES)
    nystrom = next(r for r in mqar if r[1] == "nystrom")
    assert nystrom[-1].startswith("unsupported: ") and "causal" in nystrom[-1]
    naive = next(r for r in mqar if r[1] == "exact-naive")
    assert naive[2] == "(cost only)" and naive[4]  # its memory is the naive baseline (1x)
    report = (Path(out) / "report.md").read_text()
    assert report.index("Accuracy at length (the arena)") < report.index("## At a glance")


#: the video runs shrunk to seconds: 6 steps at T = 8, then 2 at T = 16 from its checkpoint
VIDEO_SCALE = {"steps": 0.005, "batch": 8, "eval_every": 2, "options": {"moving-digits": {"val_size": 16, "test_size": 16}}}


def test_video_runs_continue_each_variant_from_its_own_t8_checkpoint(tmp_path):
    from attnlab.bench import RunOptions

    opts = RunOptions(profile="quick", out_dir=str(tmp_path))
    specs = {j.id: j.spec() for j in arena.cases(opts, arena.TasksOptions(tasks=("moving-digits",)))}
    variants = ("joint", "divided", "space", "axial")
    assert set(specs) == {f"moving-digits@{n}/{v}/{k}" for n in (128, 256) for v in variants for k in ("train", "cost")}
    for v in variants:
        short, long = specs[f"moving-digits@128/{v}/train"], specs[f"moving-digits@256/{v}/train"]
        assert short["settings"]["task_options"]["frames"] == 8 and long["settings"]["task_options"]["frames"] == 16
        assert short["settings"]["task_options"]["patch_size"] == long["settings"]["task_options"]["patch_size"] == 4
        assert long["needs"] == [f"moving-digits@128/{v}/train"] and "needs" not in short
        assert long["settings"]["source_dir"] == short["settings"]["run_dir"] == f"arena-runs/moving-digits-128-{v}"
        assert long["settings"]["continue_step"] == short["settings"]["curriculum"][0][1] == 1200
        assert [list(p) for p in long["settings"]["curriculum"][:1]] == short["settings"]["curriculum"]
        assert short["priority"] > long["priority"]  # every T = 8 run starts before the runs that need it
        for n, frames in ((128, 8), (256, 16)):  # the cost at the task's own patches of 2: 64 tokens a frame
            cost = specs[f"moving-digits@{n}/{v}/cost"]
            assert cost["settings"]["task_options"]["patch_size"] == 2 and cost["N"] == 64 * frames
    alone = {j.id: j for j in arena.cases(RunOptions(profile="quick", out_dir=str(tmp_path), lengths=(256,)),
                                          arena.TasksOptions(tasks=("moving-digits",)))}
    t16 = alone["moving-digits@256/divided/train"]  # no T = 8 run to continue from: the whole curriculum
    assert t16.case.continue_step == 0 and t16.case.source_dir is None and not t16.needs
    mqar = next(iter(arena.cases(opts, arena.TasksOptions(swap_in=False)))).spec()  # a sequence run: no video fields
    assert "attention" not in mqar["settings"] and "model" not in mqar["settings"]
    assert all(r.task != "moving-digits" for r in plan.runs_of("standard"))  # videos run only when named


def test_a_tiny_video_run_trains_continues_and_costs_on_the_runner(tmp_path):
    res = run("tasks", bench_options(tmp_path, profile="quick", lengths=None, names=("divided",), jobs=2, threads=1,
                                     suite_options={"tasks": {"tasks": ("moving-digits",), "scale": VIDEO_SCALE}}))
    check_bench_outputs(res, str(tmp_path))
    by = {(c["N"], c["settings"]["kind"]): c for c in res["cases"]}
    assert set(by) == {(128, "train"), (512, "cost"), (256, "train"), (1024, "cost")}
    assert all(c["status"] == "ok" and c["isolated"] for c in by.values()), by
    short, long = by[(128, "train")], by[(256, "train")]
    assert long["continued_from"]["step"] == short["steps"] == 6 and long["steps"] == 8
    assert long["phases"][0] == short["phases"][0]  # T = 8's phase, counted from the run it continued
    assert 0 <= long["accuracy_frames_shuffled"] <= 1 and long["steps_to_target"] is None  # 2 steps learn nothing
    for n in (512, 1024):
        cost = by[(n, "cost")]
        assert cost["peak_bytes"] > 0 and len(cost["times_s"]) >= 1 and cost["time_s"] > 0
    with open(tmp_path / "report.md") as f:
        report = f.read()
    assert "| 16 | divided | 4 |" in report and "not in 2" in report and "moving-digits at T=16: divided" in report


def test_video_steps_to_target_count_from_the_checkpoint_and_costs_compare_with_joint():
    def rec(name, kind, frames, **kw):
        settings = {"task": "moving-digits", "kind": kind, "attention": name, "continue_step": kw.pop("start", 0),
                    "task_options": {"frames": frames, "patch_size": 4 if kind == "train" else 2}}
        return {"name": name, "status": "ok", "time_s": kw.pop("time_s", 1.0), "settings": settings, "N": 16 * frames,
                "score": 0.99, "score_name": "accuracy", "steps": 1600, **kw}

    trained = rec("divided", "train", 16, start=1200, curve=[[1250, 0.90], [1300, 0.96], [1350, 0.97]])
    never = rec("space", "train", 8, curve=[[50, 0.2], [100, 0.21]], score=0.2)
    joint, divided = rec("joint", "cost", 16, time_s=0.8), rec("divided", "cost", 16, time_s=0.2)
    results.derive_video([trained, never, joint, divided])
    assert trained["steps_to_target"] == 100 and never["steps_to_target"] is None
    assert divided["time_vs_joint"] == 0.25 and joint["time_vs_joint"] == 1.0 and trained["time_vs_joint"] is None
    head, rows = results.video_rows([trained, never, joint, divided])
    cells = {(r[0], r[1]): dict(zip(head, r)) for r in rows}
    assert cells[("16", "divided")]["steps to 95 %"] == "100" and cells[("16", "divided")]["vs joint"] == "0.25"
    trained["curve"] = [[1250, 0.96]]  # met at the first check: somewhere in its first 50 steps
    results.derive_video([trained])
    assert results.video_rows([trained])[1][0][5] == "≤ 50"
    assert cells[("8", "space")]["steps to 95 %"] == "not in 1,600"


def test_standard_passkey_recipe_trains_and_swaps_in_with_its_wsd_decay(tmp_path):
    """The standard profile's passkey run, shrunk: its four phases and its wsd decay, trained and swapped in."""
    from helpers import fetched

    data = fetched("tinyshakespeare").parent
    scale = {"steps": 0.02, "batch": 2, "swap_steps": 3, "eval_every": 2, "options": {"passkey": {"val_size": 8}}}
    res = run("tasks", bench_options(tmp_path, profile="standard", lengths=(2048,), data_dir=str(data),
                                     names=("exact", "exact-naive", "local"),
                                     jobs=1, threads=1,
                                     suite_options={"tasks": {"tasks": ("passkey",), "scale": scale}}))
    by = {(c["name"], c["mode"]): c for c in res["cases"] if c["suite"] == "tasks"}
    exact = by[("exact", "train")]
    assert exact["status"] == "ok", exact
    assert [p["length"] for p in exact["phases"]] == [128, 512, 1024, 2048] and exact["steps"] == 20 + 4 + 2 + 2
    assert exact["settings"]["train"]["schedule"] == "wsd" and exact["settings"]["train"]["decay_steps"] == 2
    assert by[("local", "swap_in")]["status"] == "ok" and by[("local", "swap_in")]["steps"] == 3
    naive = by[("exact-naive", "train")]
    assert naive["status"] == "ok" and naive["steps"] == plan.NAIVE_STEPS
    # unshrunk, the naive case's few steps at N hold a decay of their length, not the recipe's 100 steps
    (recipe,) = plan.runs_of("standard", task_names=["passkey"])
    naive_case = plan._case(recipe, next(c for c in plan.contenders() if c.label == "exact-naive"), "naive")
    assert recipe.train["decay_steps"] == 100 and naive_case.train["decay_steps"] == naive_case.steps == plan.NAIVE_STEPS
