"""The moving-digits generator: balanced, exact motion, and a direction that lives in the frame order."""

from __future__ import annotations

import pytest
import torch

from attnlab.tasks import create_task
from attnlab.tasks.moving_digits import DIRECTIONS, estimate_direction, make_videos

# every test of this file runs on one xdist worker (scripts/test.sh: --dist loadgroup), which builds its fixture once
pytestmark = pytest.mark.xdist_group("test_moving_digits")


@pytest.fixture(scope="session")  # once per worker: a module fixture is rebuilt when the queue moves away and back
def task():
    t = create_task("moving-digits", seed=5, val_size=64, test_size=400)
    t.ensure_setup()
    return t


def test_directions_and_digits_are_balanced(task):
    for step in (0, 7):
        labels = task.train_batch(step, 48)["labels"]
        assert torch.bincount(labels, minlength=8).tolist() == [6] * 8  # a multiple of 8: exactly equal
    test = task.fixed["test"]
    assert torch.bincount(test["labels"], minlength=8).tolist() == [50] * 8
    counts = torch.bincount(test["digits"].flatten(), minlength=10)  # 400 videos x 64 digits
    assert int(counts.max() - counts.min()) <= 1
    labels = task.train_batch(3, 20)["labels"]  # not a multiple of 8: equal up to one
    counts = torch.bincount(labels, minlength=8)
    assert int(counts.max() - counts.min()) <= 1


def test_every_frame_is_the_last_one_moved_one_step():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(8, 30, 8, 8, generator=g)
    videos = make_videos(torch.arange(8), images, frames=5, canvas=12, speed=2, world=20, gen=g)  # (8, 5, 1, 12, 12)
    for label, (dr, dc) in enumerate(DIRECTIONS):
        # the pixels frame t + 1 shares with frame t are frame t's, 2 pixels further along the direction
        r0, r1, c0, c1 = max(0, 2 * dr), 12 + min(0, 2 * dr), max(0, 2 * dc), 12 + min(0, 2 * dc)
        torch.testing.assert_close(videos[label, 1:, :, r0:r1, c0:c1],
                                   videos[label, :-1, :, r0 - 2 * dr:r1 - 2 * dr, c0 - 2 * dc:c1 - 2 * dc],
                                   rtol=0, atol=0)
        assert not torch.equal(videos[label, 1], videos[label, 0])  # new pixels enter at an edge
    assert float(videos.amax()) <= 1.0 and float(videos.amin()) >= 0.0
    with pytest.raises(ValueError, match="world must be at least"):
        make_videos(torch.arange(8), images, frames=5, canvas=12, speed=2, world=19, gen=g)


def test_shuffling_the_frames_destroys_the_direction_signal(task):
    """Ordered frames give the direction away (an oracle reads it 100 %); shuffled, the same oracle calls the
    opposite direction as often as the true one: what is left is at most the axis of motion."""
    data = task.fixed["test"]
    videos, labels = data["videos"], data["labels"]
    assert float((estimate_direction(videos) == labels).float().mean()) == 1.0
    g = torch.Generator().manual_seed(0)
    order = torch.stack([torch.randperm(videos.shape[1], generator=g) for _ in range(len(labels))])
    pred = estimate_direction(videos[torch.arange(len(labels))[:, None], order])
    right = float((pred == labels).float().mean())
    opposite = float((pred == (labels + 4) % 8).float().mean())
    assert right <= 0.6 and abs(right - opposite) <= 0.1, (right, opposite)


def test_held_out_splits_use_other_digit_images(task):
    train = set(torch.cat([p for p in task.pools["train"][1]]).tolist())
    test = set(torch.cat([p for p in task.pools["test"][1]]).tolist())
    assert train and test and not train & test


@pytest.mark.parametrize("opts,words", [({"frames": 1}, "frames >= 2"), ({"canvas": 6}, "canvas"),
                                        ({"canvas": 15}, "divisible by patch_size"), ({"digits": 0}, "digits"),
                                        ({"frames": 30}, "world must be at least")])
def test_bad_options_are_named(opts, words):
    with pytest.raises(ValueError, match=words):
        create_task("moving-digits", **opts).ensure_setup()


def test_a_length_is_whole_frames_of_tokens():
    short = create_task("moving-digits", patch_size=4, val_size=8, test_size=8).at_length(3 * 16)
    assert short.options["frames"] == 3 and short.example_batch("val", 2)["videos"].shape[1] == 3
    with pytest.raises(ValueError, match="whole videos"):
        create_task("moving-digits", patch_size=4).at_length(40)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_a_model_for_t_frames_on_a_shorter_video_is_the_short_model(positional):
    """The curriculum's premise: the T=16 model on 8 frames computes what the same weights built for T=8 do."""
    from attnlab.train import build_model

    long, short = (create_task("moving-digits", frames=f, patch_size=4, val_size=8, test_size=8) for f in (16, 8))
    torch.manual_seed(0)
    big = build_model(long, {"attention": "divided", "positional": positional}).eval()
    small = build_model(short, {"attention": "divided", "positional": positional}).eval()
    weights = big.state_dict()
    if positional == "learned":
        weights["time_embed"] = weights["time_embed"][:8]
    small.load_state_dict(weights)
    videos = short.example_batch("val", 3)["videos"]
    torch.testing.assert_close(big(videos).logits, small(videos).logits)
    with pytest.raises(ValueError, match="1 <= t <= 16"):
        big(torch.zeros(1, 17, 1, 16, 16))


def test_a_t16_run_continued_from_a_t8_run_is_the_curriculum_from_scratch(tmp_path):
    """The arena's T = 16 rows: a T = 8 run's checkpoint, then the T = 16 phase, equals both phases from scratch."""
    from attnlab.train import RunSpec, train

    opts = {"patch_size": 4, "val_size": 16, "test_size": 16}
    common = {"batch_size": 8, "schedule": "constant", "lr": 2e-3, "warmup": 1, "precision": "fp32",
              "progress": False, "eval_every": 0, "final_splits": ["val"], "threads": 1}
    model, phases = {"attention": "divided"}, [[128, 3, 8], [256, 2, 8]]

    def run(name, frames, **train_):
        spec = RunSpec(task="moving-digits", task_options={**opts, "frames": frames}, model=model,
                       train={**common, **train_})
        return train(spec, tmp_path / name, quiet=True).model.state_dict()

    run("t8", 8, steps=3)
    continued = run("continued", 16, curriculum=phases, continue_from=str(tmp_path / "t8"))
    scratch = run("scratch", 16, curriculum=phases)
    for name, weight in scratch.items():
        torch.testing.assert_close(continued[name], weight, rtol=0, atol=0, msg=name)
