"""The length curriculum: phases change the length, the model covers the longest, resume crosses phases exactly;
``init_from`` starts from another run's weights (the swap-in)."""

from __future__ import annotations

import pytest
import torch

from attnlab.train import RunSpec, TrainConfig, parse_curriculum, read_metrics, train
from attnlab.train.trainer import load_initial_weights

CURRICULUM = "16:4,32:4:2,64:4"


def _spec(**train_kw) -> RunSpec:
    tr = dict(precision="fp32", progress=False, log_every=1, threads=1, eval_batches=1, eval_batch_size=4,
              batch_size=4, final_eval=False, warmup=2)
    tr.update(train_kw)
    return RunSpec(task="mqar", task_options={"pairs": 3, "keys": 6, "val_size": 8},
                   model={"dim": 16, "heads": 2, "layers": 1, "ff_dim": 32, "positional": "rotary"}, train=tr)


def test_phases_change_the_length_and_the_batch(tmp_path):
    res = train(_spec(curriculum=CURRICULUM), tmp_path, quiet=True)
    assert res.step == 12
    assert [(p["length"], p["batch_size"], p["steps"]) for p in res.phases] == [(16, 4, 4), (32, 2, 4), (64, 4, 4)]
    # the trainer counts the tokens it trained on: steps x batch x length (MQAR counts every token)
    assert [p["items"] for p in res.phases] == [4 * 4 * 16, 4 * 2 * 32, 4 * 4 * 64]
    assert res.items == sum(p["items"] for p in res.phases)
    rec = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "phase"]
    assert [(r["step"], r["length"], r["batch_size"]) for r in rec] == [(0, 16, 4), (4, 32, 2), (8, 64, 4)]


def test_the_model_is_built_for_the_longest_phase(tmp_path):
    res = train(_spec(curriculum="16:2,512:1:1"), tmp_path, quiet=True)
    assert res.model.config.max_len >= 512 and res.model.config.positional == "rotary"
    with torch.no_grad():  # rotary and the positions cover every phase's length
        assert res.model(torch.ones(1, 511, dtype=torch.long)).logits.shape[1] == 511


def test_a_run_killed_in_phase_two_resumes_in_phase_two_and_equals_the_straight_run(tmp_path):
    straight = train(_spec(curriculum=CURRICULUM, save_every=2), tmp_path / "a", quiet=True)
    part = train(_spec(curriculum=CURRICULUM, save_every=2), tmp_path / "b", stop_at=6, quiet=True)
    assert part.step == 6 and [p["length"] for p in part.phases] == [16, 32]
    rest = train(_spec(curriculum=CURRICULUM, save_every=2), tmp_path / "b", resume=True, quiet=True)
    assert [(p["length"], p["steps"]) for p in rest.phases] == [(32, 2), (64, 4)]  # resumed inside phase 2
    for s in range(1, 13):
        got = part.losses[s] if s <= 6 else rest.losses[s]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(straight.losses[s]), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(straight.model.state_dict().items(), rest.model.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("curriculum,match", [
    ("64:10,32:10", "must increase"), ("64:10,64:10", "must increase"), ("0:10", "must be positive"),
    ("64:0", "must be positive"), ("64:10:0", "must be positive"), ("64", "LENGTH:STEPS"), ("a:b", "LENGTH:STEPS"),
    ([[64, 1.5]], "LENGTH:STEPS")])
def test_bad_curricula_are_refused(curriculum, match):
    with pytest.raises(ValueError, match=match):
        parse_curriculum(curriculum)


def test_steps_must_match_and_phases_must_fit_the_task(tmp_path):
    with pytest.raises(ValueError, match="must equal the curriculum's total"):
        TrainConfig(steps=5, curriculum="16:2,32:2")
    with pytest.raises(ValueError, match="beyond what task 'listops' supports"):
        train(RunSpec(task="listops", train={"curriculum": "64:1,9000:1", "progress": False}), tmp_path, quiet=True)
    with pytest.raises(ValueError, match="passkey needs length >="):  # the task's own check of a short phase
        train(RunSpec(task="passkey", data="x", task_options={"digits": 12},
                      train={"curriculum": "128:1,512:1", "progress": False}), tmp_path / "b", quiet=True)
    with pytest.raises(ValueError, match="has no sequence length"):
        train(RunSpec(task="digits", train={"curriculum": "16:1,32:1", "progress": False}), tmp_path / "c", quiet=True)


def test_the_cli_takes_a_curriculum(tmp_path, capsys):
    from attnlab.cli import main

    assert main(["train", "mqar", "--task-opt", "pairs=3,keys=6,val_size=8", "--model", "dim=16,heads=2,layers=1",
                 "--curriculum", "16:2,32:2:2", "--threads", "1", "--quiet", "--out", str(tmp_path)]) == 0
    assert '"step": 4' in capsys.readouterr().out
    assert main(["train", "mqar", "--curriculum", "64:1,32:1", "--quiet", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: curriculum lengths must increase") and err.count("\n") == 1


def _listops(**train_kw) -> RunSpec:
    tr = dict(precision="fp32", progress=False, threads=1, eval_batches=1, eval_batch_size=4, batch_size=4,
              final_eval=False, warmup=0)
    tr.update(train_kw)
    return RunSpec(task="listops", task_options={"train_size": 16, "val_size": 4, "test_size": 4, "min_length": 8,
                                                  "max_length": 40},
                   model={"dim": 16, "heads": 2, "layers": 1, "ff_dim": 32, "pooling": "mean"}, train=tr)


def test_init_from_starts_from_the_weights_and_keeps_a_mechanisms_own(tmp_path):
    base = train(_listops(steps=3), tmp_path / "exact", quiet=True)
    spec = _listops(steps=1, init_from=str(tmp_path / "exact"), lr=1e-12, min_lr=0.0)
    spec.model.update(mechanism="linformer", mechanism_settings={"k": 4, "max_len": 512})
    swapped = train(spec, tmp_path / "swap", quiet=True)
    theirs = swapped.model.state_dict()
    for name, p in base.model.state_dict().items():  # every trained weight arrived (one step of lr 1e-12 moved none)
        torch.testing.assert_close(theirs[name], p, rtol=0, atol=1e-9, msg=name)
    own = [n for n in theirs if n not in base.model.state_dict()]
    assert own and all("mechanism" in n for n in own)  # Linformer's projections: its own initialisation
    wide = _listops(steps=1)
    wide.model["dim"] = 32
    other = train(wide, tmp_path / "wide", quiet=True)
    with pytest.raises(ValueError, match="other shapes"):
        load_initial_weights(other.model, tmp_path / "exact")


def test_evaluations_during_training_run_at_the_length_trained_so_far(tmp_path):
    train(_spec(curriculum=CURRICULUM, eval_steps=[4, 8], eval_every=6, final_eval=True, final_splits=["test"]),
          tmp_path, quiet=True)
    recs = read_metrics(tmp_path / "metrics.jsonl")
    val = [(r["step"], r["length"]) for r in recs if r["split"] == "val"]
    assert val == [(4, 16), (6, 32), (8, 32)]  # the step that ends a phase is evaluated at that phase's length
    finals = [r["split"] for r in recs if r.get("final")]
    assert finals == ["test"]  # final_splits: no val pass that no one reads


def test_bad_eval_and_save_steps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="eval_steps must be below steps"):
        TrainConfig(steps=5, eval_steps=[5])
    with pytest.raises(ValueError, match="save_steps must be a positive int"):
        TrainConfig(steps=5, save_steps=[0])
    with pytest.raises(ValueError, match="eval_steps must be a list of step numbers"):
        TrainConfig(steps=5, eval_steps="3")
    with pytest.raises(ValueError, match="final_splits must be among the splits task 'mqar' evaluates"):
        train(_spec(steps=2, final_eval=True, final_splits=["dev"]), tmp_path, quiet=True)
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(init_from="a", continue_from="b")


def test_continue_from_another_runs_checkpoint_equals_the_straight_run(tmp_path):
    """A run that continues from step 8 of another (local attention whose window covers the first phases) trains
    exactly what the straight run would: the same losses and weights, with the short phases not trained again."""
    from attnlab.train.checkpoint import checkpoint_at

    window = {"mechanism": "local", "mechanism_settings": {"block_size": 32}}
    straight = train(RunSpec(**{**vars(_spec(curriculum=CURRICULUM)), "model": {**_spec().model, **window}}),
                     tmp_path / "straight", quiet=True)
    exact = train(_spec(curriculum=CURRICULUM, save_steps=[8], keep_checkpoints=0), tmp_path / "exact", quiet=True)
    cont = train(RunSpec(**{**vars(_spec(curriculum=CURRICULUM,
                                         continue_from=str(checkpoint_at(tmp_path / "exact", 8)))),
                            "model": {**_spec().model, **window}}), tmp_path / "cont", quiet=True)
    assert [(p["length"], p["steps"]) for p in cont.phases] == [(64, 4)]
    for s in range(1, 9):  # up to step 8 both computed exact attention (the window covers 16 and 32)
        torch.testing.assert_close(torch.tensor(exact.losses[s]), torch.tensor(straight.losses[s]), rtol=1e-4, atol=1e-5)
    for s in range(9, 13):
        torch.testing.assert_close(torch.tensor(cont.losses[s]), torch.tensor(straight.losses[s]), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="has no checkpoint of step 3"):
        checkpoint_at(tmp_path / "exact", 3)
    other = {"mechanism": "linformer", "mechanism_settings": {"k": 8, "max_len": 64}}
    with pytest.raises(ValueError, match="continue_from needs the same parameters"):
        train(RunSpec(**{**vars(_spec(curriculum=CURRICULUM, continue_from=str(tmp_path / "exact"))),
                         "model": {**_spec().model, **other}}), tmp_path / "bad", quiet=True)
