"""The recurrent attention model: the retina's pixels, the coverage count, the policy gradient's sign."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from attnlab.models import ConvClassifier, ConvConfig, GlimpseConfig, RecurrentAttention
from attnlab.models.glimpse import glimpse_corners, glimpse_coverage, hybrid_loss, retina


def _crop(image: np.ndarray, top: int, left: int, w: int) -> np.ndarray:
    """``image (C, S, S)``'s ``w x w`` square at ``(top, left)`` by plain slicing, zeros beyond the edges."""
    c, s, _ = image.shape
    out = np.zeros((c, w, w))
    r0, r1, c0, c1 = max(top, 0), min(top + w, s), max(left, 0), min(left + w, s)
    if r0 < r1 and c0 < c1:
        out[:, r0 - top:r1 - top, c0 - left:c1 - left] = image[:, r0:r1, c0:c1]
    return out


def test_locations_map_to_pixel_corners_edges_included():
    locs = torch.tensor([[-1.0, 1.0], [0.0, 0.0], [1.0, -1.0], [-2.0, 3.0], [0.5, -0.5]])
    assert glimpse_corners(locs, 13).tolist() == [[0, 13], [6, 6], [13, 0], [0, 13], [10, 3]]  # 6.5, 9.75 round


@pytest.mark.parametrize("patch,scales", [(4, 3), (3, 2), (1, 1)])
def test_retina_extracts_exactly_the_sliced_pixels(patch, scales):
    g = torch.Generator().manual_seed(0)
    images = torch.rand(5, 2, 13, 13, generator=g, dtype=torch.float64)
    corners = torch.tensor([[6, 6], [0, 0], [13, 13], [2, 11], [-3, 15]])  # centre, corners, past the edges
    got = retina(images, corners, patch, scales)
    corners = corners.clamp(0, 13)  # what the retina does with corners beyond the canvas
    assert got.shape == (5, scales, 2, patch, patch)
    for b in range(5):
        for k in range(scales):
            w, f = patch * 2 ** k, 2 ** k
            crop = _crop(images[b].numpy(), int(corners[b, 0]) - w // 2, int(corners[b, 1]) - w // 2, w)
            pooled = crop.reshape(2, patch, f, patch, f).mean((2, 4))  # f x f blocks averaged
            torch.testing.assert_close(got[b, k], torch.from_numpy(pooled))


def test_coverage_equals_a_brute_force_count():
    g = torch.Generator().manual_seed(1)
    locs = torch.rand(6, 5, 2, generator=g) * 2.4 - 1.2  # some beyond the canvas: clamped to its edge
    locs[0] = 0.0  # five glimpses at one place: one patch
    s, patch, scales = 29, 3, 3  # largest patch 12 pixels
    got = glimpse_coverage(locs, s, patch, scales)
    corners = glimpse_corners(locs, s)
    for b in range(6):
        seen = np.zeros((s, s), dtype=bool)
        for t in range(5):
            top, left = int(corners[b, t, 0]) - 6, int(corners[b, t, 1]) - 6
            seen[max(top, 0):max(top + 12, 0), max(left, 0):max(left + 12, 0)] = True
        assert float(got[b]) == pytest.approx(seen.mean(), abs=1e-7)
    assert float(got[0]) == pytest.approx(144 / s ** 2)


def _model(**kw) -> RecurrentAttention:
    torch.manual_seed(0)
    cfg = GlimpseConfig(image_size=16, num_classes=3, patch_size=4, scales=2, glimpses=3, dim=16, glimpse_dim=8, **kw)
    return RecurrentAttention(cfg)


def test_the_policy_gradient_moves_the_locations_towards_the_reward():
    """A toy reward, 1 only when the first glimpse is on the right half: a few REINFORCE steps move the mean right."""
    model = _model(std=0.3, start="learned")
    images, labels = torch.rand(256, 1, 16, 16), torch.zeros(256, dtype=torch.long)
    opt = torch.optim.SGD(model.locate.parameters(), lr=0.05)

    def mean_col() -> float:
        return float(torch.tanh(model.locate.bias[1].detach()))  # the first location's mean (h_0 = 0)

    start = mean_col()
    for _ in range(20):
        out = model(images)
        right = out.locations[:, 0, 1] > 0
        toy = torch.where(right[:, None], torch.tensor([5.0, 0.0, 0.0]), torch.tensor([0.0, 5.0, 0.0]))
        loss, _ = hybrid_loss(dataclasses.replace(out, logits=toy), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert mean_col() > start + 0.2, (start, mean_col())


def test_the_random_policy_gets_no_policy_gradient_and_draws_uniform_locations():
    model = _model(policy="random")
    images, labels = torch.rand(64, 1, 16, 16), torch.randint(0, 3, (64,))
    out = model(images)
    assert float(out.log_probs.abs().sum()) == 0.0
    loss, parts = hybrid_loss(out, labels, reinforce=False)
    loss.backward()
    assert model.locate.weight.grad is None and model.locate.bias.grad is None
    assert model.baseline.weight.grad is None
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.what.parameters())
    assert float(loss.detach()) == pytest.approx(float(parts["nll"]))
    locs = out.locations.flatten(0, 1)  # (B G, 2)
    assert float(locs.min()) >= -1 and float(locs.max()) <= 1 and float(locs.std()) > 0.4  # uniform: std 0.577


def test_the_learned_policy_trains_locations_and_baseline_but_not_the_core_from_reinforce():
    model = _model()
    images, labels = torch.rand(32, 1, 16, 16), torch.randint(0, 3, (32,))
    out = model(images)
    loss, parts = hybrid_loss(out, labels)
    assert float(loss.detach()) == pytest.approx(float(parts["nll"] + parts["baseline_mse"]), rel=1e-6)  # REINFORCE: value 0
    # without the NLL, what is left (REINFORCE and the baseline's error) trains the location and baseline
    # networks and nothing else: they read the core's state detached
    (loss - torch.nn.functional.cross_entropy(out.logits, labels)).backward()
    assert float(model.locate.weight.grad.abs().sum()) > 0 and float(model.baseline.weight.grad.abs().sum()) > 0
    for part in (model.core, model.what, model.where, model.classify):
        assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in part.parameters()), part


def test_policy_grad_all_sends_the_reinforce_gradient_into_the_core_and_glimpse_network():
    torch.manual_seed(0)
    model = _model(policy_grad="all")
    images, labels = torch.rand(32, 1, 16, 16), torch.randint(0, 3, (32,))
    out = model(images)
    loss, _ = hybrid_loss(out, labels)
    (loss - torch.nn.functional.cross_entropy(out.logits, labels)).backward()  # REINFORCE and the baseline alone
    for part in (model.locate, model.core, model.what, model.where):
        assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in part.parameters()), part
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in model.classify.parameters())
    with pytest.raises(ValueError, match="policy_grad must be one of"):
        GlimpseConfig(image_size=8, num_classes=2, policy_grad="core")


def test_core_grad_scales_the_policy_gradient_into_the_core_alone():
    images, labels = torch.rand(32, 1, 16, 16), torch.randint(0, 3, (32,))
    grads = {}
    for scale in (1.0, 0.25):
        torch.manual_seed(0)
        model = _model(policy_grad="all", core_grad=scale)
        out = model(images, generator=torch.Generator().manual_seed(1))
        loss, _ = hybrid_loss(out, labels)
        (loss - torch.nn.functional.cross_entropy(out.logits, labels)).backward()  # REINFORCE and the baseline
        grads[scale] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for name, g in grads[1.0].items():
        want = g if name.startswith(("locate", "baseline")) else 0.25 * g  # the location network gets it whole
        torch.testing.assert_close(grads[0.25][name], want, rtol=1e-5, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match="only policy_grad='all' sends there"):
        GlimpseConfig(image_size=8, num_classes=2, core_grad=0.5)
    with pytest.raises(ValueError, match="core_grad"):
        GlimpseConfig(image_size=8, num_classes=2, policy_grad="all", core_grad=0.0)


def test_a_hidden_layer_in_the_location_network_learns_from_reinforce_alone():
    model = _model(locate_hidden=12)
    assert model.locate.in_features == 12 and "locate.weight" in model.state_dict()
    images, labels = torch.rand(32, 1, 16, 16), torch.randint(0, 3, (32,))
    out = model(images)
    loss, _ = hybrid_loss(out, labels)
    (loss - torch.nn.functional.cross_entropy(out.logits, labels)).backward()
    for part in (model.locate, model.locate_in):
        assert all(float(p.grad.abs().sum()) > 0 for p in part.parameters()), part
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in model.core.parameters())
    with pytest.raises(ValueError, match="locate_hidden must be an int >= 0"):
        GlimpseConfig(image_size=8, num_classes=2, locate_hidden=-1)
    assert not any(k.startswith("locate_in") for k in _model().state_dict())  # the default: no new weights


@pytest.mark.parametrize("policy", ["learned", "random"])
def test_a_center_start_puts_the_first_glimpse_at_the_centre_for_either_policy(policy):
    torch.manual_seed(0)
    model = RecurrentAttention(GlimpseConfig(image_size=16, num_classes=3, patch_size=4, scales=3, glimpses=3,
                                             dim=16, glimpse_dim=8, start="center", policy=policy))  # patches to 16
    images = torch.rand(6, 1, 16, 16)
    for train in (True, False):
        model.train(train)
        out = model(images)
        assert torch.equal(out.locations[:, 0], torch.zeros(6, 2))
        assert torch.equal(out.log_probs[:, 0].detach(), torch.zeros(6))  # no draw, nothing for REINFORCE
        assert not torch.equal(out.locations[:, 1], torch.zeros(6, 2))  # the later ones are drawn
    rho = retina(images, glimpse_corners(out.locations[:, 0], 16), 4, 3)  # (6, 3, 1, 4, 4)
    torch.testing.assert_close(rho[:, 2], torch.nn.functional.avg_pool2d(images, 4))  # all of it, coarsely
    with pytest.raises(ValueError, match="start must be one of"):
        GlimpseConfig(image_size=8, num_classes=2, start="middle")


@pytest.mark.parametrize("core", ["gru", "lstm", "rnn"])
def test_eval_is_deterministic_and_training_samples(core):
    model = _model(core=core)
    images = torch.rand(4, 1, 16, 16)
    model.eval()
    a, b = model(images), model(images)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.locations, b.locations)
    model.train()
    torch.manual_seed(1)
    c = model(images)
    assert not torch.equal(c.locations, a.locations)  # training draws around the means
    with pytest.raises(ValueError, match=r"images must have shape \(batch, 1, 16, 16\)"):
        model(torch.rand(4, 1, 15, 16))


def test_configs_name_the_bad_value():
    with pytest.raises(ValueError, match="policy must be one of"):
        GlimpseConfig(image_size=8, num_classes=2, policy="greedy")
    with pytest.raises(ValueError, match="std must be a positive number"):
        GlimpseConfig(image_size=8, num_classes=2, std=0.0)
    with pytest.raises(ValueError, match="image_size must be at least 2"):
        ConvConfig(image_size=2, num_classes=2, layers=3)
    assert ConvClassifier(ConvConfig(image_size=9, num_classes=4)).forward(torch.rand(2, 1, 9, 9)).logits.shape == (2, 4)
