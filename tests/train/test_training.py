"""The trainer: every task trains (loss falls), schedules, checkpoints round-trip without pickle,
a killed run resumes into the uninterrupted one, options fail clearly, the CLI works end to end."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.command import run_command
from attnlab.train import (
    RunSpec,
    TrainConfig,
    load_checkpoint,
    load_run,
    lr_at,
    parse_duration,
    read_metrics,
    resolve_precision,
    train,
)
from attnlab.train.checkpoint import (
    CorruptCheckpointError,
    capture_rng,
    checkpoints,
    flatten_optimizer,
    latest_checkpoint,
    restore_rng,
    unflatten_optimizer,
)
from attnlab.train.cli import add_train_parsers, parse_attention, parse_kv, spec_from_args

ROOT = Path(__file__).resolve().parents[2]


def _spec(task="copy", data=None, opts=None, model=None, **train_kw) -> RunSpec:
    tr = dict(precision="fp32", progress=False, log_every=1, threads=1, eval_batches=2, final_eval=False)
    tr.update(train_kw)
    return RunSpec(task=task, data=data, task_options=opts or {}, model=model or {}, train=tr)


def _falls(losses: dict[int, float], k: int = 4) -> None:
    v = [losses[s] for s in sorted(losses)]
    first, last = sum(v[:k]) / k, sum(v[-k:]) / k
    assert last < 0.9 * first, f"loss did not fall: first {first:.4f}, last {last:.4f}"


# -- schedule -------------------------------------------------------------------------
def test_schedules():
    assert lr_at(0, lr=1.0, warmup=4) == 0.25 and lr_at(3, lr=1.0, warmup=4) == 1.0
    assert lr_at(4, lr=1.0, warmup=4, total=14, min_lr=0.1) == 1.0
    assert math.isclose(lr_at(9, lr=1.0, warmup=4, total=14, min_lr=0.1), 0.55)  # half way down the cosine
    assert lr_at(14, lr=1.0, warmup=4, total=14, min_lr=0.1) == pytest.approx(0.1)
    assert lr_at(99, lr=1.0, warmup=4, total=14, min_lr=0.1) == pytest.approx(0.1)
    # Vaswani et al.: dim^-0.5 min(s^-0.5, s warmup^-1.5) with s = step + 1
    dim, w = 512, 4000
    for s in (0, 100, 3999, 4000, 20000):
        paper = dim ** -0.5 * min((s + 1) ** -0.5, (s + 1) * w ** -1.5)
        assert lr_at(s, lr=dim ** -0.5 * w ** -0.5, schedule="inverse_sqrt", warmup=w) == pytest.approx(paper)
    with pytest.raises(ValueError, match="schedule must be"):
        lr_at(0, lr=1.0, schedule="linear")


def test_wsd_schedule_is_constant_then_falls_linearly_to_min_lr():
    # 2 warm-up steps, constant up to step 5, then 4 steps down to min_lr (the last step takes it)
    rates = [lr_at(s, lr=1.0, schedule="wsd", warmup=2, total=10, min_lr=0.2, decay=4) for s in range(12)]
    assert rates[:6] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert rates[6:10] == pytest.approx([0.8, 0.6, 0.4, 0.2]) and rates[10:] == pytest.approx([0.2, 0.2])
    # before its decay a wsd run has the constant schedule's rates: a longer one continues a shorter one's checkpoint
    assert all(lr_at(s, lr=1.0, schedule="wsd", warmup=2, total=10, decay=4)
               == lr_at(s, lr=1.0, schedule="constant", warmup=2) for s in range(6))
    for bad in (0, 11):
        with pytest.raises(ValueError, match=r"decay of the wsd schedule must be in \[1, total=10\]"):
            lr_at(0, lr=1.0, schedule="wsd", total=10, decay=bad)
    with pytest.raises(ValueError, match="decay_steps must be in"):
        TrainConfig(steps=10, schedule="wsd")
    with pytest.raises(ValueError, match="decay_steps applies to schedule 'wsd' only"):
        TrainConfig(steps=10, schedule="constant", decay_steps=3)
    assert TrainConfig(steps=10, schedule="wsd", decay_steps=10).decay_steps == 10


# -- checkpoint pieces ------------------------------------------------------------------
def test_optimizer_state_round_trips_through_tensors_and_json():
    m = torch.nn.Linear(5, 3)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1, betas=(0.8, 0.9))
    for _ in range(3):
        m(torch.randn(4, 5)).square().sum().backward()
        opt.step()
    tensors, meta = flatten_optimizer(opt.state_dict())
    json.dumps(meta)  # JSON-ready
    assert set(tensors) == {f"state.{i}.{k}" for i in (0, 1) for k in ("step", "exp_avg", "exp_avg_sq")}
    m2 = torch.nn.Linear(5, 3)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=0.5)
    opt2.load_state_dict(unflatten_optimizer(tensors, json.loads(json.dumps(meta))))
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9) and opt2.param_groups[0]["lr"] == 0.1
    for k, v in opt.state_dict()["state"][1].items():
        torch.testing.assert_close(opt2.state_dict()["state"][1][k], v)


def test_rng_round_trip():
    import random

    import numpy as np

    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    tensors, meta = capture_rng()
    a = (torch.rand(3), random.random(), np.random.rand())
    torch.rand(5), random.random(), np.random.rand()
    restore_rng(tensors, json.loads(json.dumps(meta)))
    b = (torch.rand(3), random.random(), np.random.rand())
    torch.testing.assert_close(a[0], b[0])
    assert a[1:] == b[1:]


def test_checkpoint_round_trip_and_no_pickle(tmp_path):
    res = train(_spec(steps=6, save_every=3, model={"dropout": 0.1}), tmp_path, quiet=True)
    ckpt = res.checkpoint
    assert ckpt.name == "step_00000006" and (tmp_path / "latest").read_text().strip() == "checkpoints/step_00000006"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
    assert not any(p.name.startswith(".") for p in (tmp_path / "checkpoints").iterdir())  # no temp dirs left
    files = sorted(p.name for p in ckpt.iterdir())
    assert files == ["config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"]
    for f in ckpt.iterdir():  # nothing a pickle loader would be needed for
        assert not f.read_bytes().startswith(b"\x80")
    state, tensors = load_checkpoint(tmp_path)
    assert state["step"] == 6 and state["data_position"] == {"step": 6} and "rng.torch.0" in tensors
    from attnlab.models import from_pretrained

    loaded = from_pretrained(ckpt)
    for (name, p), q in zip(res.model.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)


# -- resume ---------------------------------------------------------------------------
def test_resume_matches_the_uninterrupted_run(tmp_path):
    kw = dict(steps=12, save_every=4, warmup=3, model={"dropout": 0.2, "attn_dropout": 0.1})
    straight = train(_spec(**kw), tmp_path / "a", quiet=True)
    part = train(_spec(**kw), tmp_path / "b", stop_at=6, quiet=True)  # killed after its step-6 checkpoint
    assert part.step == 6 and sorted(part.losses) == list(range(1, 7))
    rest = train(_spec(**kw), tmp_path / "b", resume=True, quiet=True)
    assert sorted(rest.losses) == list(range(7, 13))
    for s in range(1, 13):
        got = part.losses[s] if s <= 6 else rest.losses[s]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(straight.losses[s]), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(straight.model.state_dict().items(), rest.model.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    rec = [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if r["split"] == "train"]
    assert [s for s, _ in rec] == list(range(1, 13))  # the resumed run's file reads like the straight one


def test_resume_without_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="--resume needs a checkpoint"):
        train(_spec(steps=2), tmp_path, resume=True, quiet=True)
    train(_spec(steps=1), tmp_path, quiet=True)
    with pytest.raises(ValueError, match="checkpoint of task 'copy'"):
        train(_spec("reverse", steps=2), tmp_path, resume=True, quiet=True)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.safetensors", "trainer_state.json"])
def test_resume_falls_back_past_a_damaged_latest_checkpoint(tmp_path, capsys, damaged):
    """A truncated latest checkpoint costs one warning line and one save interval, not the run."""
    kw = dict(steps=12, save_every=4, warmup=3, opts={"length": 5}, model={**TINY, "dropout": 0.2},
              final_eval=True, eval_batches=2)
    straight = train(_spec(**kw), tmp_path / "a", quiet=True)
    train(_spec(**kw), tmp_path / "b", stop_at=8, quiet=True)  # killed after its second checkpoint
    ckpts = tmp_path / "b" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000004", "step_00000008"]
    _truncate(ckpts / "step_00000008" / damaged)
    capsys.readouterr()
    rest = train(_spec(**kw), tmp_path / "b", resume=True, quiet=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("attnlab train: warning: ") and f"step_00000008 is unreadable ({damaged} " in err[0]
    assert err[0].endswith(f"resuming from {ckpts / 'step_00000004'} at step 4")
    assert sorted(rest.losses) == list(range(5, 13))  # steps 5-8 are redone
    assert {s: rest.losses[s] for s in rest.losses} == {s: straight.losses[s] for s in range(5, 13)}  # exactly
    assert rest.metrics == straight.metrics and set(rest.metrics) == {"val", "test"}
    for (name, p), q in zip(straight.model.state_dict().items(), rest.model.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)
    rec = [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if r["split"] == "train"]
    assert rec == list(range(1, 13))  # the redone steps are not written twice


def test_resume_with_every_checkpoint_damaged_names_each(tmp_path):
    kw = dict(steps=8, save_every=2, opts={"length": 5}, model=dict(TINY))
    train(_spec(**kw), tmp_path, stop_at=4, quiet=True)
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step_{step:08d}" / "model.safetensors").write_bytes(b"")
    with pytest.raises(CorruptCheckpointError) as e:
        train(_spec(**kw), tmp_path, resume=True, quiet=True)
    msg = str(e.value)
    assert "holds no readable checkpoint" in msg and "\n" not in msg and msg.endswith("or pass another --out")
    assert "step_00000004 is unreadable (model.safetensors is empty (0 bytes)" in msg and "step_00000002" in msg


def test_damaged_latest_pointer_and_optimizer_file(tmp_path):
    train(_spec(steps=4, save_every=2, opts={"length": 5}, model=dict(TINY)), tmp_path, quiet=True)
    (tmp_path / "latest").write_bytes(b"\xff\x00garbage")  # the newest step directory is used instead
    assert latest_checkpoint(tmp_path).name == "step_00000004"
    assert [p.name for p in checkpoints(tmp_path)] == ["step_00000004", "step_00000002"]
    optim = tmp_path / "checkpoints" / "step_00000004" / "optimizer.safetensors"
    optim.write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match="optimizer.safetensors is empty") as e:
        load_checkpoint(tmp_path)
    assert e.value.path == optim and "re-save it or point to another checkpoint" in str(e.value)


@pytest.mark.slow
def test_sigkill_then_resume_matches(tmp_path):
    args = ["train", "copy", "--steps", "120", "--save-every", "10", "--log-every", "1", "--threads", "1",
            "--precision", "fp32", "--quiet", "--dropout", "0.1", "--task-opt", "length=6"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "attnlab.train.cli", *args]
    proc = subprocess.Popen([*cmd, "--out", str(tmp_path / "k")], env=env, stdout=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (tmp_path / "k" / "latest").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state, _ = load_checkpoint(tmp_path / "k")
    assert 0 < state["step"] < 120
    subprocess.run([*cmd, "--out", str(tmp_path / "k"), "--resume"], env=env, check=True, stdout=subprocess.DEVNULL)
    straight = train(_spec(steps=120, opts={"length": 6}, model={"dropout": 0.1}, final_eval=True, eval_batches=20),
                     tmp_path / "s", quiet=True)
    rec = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "k" / "metrics.jsonl") if r["split"] == "train"}
    assert sorted(rec) == list(range(1, 121))
    got = torch.tensor([rec[s] for s in range(1, 121)])
    torch.testing.assert_close(got, torch.tensor([straight.losses[s] for s in range(1, 121)]), rtol=1e-5, atol=1e-6)


# -- every task trains ----------------------------------------------------------------
def _pairs(directory: Path) -> None:
    words = [("ein", "a"), ("mann", "man"), ("hund", "dog"), ("frau", "woman"), ("rot", "red"), ("blau", "blue")]
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 300), ("val", 16), ("test", 16)):
        rows = [torch.randint(0, 6, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]
        (directory / f"{split}.de").write_text("\n".join(" ".join(words[i][0] for i in r) for r in rows) + "\n")
        (directory / f"{split}.en").write_text("\n".join(" ".join(words[i][1] for i in r) for r in rows) + "\n")


def _sentiment(directory: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    good, bad, filler = ["good", "great", "fine"], ["bad", "awful", "poor"], ["the", "food", "was", "service", "it"]
    rows = []
    for i in range(200):
        y = i % 2
        w = [filler[int(j)] for j in torch.randint(0, 5, (4,), generator=g)]
        w.insert(int(torch.randint(0, 4, (1,), generator=g)), (good if y else bad)[int(torch.randint(0, 3, (1,), generator=g))])
        rows.append(f"{' '.join(w)}\t{y}")
    (directory / "s.txt").write_text("\n".join(rows) + "\n")
    return directory / "s.txt"


TINY = {"dim": 32, "heads": 2, "layers": 1, "ff_dim": 64}


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "associative-recall", "listops", "chars", "translation",
                                  "sentiment", "digits"])
def test_each_task_trains(task, tmp_path):
    data, opts, model, kw = None, {}, dict(TINY), {"steps": 30, "warmup": 3, "batch_size": 16}
    if task in ("copy", "reverse", "sort"):
        opts = {"length": 5}
    elif task == "associative-recall":
        opts = {"pairs": 3, "keys": 4, "values": 4, "queries": 2, "val_size": 64}
    elif task == "listops":
        opts = {"train_size": 48, "val_size": 20, "test_size": 20, "min_length": 3, "max_length": 30, "max_depth": 3}
        kw["lr"], kw["steps"] = 3e-3, 40  # a small training set: the loss falls as it is learnt
    elif task == "chars":
        data = tmp_path / "t.txt"
        data.write_text("the cat sat on the mat. " * 80)
        opts = {"context": 16}
    elif task == "translation":
        _pairs(tmp_path)
        data, opts = tmp_path, {"test": "test", "vocab_size": 40, "eval_sentences": 8, "beams": 2}
        model.update(decoder_layers=1, dropout=0.0)
        kw["lr"], kw["warmup"] = 3e-3, 5
    elif task == "sentiment":
        data, kw["lr"], kw["steps"] = _sentiment(tmp_path), 1e-2, 40
        model["dropout"] = 0.0
    elif task == "digits":
        pytest.importorskip("sklearn")
        model.update(dim=32, dropout=0.0)
        kw["lr"], kw["steps"] = 1e-2, 40
    spec = _spec(task, None if data is None else str(data), opts, model, final_eval=True, **kw)
    res = train(spec, tmp_path / "run", quiet=True)
    _falls(res.losses)
    assert res.step == kw["steps"] and set(res.metrics) == ({"val"} if task == "chars" else {"val", "test"})
    assert all(math.isfinite(v) for v in res.metrics[max(res.metrics)].values())
    if task == "translation":
        assert 0.0 <= res.metrics["test"]["bleu"] <= 100.0 and res.metrics["test"]["beams"] == 2


def test_trainer_options_run(tmp_path):
    """Xavier init, label smoothing, attention penalties, activation checkpointing, bf16, inverse-sqrt."""
    base = dict(steps=4, warmup=1)
    r1 = train(_spec(init="xavier", label_smoothing=0.1, attn_penalty="entropy", attn_penalty_weight=0.01,
                     schedule="inverse_sqrt", model={"checkpointing": True, "dropout": 0.1}, **base), tmp_path / "a",
               quiet=True)
    r2 = train(_spec(attn_penalty="l2", attn_penalty_weight=0.1, precision="bf16", **base), tmp_path / "b", quiet=True)
    r3 = train(_spec(**base), tmp_path / "c", quiet=True)
    assert r1.step == r2.step == 4 and all(math.isfinite(v) for v in (*r1.losses.values(), *r2.losses.values()))
    assert r2.precision.startswith("bf16")
    assert not torch.equal(r1.model.decoder.layers[0].ff.fc1.weight, r3.model.decoder.layers[0].ff.fc1.weight)


def test_activation_checkpointing_gives_the_same_steps(tmp_path):
    a = train(_spec(steps=3, model={"checkpointing": True}), tmp_path / "a", quiet=True)
    b = train(_spec(steps=3), tmp_path / "b", quiet=True)
    for s in (1, 2, 3):
        torch.testing.assert_close(torch.tensor(a.losses[s]), torch.tensor(b.losses[s]), rtol=1e-5, atol=1e-6)


def test_time_budget_stops_early(tmp_path):
    res = train(_spec(steps=100000, time_budget=0.5), tmp_path, quiet=True)
    assert 0 < res.step < 100000 and (tmp_path / "latest").is_file()


def test_metrics_file_and_progress(tmp_path, capsys):
    spec = _spec(steps=4, eval_every=2, log_every=2, final_eval=True)
    spec.train["progress"] = True
    train(spec, tmp_path)
    err = capsys.readouterr().err
    assert "precision fp32" in err and "step 4/4" in err and "eta" in err and "it/s" in err
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["split"]) for r in recs] == [(2, "train"), (2, "val"), (4, "train"), (4, "val"), (4, "test")]
    assert json.loads((tmp_path / "run.json").read_text())["task"] == "copy"


def test_progress_eta_is_the_sooner_of_steps_and_time_budget(monkeypatch):
    import io

    from attnlab.train import progress as progress_mod

    clock = [100.0]
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: clock[0])
    unbounded = progress_mod.Progress(1000, stream=io.StringIO())
    bounded = progress_mod.Progress(1000, stream=io.StringIO(), time_budget=60.0)
    clock[0] += 10.0  # 10 steps in 10 s: 990 s left by steps, 50 s by the budget
    assert unbounded.line(9, 1.0).endswith("eta 16:30")
    assert bounded.line(9, 1.0).endswith("eta 0:50")
    clock[0] += 100.0  # past the budget: nothing left, never negative
    assert bounded.line(19, 1.0).endswith("eta 0:00")


def test_tensorboard_is_optional(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            train(_spec(steps=1, tensorboard=True), tmp_path, quiet=True)
    else:
        train(_spec(steps=2, tensorboard=True), tmp_path, quiet=True)
        assert any((tmp_path / "tensorboard").iterdir())


def test_auto_precision_on_cpu_measures_and_says_why():
    p, why = resolve_precision("auto", torch.device("cpu"), lambda: (False, "measured slower"))
    assert p == "fp32" and "measured slower" in why
    p, why = resolve_precision("auto", torch.device("cpu"), lambda: (True, "measured faster"))
    assert p == "bf16"
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        resolve_precision("fp16", torch.device("cpu"))


@pytest.mark.parametrize("capability,native,want", [((7, 5), False, "fp16"), ((7, 0), False, "fp16"),
                                                     ((8, 0), True, "bf16"), ((9, 0), True, "bf16")])
def test_auto_precision_on_cuda_needs_native_bf16(monkeypatch, capability, native, want):
    """``is_bf16_supported()`` counts emulation (True on a T4); auto must ask for native bf16."""
    asked = []

    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return native or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    p, why = resolve_precision("auto", torch.device("cuda", 0))
    assert p == want and f"{capability[0]}.{capability[1]}" in why
    assert asked == [False]
    assert resolve_precision("bf16", torch.device("cuda", 0)) == ("bf16", "requested")


def test_each_rank_restores_its_own_rng(tmp_path):
    """A checkpoint holds every rank's RNG; rank 1 gets rank 1's back, not rank 0's."""
    import random

    import numpy as np

    from attnlab.train.checkpoint import restore_rank_rng
    from attnlab.train.distributed import DistInfo

    states, draws = [], []
    for rank in (0, 1):
        torch.manual_seed(10 + rank)
        random.seed(20 + rank)
        np.random.seed(30 + rank)
        states.append(capture_rng())
        draws.append((torch.rand(3), random.random(), np.random.rand()))
    tensors = {"rng.torch.0": states[0][0]["rng.torch.0"], "rng.torch.1": states[1][0]["rng.torch.0"]}
    meta = {**states[0][1], "ranks": [states[0][1], states[1][1]]}
    for rank in (1, 0):
        restore_rank_rng(tensors, json.loads(json.dumps(meta)), DistInfo(rank=rank, world=2, local_rank=rank))
        got = (torch.rand(3), random.random(), np.random.rand())
        torch.testing.assert_close(got[0], draws[rank][0])
        assert got[1:] == draws[rank][1:]


def test_dist_timeout_setting_and_flag(tmp_path):
    assert TrainConfig.from_dict({"dist_timeout": 60.0}).dist_timeout == 60.0
    with pytest.raises(ValueError, match="dist_timeout must be positive"):
        TrainConfig.from_dict({"dist_timeout": -1.0})
    p = argparse.ArgumentParser()
    add_train_parsers(p.add_subparsers(dest="cmd"))
    spec = spec_from_args(p.parse_args(["train", "copy", "--dist-timeout", "30m"]))
    assert spec.train["dist_timeout"] == 1800.0


# -- bad options ----------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    ({"steps": 0}, "steps must be"), ({"schedule": "step"}, "schedule must be"), ({"precision": "fp8"}, "precision"),
    ({"label_smoothing": 1.5}, "label_smoothing"), ({"init": "he"}, "init must be one of"), ({"embed_std": -1.0}, "embed_std"), ({"lr": -1.0}, "lr > 0"),
    ({"attn_penalty": "kl"}, "attn_penalty"), ({"bogus": 1}, "unknown train settings"),
])
def test_bad_train_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(kw)


def test_bad_cli_values():
    assert parse_kv("dim=128,norm_first=false,positional=rotary", "--model") == {
        "dim": 128, "norm_first": False, "positional": "rotary"}
    assert parse_attention("local:window=8") == {"mechanism": "local", "mechanism_settings": {"window": 8}}
    with pytest.raises(ValueError, match="key=value"):
        parse_kv("dim128", "--model")
    assert parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    with pytest.raises(ValueError, match="time budget"):
        parse_duration("soon")


def _parser() -> argparse.ArgumentParser:
    from attnlab.viz.plots import plot_attention

    p = argparse.ArgumentParser(prog="attnlab")
    add_train_parsers(p.add_subparsers(dest="command", required=True), draw_map=plot_attention)
    return p


def test_cli_builds_the_run_spec(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "copy", "train": {"lr": 0.5, "steps": 9}, "model": {"dim": 48}}))
    args = _parser().parse_args(["train", "copy", "--config", str(cfg), "--steps", "3", "--model", "layers=3",
                                 "--attention", "exact:backend=math", "--positional", "rotary", "--dropout", "0.1",
                                 "--attn-penalty", "entropy:0.2", "--task-opt", "length=4", "--time-budget", "2m"])
    spec = spec_from_args(args)
    assert spec.train["lr"] == 0.5 and spec.train["steps"] == 3 and spec.train["time_budget"] == 120
    assert spec.model == {"dim": 48, "layers": 3, "mechanism": "exact", "mechanism_settings": {"backend": "math"},
                          "positional": "rotary", "dropout": 0.1}
    assert spec.train["attn_penalty"] == "entropy" and spec.train["attn_penalty_weight"] == 0.2
    assert spec.task_options == {"length": 4}


@pytest.mark.parametrize("argv,match", [
    (["train", "copy", "--model", "colour=1"], "unknown CausalLMConfig fields"),
    (["train", "copy", "--attention", "magic"], "mechanism must be one of"),
    (["train", "chars"], "run: attnlab data fetch tinyshakespeare"),
    (["train", "copy", "--batch-size", "0"], "batch_size must be"),
])
def test_cli_errors_exit_2_with_a_message(argv, match, tmp_path, capsys, no_data):
    args = _parser().parse_args([*argv, "--out", str(tmp_path), "--quiet"])
    assert run_command(args) == 2
    assert match in capsys.readouterr().err


def test_cli_train_generate_translate_evaluate(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be, that is the question. " * 40)
    p = _parser()
    small = ["--model", "dim=32,heads=2,layers=1", "--steps", "3", "--quiet", "--threads", "1", "--precision", "fp32"]
    args = p.parse_args(["train", "chars", "--data", str(text), "--out", str(tmp_path / "c"), *small,
                         "--task-opt", "context=16", "--eval-batches", "1"])
    assert args.func(args) == 0
    capsys.readouterr()
    args = p.parse_args(["generate", str(tmp_path / "c"), "--prompt", "to be", "--max-new-tokens", "40", "--seed", "1"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("to be") and len(out.rstrip("\n")) == 45
    args = p.parse_args(["generate", str(tmp_path / "c"), "--prompt", "Zebra"])
    assert run_command(args) == 2 and "outside the training vocabulary" in capsys.readouterr().err
    _pairs(tmp_path)
    args = p.parse_args(["train", "translation", "--data", str(tmp_path), "--out", str(tmp_path / "t"), *small,
                         "--task-opt", "test=test,vocab_size=40,eval_sentences=4,beams=2"])
    assert args.func(args) == 0
    capsys.readouterr()
    args = p.parse_args(["translate", str(tmp_path / "t"), "ein mann", "rot hund", "--beams", "2"])
    assert args.func(args) == 0
    assert len(capsys.readouterr().out.strip().split("\n")) == 2
    task, model, _ = load_run(tmp_path / "t")
    weights, src_toks, tgt_toks, text = task.alignment(model, "ein mann", beams=2)
    assert weights.shape == (len(tgt_toks), len(src_toks)) and src_toks[-1] == tgt_toks[-1] == "</s>"
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(tgt_toks)))
    assert text == task.translate(model, ["ein mann"], beams=2)[0]
    with pytest.raises(ValueError, match="layer must be in"):
        task.alignment(model, "ein mann", layer=5)
    if importlib.util.find_spec("matplotlib") is not None:
        png = tmp_path / "align.png"
        args = p.parse_args(["translate", str(tmp_path / "t"), "ein mann", "--beams", "2", "--alignment", str(png)])
        assert args.func(args) == 0 and png.read_bytes()[:4] == b"\x89PNG"
        assert capsys.readouterr().out.strip() == text
    args = p.parse_args(["translate", str(tmp_path / "t"), "ein", "mann", "--alignment", "x.png"])
    assert run_command(args) == 2 and "one sentence" in capsys.readouterr().err
    args = p.parse_args(["evaluate", str(tmp_path / "t"), "--split", "val"])
    assert args.func(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["step"] == 3 and "bleu" in res and res["split"] == "val"
    args = p.parse_args(["evaluate", str(tmp_path / "nothing")])
    assert run_command(args) == 2 and "checkpoint must be" in capsys.readouterr().err
