"""Trainer options for full-batch tasks: Adam with the decay as an L2 penalty, and early stopping on the
validation loss that restores the best weights."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.command import run_command
from attnlab.tasks import tasks
from attnlab.train import RunSpec, TrainConfig, train
from attnlab.train.cli import add_train_parsers, spec_from_args


def _spec(**train_kw) -> RunSpec:
    tr = dict(precision="fp32", progress=False, log_every=1, threads=1, eval_batches=1, final_eval=True, steps=40,
              warmup=0, batch_size=8)
    tr.update(train_kw)
    return RunSpec(task="copy", task_options={"length": 5}, model={"dim": 16, "heads": 2, "layers": 1, "ff_dim": 32},
                   train=tr)


def test_early_stopping_restores_the_weights_of_the_best_evaluation(tmp_path, monkeypatch):
    losses = iter([3.0, 2.0, 2.5, 2.6, 2.7, 2.8, 2.9] + [9.0] * 100)  # best at the second evaluation (step 2)
    snapshots = {}
    cls = tasks()["copy"]
    real = cls.evaluate

    def scripted(self, model, split="val", **kw):
        m = real(self, model, split, **kw)
        if kw.get("final"):
            return m
        snapshots[len(snapshots) + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return {**m, "loss": next(losses)}

    monkeypatch.setattr(cls, "evaluate", scripted)
    res = train(_spec(eval_every=1, early_stopping_patience=3), tmp_path, quiet=True)
    assert res.step == 5 and res.best_step == 2  # evaluations 3, 4, 5 did not improve on the second
    for k, v in res.model.state_dict().items():
        assert torch.equal(v, snapshots[2][k]), k
    assert not all(torch.equal(v, snapshots[5][k]) for k, v in res.model.state_dict().items())
    assert json.loads((tmp_path / "result.json").read_text())["best_step"] == 2


def test_without_evaluations_early_stopping_never_triggers(tmp_path):
    res = train(_spec(steps=6, eval_every=0, early_stopping_patience=1), tmp_path, quiet=True)
    assert res.step == 6 and res.best_step is None


def test_adam_applies_the_decay_as_an_l2_penalty(tmp_path):
    from attnlab.train.trainer import _optimizer

    model = torch.nn.Linear(3, 2)
    opt = _optimizer(model, TrainConfig(optimizer="adam", weight_decay=0.1))
    assert type(opt) is torch.optim.Adam and opt.param_groups[0]["weight_decay"] == 0.1
    assert type(_optimizer(model, TrainConfig())) is torch.optim.AdamW
    a = train(_spec(steps=6, save_every=3, optimizer="adam", weight_decay=5e-4), tmp_path / "a", quiet=True)
    part = train(_spec(steps=6, save_every=3, optimizer="adam", weight_decay=5e-4), tmp_path / "b", stop_at=3, quiet=True)
    rest = train(_spec(steps=6, save_every=3, optimizer="adam", weight_decay=5e-4), tmp_path / "b", resume=True,
                 quiet=True)
    assert part.step == 3 and rest.step == 6
    for k, v in a.model.state_dict().items():  # the Adam moments resume as AdamW's do
        torch.testing.assert_close(rest.model.state_dict()[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw,match", [({"optimizer": "sgd"}, "optimizer must be one of"),
                                      ({"early_stopping_patience": -1}, "early_stopping_patience must be")])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(kw)


def test_cli_flags():
    import argparse

    p = argparse.ArgumentParser()
    add_train_parsers(p.add_subparsers(dest="command"))
    spec = spec_from_args(p.parse_args(["train", "copy", "--optimizer", "adam", "--early-stopping-patience", "7"]))
    assert spec.train["optimizer"] == "adam" and spec.train["early_stopping_patience"] == 7


def test_seeds_reports_the_mean_and_std_of_every_metric(tmp_path, capsys):
    import argparse
    import statistics

    from attnlab.train import train_seeds

    res = train_seeds(_spec(steps=3, seed=4), tmp_path / "s", 3, quiet=True)
    assert res.seeds == [4, 5, 6] and [r.out.name for r in res.runs] == ["seed-4", "seed-5", "seed-6"]
    acc = res.summary["test"]["accuracy"]
    assert acc["values"] == [r.metrics["test"]["accuracy"] for r in res.runs]
    assert acc["mean"] == pytest.approx(statistics.fmean(acc["values"]))
    assert acc["std"] == pytest.approx(statistics.stdev(acc["values"]))
    assert json.loads((tmp_path / "s" / "seeds.json").read_text())["seeds"] == [4, 5, 6]
    p = argparse.ArgumentParser()
    add_train_parsers(p.add_subparsers(dest="command"))
    args = p.parse_args(["train", "copy", "--seeds", "2", "--steps", "2", "--out", str(tmp_path / "c"), "--quiet",
                         "--threads", "1", "--precision", "fp32", "--task-opt", "length=4", "--model",
                         "dim=16,heads=2,layers=1,ff_dim=32", "--eval-batches", "1"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["seeds"] == [0, 1]
    assert "test accuracy" in captured.err and "+-" in captured.err and "(2 seeds: 0..1)" in captured.err
    args = p.parse_args(["train", "copy", "--seeds", "0", "--out", str(tmp_path / "d"), "--quiet"])
    assert run_command(args) == 2 and "seeds must be a positive int" in capsys.readouterr().err
