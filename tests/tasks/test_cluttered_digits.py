"""The cluttered-digits generator and task: seeded, the digit whole on its canvas, unseen test digits, three models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.models import ConvClassifier, RecurrentAttention
from attnlab.tasks import create_task
from attnlab.tasks.cluttered_digits import (
    BATCH_SIZE,
    LEARNING_RATES,
    MODELS,
    PROFILES,
    ClutteredDigitsTask,
    glimpse_hits,
    glimpse_paths,
    make_canvases,
)
from attnlab.tasks.digits import load_digits

# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_cluttered_digits")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def task():
    t = create_task("cluttered-digits", seed=4, canvas=23, val_size=40, test_size=400)
    t.ensure_setup()
    return t


def test_canvases_are_a_function_of_the_seed(task):
    again = create_task("cluttered-digits", seed=4, canvas=23, val_size=40, test_size=400)
    for step in (0, 5):
        a, b = task.train_batch(step, 16), again.train_batch(step, 16)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(task.fixed["test"]["images"], again.fixed["test"]["images"])
    other = create_task("cluttered-digits", seed=5, canvas=23, val_size=40, test_size=400)
    assert not torch.equal(task.train_batch(0, 16)["images"], other.train_batch(0, 16)["images"])
    assert not torch.equal(task.train_batch(0, 16)["images"], task.train_batch(1, 16)["images"])


def test_the_digit_lies_whole_inside_its_canvas_and_clutter_only_brightens():
    g = torch.Generator().manual_seed(0)
    digits, sources = torch.rand(50, 8, 8, generator=g), torch.rand(50, 6, 8, 8, generator=g)
    canvases, corners = make_canvases(digits, sources, canvas=17, fragment=3, gen=g)
    assert canvases.shape == (50, 1, 17, 17) and float(canvases.min()) >= 0 and float(canvases.max()) <= 1
    assert int(corners.min()) >= 0 and int(corners.max()) <= 17 - 8
    for b in range(50):
        r, c = corners[b].tolist()
        under = canvases[b, 0, r:r + 8, c:c + 8]
        assert bool((under >= digits[b]).all())  # the brighter pixel wins: the digit is all there
    # without clutter the canvas is exactly the digit on black
    plain, at = make_canvases(digits[:3], sources[:3, :0], canvas=12, fragment=3, gen=g)
    for b in range(3):
        r, c = at[b].tolist()
        expect = torch.zeros(12, 12)
        expect[r:r + 8, c:c + 8] = digits[b]
        torch.testing.assert_close(plain[b, 0], expect, rtol=0, atol=0)
    # every clutter pixel is a pixel of one of the canvas's sources, none from elsewhere
    extra = canvases[:, 0].clone()
    for b in range(50):
        r, c = corners[b].tolist()
        extra[b, r:r + 8, c:c + 8] = 0
        values = set(sources[b].flatten().tolist()) | {0.0}
        assert set(extra[b].flatten().tolist()) <= values
    with pytest.raises(ValueError, match="canvas must be at least 8"):
        make_canvases(digits, sources, canvas=7, fragment=3, gen=g)


def test_test_canvases_show_digits_unseen_in_training_each_in_turn(task):
    pools = {k: set(v.tolist()) for k, v in task.pools.items()}
    assert not (pools["train"] & pools["test"]) and not (pools["train"] & pools["val"])
    assert sum(map(len, pools.values())) == 1797
    images, _ = load_digits()
    test = task.fixed["test"]
    for b in (0, 17, 399):  # the canvas's digit is a test image
        r, c = test["corners"][b].tolist()
        under = test["images"][b, 0, r:r + 8, c:c + 8]
        assert any(bool((under >= images[i, 0]).all()) for i in task.pools["test"].tolist())
    labels = test["labels"]
    assert task.baseline("test") == pytest.approx(float(torch.bincount(labels).max()) / 400)


@pytest.mark.parametrize("model,cls", [("ram", RecurrentAttention), ("ram-random", RecurrentAttention),
                                       ("cnn", ConvClassifier)])
def test_the_model_option_picks_the_model_and_a_tiny_run_learns(model, cls, tmp_path):
    from attnlab.train import RunSpec, train

    sizes = {"dim": 32, "glimpse_dim": 32, "patch_size": 4, "scales": 2, "what": "linear"} if model != "cnn" else {"dim": 8, "layers": 2}
    run = RunSpec(task="cluttered-digits", task_options={"model": model, "glimpses": 3, "canvas": 14, "clutter": 0,
                                                          "val_size": 32, "test_size": 32},
                  model=sizes, train={"steps": 40, "batch_size": 32, "seed": 0, "progress": False, "eval_every": 0,
                                      "lr": 3e-3, "warmup": 2, "log_every": 1, "save_every": 0, "threads": 1})
    res = train(run, str(tmp_path / "run"), quiet=True)
    assert isinstance(res.model, cls)
    assert res.model.config.image_size == 14
    if model != "cnn":
        assert res.model.config.glimpses == 3 and res.model.config.policy == (
            "learned" if model == "ram" else "random")
    losses = [res.losses[s] for s in sorted(res.losses)]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses
    test = res.metrics["test"]
    assert 0 <= test["accuracy"] <= 1 and (test["coverage"] == 1.0) == (model == "cnn")
    assert 0 < test["coverage"] <= 1


def test_samples_draw_that_many_rollouts_per_training_canvas_and_name_a_bad_value():
    from attnlab.models.glimpse import GlimpseConfig

    task = ClutteredDigitsTask(canvas=14, clutter=0, val_size=8, test_size=8, samples=3)
    task.ensure_setup()
    model = RecurrentAttention(GlimpseConfig(image_size=14, num_classes=10, glimpses=2, dim=16, glimpse_dim=16,
                                             patch_size=4))
    seen = []
    model.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    batch = task.global_batch(0, 5)
    model.train()
    loss, _ = task.loss(model, batch)
    assert torch.isfinite(loss) and seen[-1] == 15  # 3 rollouts of each of the 5 canvases
    model.eval()
    task.loss(model, batch)
    assert seen[-1] == 5  # evaluation: one
    with pytest.raises(ValueError, match="samples must be >= 1"):
        ClutteredDigitsTask(samples=0)
    with pytest.raises(ValueError, match="model 'ram-random' takes samples=1, got 2"):
        ClutteredDigitsTask(model="ram-random", samples=2)


def test_the_profile_sets_the_training_steps():
    from attnlab.train.config import RunSpec, resolve_train_config

    for profile, steps in PROFILES.items():
        task = ClutteredDigitsTask(profile=profile)
        assert resolve_train_config(task, RunSpec(task="cluttered-digits")).steps == steps
        assert resolve_train_config(task, RunSpec(task="cluttered-digits", train={"steps": 7})).steps == 7  # flags win
    assert ClutteredDigitsTask.train_defaults["steps"] == PROFILES["quick"]
    with pytest.raises(ValueError, match="profile must be one of"):
        ClutteredDigitsTask(profile="huge")


def test_each_model_trains_at_its_own_learning_rate_on_the_same_batches_and_the_flag_wins():
    from attnlab.train.config import RunSpec, resolve_train_config

    assert set(LEARNING_RATES) == set(MODELS)
    for model, lr in LEARNING_RATES.items():
        task = ClutteredDigitsTask(model=model, profile="long")
        cfg = resolve_train_config(task, RunSpec(task="cluttered-digits"))
        assert (cfg.lr, cfg.steps, cfg.batch_size) == (lr, PROFILES["long"], BATCH_SIZE)  # the same canvases
        assert resolve_train_config(task, RunSpec(task="cluttered-digits", train={"lr": 3e-4})).lr == 3e-4
    assert LEARNING_RATES["ram"] == LEARNING_RATES["ram-random"]  # the same model, the same training


def test_clutter_grows_over_clutter_steps():
    task = ClutteredDigitsTask(canvas=24, clutter=8, clutter_steps=100, spread_steps=0)
    task.ensure_setup()
    assert [task.clutter_at(s) for s in (0, 12, 50, 100, 500)] == [0, 1, 4, 8, 8]

    def spans(images):  # (B,) the larger side of the box around each canvas's lit pixels
        lit = images[:, 0] > 0  # (B, S, S)
        rows, cols = lit.any(2), lit.any(1)
        first = lambda m: m.float().argmax(1)  # noqa: E731
        last = lambda m: m.shape[1] - 1 - m.flip(1).float().argmax(1)  # noqa: E731
        return torch.maximum(last(rows) - first(rows), last(cols) - first(cols)) + 1

    assert int(spans(task.global_batch(0, 64)["images"]).max()) <= 8  # no fragments: only the 8 x 8 digit is lit
    assert float((spans(task.global_batch(100, 64)["images"]) > 8).float().mean()) > 0.5  # 8 fragments
    assert ClutteredDigitsTask(clutter=8, clutter_steps=0).clutter_at(0) == 8  # 0: all from the start
    with pytest.raises(ValueError, match="clutter_steps must be >= 0"):
        ClutteredDigitsTask(clutter_steps=-1)


def test_glimpse_paths_and_coverage_of_a_model(task):
    torch.manual_seed(0)
    from attnlab.train.trainer import build_model

    model = build_model(task, {"dim": 16, "glimpse_dim": 8}).eval()
    paths = glimpse_paths(model, task, "test", n=5)
    assert paths["locations"].shape == (5, 6, 2) and paths["images"].shape == (5, 1, 23, 23)
    metrics = task.evaluate(model, "test", batch_size=64, max_batches=2)
    assert set(metrics) == {"loss", "accuracy", "coverage", "fovea_coverage"} and 0 < metrics["coverage"] <= 1
    assert 0 < metrics["fovea_coverage"] < metrics["coverage"]  # the 8 x 8 fovea inside the 16 x 16 patch
    assert task.evaluate(model, "test", batch_size=64, max_batches=2) == metrics  # evaluation is deterministic
    with pytest.raises(ValueError, match="model must be one of"):
        create_task("cluttered-digits", model="vit")


def test_glimpse_hits_counts_glimpses_centred_on_the_digit(task):
    from attnlab.train.trainer import build_model

    torch.manual_seed(0)
    model = build_model(task, {"dim": 16, "glimpse_dim": 8}).eval()
    data = task._split("test")
    n, s = len(data["labels"]), model.config.image_size
    centre = (data["corners"] + 4).float()  # (n, 2) pixel corners of the digits' centres
    # a model whose glimpses all sit on the digit of the first half of the canvases and in a far corner elsewhere
    far = torch.where(centre < s / 2, torch.full_like(centre, s - 1.0), torch.zeros_like(centre))
    where = torch.where((torch.arange(n) < n // 2)[:, None], centre, far)  # (n, 2)
    locs = (where / (s / 2) - 1).clamp(-1, 1)[:, None].expand(n, model.config.glimpses, 2)

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config, self.inner = model.config, model

        def forward(self, images, generator=None):
            out = self.inner(images, generator=generator)
            i = Fixed.seen
            Fixed.seen += len(images)
            out.locations = locs[i:i + len(images)]
            return out

    Fixed.seen = 0
    hits = glimpse_hits(Fixed(), task, "test")
    assert hits["hit_rate"] == pytest.approx((n // 2) / n)
    assert hits["per_glimpse"] == [pytest.approx((n // 2) / n)] * model.config.glimpses
    right = (task.predict(model, "test")["logits"].argmax(-1) == data["labels"]).float()
    assert hits["accuracy_hit"] == pytest.approx(float(right[:n // 2].mean()))
    assert hits["accuracy_miss"] == pytest.approx(float(right[n // 2:].mean()))
    with pytest.raises(ValueError, match="within must be an int >= 0"):
        glimpse_hits(model, task, within=-1)


def test_the_glimpse_paths_script_prints_the_table_and_hits_and_draws(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from attnlab.train import RunSpec, train

    run = tmp_path / "ram"
    spec = RunSpec(task="cluttered-digits", task_options={"glimpses": 2, "canvas": 14, "clutter": 1, "val_size": 16,
                                                          "test_size": 16},
                   model={"dim": 16, "glimpse_dim": 8, "patch_size": 4},
                   train={"steps": 4, "batch_size": 8, "seed": 0, "progress": False, "eval_every": 0,
                          "save_every": 0, "threads": 1})
    train(spec, str(run), quiet=True)
    script = Path(__file__).resolve().parents[2] / "scripts" / "glimpse_paths.py"
    png = tmp_path / "paths.png"
    out = subprocess.run([sys.executable, str(script), str(run), "--table", "--hits", "--png", str(png), "-n", "2"],
                         capture_output=True, text=True, check=True).stdout
    result = json.loads((run / "result.json").read_text())["metrics"]["test"]
    row = next(line for line in out.splitlines() if line.startswith("| `ram` (ram)"))
    assert f"| {result['accuracy']:.1%} | ".replace("%", " %") in row and row.endswith("| 4 |")
    assert f"{result['fovea_coverage']:.1%}".replace("%", " %") in row
    assert "a glimpse within 2 px" in out and png.stat().st_size > 0
