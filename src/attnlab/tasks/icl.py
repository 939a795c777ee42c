"""In-context linear regression: learn a new linear function from the pairs in a prompt.

Garg, Tsipras, Liang and Valiant, 2022, "What Can Transformers Learn In-Context?". Every
prompt draws its own function ``w ~ N(0, I_d)`` and ``k`` inputs ``x_i ~ N(0, I_d)``, with
``y_i = w . x_i + noise * e_i`` (``e_i ~ N(0, 1)``; ``noise = 0`` by default, the paper's
noiseless prompts). The model (:class:`~attnlab.models.InContextRegressor`) predicts every
``y_i`` from the ``i`` pairs before it and ``x_i``; the loss is the mean squared error at
every y position. Nothing about ``w`` is in the weights: a trained model must infer it from
the prompt.

Curriculum (the paper's, scaled to a short run): training starts on ``start_dims``
effective dimensions (the other coordinates of ``x`` are zero) and ``start_points`` pairs,
and every ``curriculum_every`` steps adds one dimension and two pairs, up to ``n_dims`` and
``points``. The held-out splits are ``eval_size`` prompts at the full size.

Errors are reported as in the paper, normalized by ``d`` (the error of predicting 0 is
``(d + noise^2) / d``). :func:`icl_curve` gives the error against the number of in-context
examples for the model and for least squares, ridge, averaging and 3-nearest-neighbour
predictors computed in NumPy float64 on the same prompts.

Time per step O(layers (B k dim^2 + B H k^2 D)). Shape legend: ``B`` prompts, ``k`` pairs,
``d`` input dimension.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .base import Task, register_task, step_generator

__all__ = ["ICLLinearTask", "icl_curve", "baseline_predictions", "BASELINES"]

#: the predictors :func:`baseline_predictions` computes, in the order of the curve's legend
BASELINES = ("least_squares", "ridge", "averaging", "nearest_3")


def draw_prompts(g: torch.Generator, n: int, d: int, k: int, d_eff: int, noise: float) -> tuple[Tensor, Tensor]:
    """``n`` prompts: ``xs (n, k, d)`` (coordinates ``>= d_eff`` zero) and ``ys (n, k)``."""
    xs = torch.randn(n, k, d, generator=g)  # (n, k, d)
    w = torch.randn(n, d, 1, generator=g)  # (n, d, 1)
    xs[..., d_eff:] = 0.0
    ys = (xs @ w)[..., 0]  # (n, k)
    if noise > 0:
        ys = ys + noise * torch.randn(n, k, generator=g)
    return xs, ys


def baseline_predictions(xs: np.ndarray, ys: np.ndarray, ridge: float) -> dict[str, np.ndarray]:
    """Each baseline's prediction of ``y_i`` from pairs ``< i``, float64: name -> ``(n, k)``.

    * ``least_squares``: the minimum-norm least-squares fit (``np.linalg.lstsq``) of the
      ``i`` pairs; 0 with no pair.
    * ``ridge``: ``(X^T X + ridge I)^{-1} X^T y`` (the posterior mean when ``ridge`` is the
      noise variance: the Bayes-optimal predictor).
    * ``averaging``: ``w = mean_j y_j x_j`` (unbiased for ``x ~ N(0, I)``).
    * ``nearest_3``: the mean ``y`` of the 3 nearest earlier ``x`` (fewer when fewer exist).
    """
    n, k, d = xs.shape
    out = {name: np.zeros((n, k)) for name in BASELINES}
    eye = np.eye(d)
    for p in range(n):
        for i in range(1, k):
            X, y, x = xs[p, :i], ys[p, :i], xs[p, i]  # (i, d), (i,), (d,)
            out["least_squares"][p, i] = x @ np.linalg.lstsq(X, y, rcond=None)[0]
            out["ridge"][p, i] = x @ np.linalg.solve(X.T @ X + ridge * eye, X.T @ y)
            out["averaging"][p, i] = x @ (X * y[:, None]).mean(0)
            near = np.argsort(((X - x) ** 2).sum(-1), kind="stable")[:3]
            out["nearest_3"][p, i] = y[near].mean()
    return out


@register_task
class ICLLinearTask(Task):
    """Linear functions learned in context by a causal Transformer (:func:`icl_curve` for the curve).

    Options:
        n_dims: input dimension ``d`` (8 to 20 in the paper's range; any ``>= 1`` works).
        points: pairs per prompt ``k`` (0: ``3 * n_dims``).
        noise: standard deviation of the noise added to ``y`` (0: noiseless).
        start_dims, start_points, curriculum_every: the curriculum (``curriculum_every = 0``: none).
        eval_size: prompts in each held-out split.
    """

    name = "icl-linear"
    model_type = "InContextRegressor"
    attention_mask = "causal"
    score_metric = "error"
    lower_is_better = True
    item_unit = "prompt"
    option_defaults: dict[str, Any] = {"n_dims": 8, "points": 0, "noise": 0.0, "start_dims": 2, "start_points": 5,
                                       "curriculum_every": 300, "eval_size": 1000}
    model_defaults: dict[str, Any] = {"dim": 64, "heads": 4, "layers": 4, "ff_dim": 256, "max_len": 512}
    train_defaults: dict[str, Any] = {"steps": 12000, "batch_size": 64, "lr": 1e-3, "warmup": 200, "min_lr": 1e-4,
                                      "eval_every": 1000, "weight_decay": 0.0, "grad_clip": 1.0}

    @property
    def points(self) -> int:
        return self.options["points"] or 3 * self.options["n_dims"]

    def validate_options(self) -> None:
        o = self.options
        for key in ("n_dims", "start_dims", "start_points", "eval_size"):
            if o[key] < 1:
                raise ValueError(f"task icl-linear: {key} must be >= 1, got {o[key]}")
        if o["points"] < 0 or o["curriculum_every"] < 0 or o["noise"] < 0:
            raise ValueError(f"task icl-linear: points, curriculum_every and noise must be >= 0, got {o}")

    def model_config(self) -> dict[str, Any]:
        self.validate_options()
        return {"n_dims": self.options["n_dims"], "max_len": max(512, 2 * self.points)}

    def setup(self) -> None:
        self.validate_options()
        d, n, noise = self.options["n_dims"], self.options["eval_size"], self.options["noise"]
        self._splits = {split: draw_prompts(step_generator(self.seed, 0, stream=s), n, d, self.points, d, noise)
                        for split, s in (("val", 1), ("test", 2))}

    def curriculum(self, step: int) -> tuple[int, int]:
        """The effective dimension and the pairs per prompt at ``step``."""
        o = self.options
        d, k = o["n_dims"], self.points
        if o["curriculum_every"] == 0:
            return d, k
        i = step // o["curriculum_every"]
        return min(d, o["start_dims"] + i), min(k, o["start_points"] + 2 * i)

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        d_eff, k = self.curriculum(step)
        xs, ys = draw_prompts(step_generator(self.seed, step), batch_size, self.options["n_dims"], k, d_eff,
                              self.options["noise"])
        return {"xs": xs, "ys": ys}

    def example_batch(self, split: str, size: int) -> dict[str, Tensor]:
        xs, ys = self._split(split)
        return {"xs": xs[:size], "ys": ys[:size]}

    def _split(self, split: str) -> tuple[Tensor, Tensor]:
        self.ensure_setup()
        if split not in self._splits:
            raise ValueError(f"task icl-linear has the held-out splits 'val' and 'test', got {split!r}")
        return self._splits[split]

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        out = model(batch["xs"], batch["ys"], return_weights=return_weights)
        return ((out.predictions.float() - batch["ys"].float()) ** 2).mean(), out.attentions

    def baseline(self, split: str = "test") -> float | None:
        """The normalized error of predicting 0: ``mean(y^2) / d`` on ``split``."""
        return float((self._split(split)[1].double() ** 2).mean()) / self.options["n_dims"]

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str = "test", batch_size: int = 250) -> Tensor:
        """The model's predictions ``(n, k)`` of every ``y`` of the split's prompts."""
        xs, ys = self._split(split)
        device = next(model.parameters()).device
        return torch.cat([model(xs[i:i + batch_size].to(device), ys[i:i + batch_size].to(device)).predictions.cpu()
                          for i in range(0, len(ys), batch_size)])

    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 250,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        xs, ys = self._split(split)
        pred = self.predict(model, split, batch_size).double()
        sq = (pred - ys.double()) ** 2  # (n, k)
        d = self.options["n_dims"]
        return {"loss": float(sq.mean()), "error": float(sq.mean()) / d,
                f"error_at_{2 * d}": float(sq[:, min(2 * d, sq.shape[1] - 1)].mean()) / d}


def icl_curve(model: nn.Module, task: ICLLinearTask, split: str = "test", ridge: float | None = None) -> dict[str, Any]:
    """Normalized squared error against the number of in-context examples, model and baselines.

    Args:
        model: a trained :class:`~attnlab.models.InContextRegressor`.
        task: the task it was trained on (its ``split`` prompts are used, all of them).
        ridge: the ridge penalty (default: the noise variance, or 0.01 for noiseless prompts).

    Returns:
        dict: the keys ``examples`` (0 to k-1), ``transformer`` and one per name of ``BASELINES``
        (the curves), ``prompts``, ``n_dims``, ``noise`` and ``ridge_penalty``. Entry ``i`` of a
        curve is the mean over the prompts of ``(prediction of y_i - y_i)^2 / d`` from ``i`` examples.
    """
    xs, ys = task._split(split)
    d, noise = task.options["n_dims"], task.options["noise"]
    lam = ridge if ridge is not None else (noise ** 2 if noise > 0 else 0.01)
    y = ys.double().numpy()
    curves = {"transformer": task.predict(model, split).double().numpy(),
              **baseline_predictions(xs.double().numpy(), y, lam)}
    out: dict[str, Any] = {"examples": list(range(y.shape[1])), "prompts": int(y.shape[0]), "n_dims": d,
                           "noise": noise, "ridge_penalty": lam}
    for name, pred in curves.items():
        out[name] = (((pred - y) ** 2).mean(0) / d).tolist()
    return out
