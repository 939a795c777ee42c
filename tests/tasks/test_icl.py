"""In-context regression: the prompts, the curriculum, the baselines against closed forms, the model's causality."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.models import InContextRegressor, RegressionConfig
from attnlab.models.regression import interleave
from attnlab.tasks import create_task
from attnlab.tasks.icl import BASELINES, baseline_predictions, draw_prompts, icl_curve


def test_prompts_are_linear_with_zeroed_coordinates_beyond_the_effective_dimension():
    g = torch.Generator().manual_seed(0)
    xs, ys = draw_prompts(g, 50, 6, 9, 4, noise=0.0)
    assert xs.shape == (50, 9, 6) and ys.shape == (50, 9)
    assert (xs[..., 4:] == 0).all()
    # every prompt's ys are exactly a linear function of its xs: least squares recovers it with no residual
    for p in range(5):
        w, res, rank, _ = np.linalg.lstsq(xs[p, :, :4].double().numpy(), ys[p].double().numpy(), rcond=None)
        assert rank == 4 and float(res[0]) < 1e-8


def test_curriculum_adds_a_dimension_and_two_pairs_every_interval():
    task = create_task("icl-linear", n_dims=8, points=20, start_dims=3, start_points=5, curriculum_every=10)
    assert [task.curriculum(s) for s in (0, 9, 10, 25, 10_000)] == [(3, 5), (3, 5), (4, 7), (5, 9), (8, 20)]
    b = task.train_batch(25, 4)
    assert b["xs"].shape == (4, 9, 8) and (b["xs"][..., 5:] == 0).all()
    assert create_task("icl-linear", n_dims=8, curriculum_every=0).curriculum(0) == (8, 24)  # points 0: 3d


def test_least_squares_and_ridge_equal_their_closed_forms():
    g = torch.Generator().manual_seed(1)
    xs, ys = draw_prompts(g, 3, 4, 12, 4, noise=0.5)
    x, y = xs.double().numpy(), ys.double().numpy()
    got = baseline_predictions(x, y, ridge=0.25)
    for p in range(3):
        for i in (2, 4, 11):  # underdetermined (minimum norm), square, overdetermined
            X = x[p, :i]
            w_ls = np.linalg.pinv(X) @ y[p, :i]
            w_ridge = np.linalg.inv(X.T @ X + 0.25 * np.eye(4)) @ X.T @ y[p, :i]
            np.testing.assert_allclose(got["least_squares"][p, i], x[p, i] @ w_ls, atol=1e-10)
            np.testing.assert_allclose(got["ridge"][p, i], x[p, i] @ w_ridge, atol=1e-10)
            np.testing.assert_allclose(got["averaging"][p, i], x[p, i] @ (X.T @ y[p, :i]) / i, atol=1e-10)
            near = np.argsort(np.linalg.norm(X - x[p, i], axis=1))[:3]
            np.testing.assert_allclose(got["nearest_3"][p, i], y[p, :i][near].mean(), atol=1e-10)
    assert all((got[name][:, 0] == 0).all() for name in BASELINES)  # no example: predict 0


def test_noiseless_least_squares_is_exact_from_d_examples():
    g = torch.Generator().manual_seed(2)
    xs, ys = draw_prompts(g, 20, 5, 10, 5, noise=0.0)
    ls = baseline_predictions(xs.double().numpy(), ys.double().numpy(), 0.01)["least_squares"]
    err = (ls - ys.double().numpy()) ** 2
    assert err[:, 5:].max() < 1e-8  # the prompts are float32 and err[:, 3].mean() > 0.1


def test_model_predicts_each_y_from_earlier_pairs_only():
    torch.manual_seed(0)
    model = InContextRegressor(RegressionConfig(n_dims=3, dim=16, heads=2, layers=2)).double().eval()
    xs, ys = torch.randn(2, 7, 3, dtype=torch.float64), torch.randn(2, 7, dtype=torch.float64)
    base = model(xs, ys).predictions
    for i in range(7):
        x2, y2 = xs.clone(), ys.clone()
        y2[:, i:] = 50 * torch.randn(2, 7 - i, dtype=torch.float64)  # y_i and everything after it
        x2[:, i + 1:] = 50 * torch.randn(2, 6 - i, 3, dtype=torch.float64)
        torch.testing.assert_close(model(x2, y2).predictions[:, : i + 1], base[:, : i + 1])


def test_interleave_layout():
    xs, ys = torch.arange(6.0).view(1, 2, 3), torch.tensor([[10.0, 20.0]])
    assert interleave(xs, ys).tolist() == [[[0, 0, 1, 2], [10, 0, 0, 0], [0, 3, 4, 5], [20, 0, 0, 0]]]


def test_bad_inputs_name_the_argument():
    model = InContextRegressor(RegressionConfig(n_dims=3, dim=16, heads=2, layers=1))
    with pytest.raises(ValueError, match="xs must have shape"):
        model(torch.randn(2, 5, 4), torch.randn(2, 5))
    with pytest.raises(ValueError, match="ys must have shape"):
        model(torch.randn(2, 5, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match="n_dims must be >= 1"):
        create_task("icl-linear", n_dims=0).model_config()


class _LeastSquares(torch.nn.Module):
    """A stand-in model that predicts with least squares on the earlier pairs (float64, torch)."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))

    def forward(self, xs, ys):
        out = torch.zeros_like(ys, dtype=torch.float64)
        for i in range(1, ys.shape[1]):
            w = torch.linalg.pinv(xs[:, :i].double()) @ ys[:, :i, None].double()  # (B, d, 1)
            out[:, i] = (xs[:, i : i + 1].double() @ w)[:, 0, 0]
        return type("Out", (), {"predictions": out})()


def test_curve_of_a_least_squares_model_equals_the_least_squares_baseline():
    task = create_task("icl-linear", n_dims=4, points=9, noise=0.5, eval_size=40)
    curve = icl_curve(_LeastSquares(), task)
    assert curve["examples"] == list(range(9)) and curve["prompts"] == 40 and curve["ridge_penalty"] == 0.25
    np.testing.assert_allclose(curve["transformer"], curve["least_squares"], rtol=1e-8, atol=1e-10)
    assert curve["averaging"][8] > curve["ridge"][8]
    # the zero predictor's error is mean(y^2) / d: the curves at 0 examples and the task's baseline
    assert curve["ridge"][0] == pytest.approx(float((task.example_batch("test", 40)["ys"][:, 0].double() ** 2).mean()) / 4)
    assert task.baseline("test") > 1.0
