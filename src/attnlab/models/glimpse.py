"""A recurrent attention model: a few small glimpses, where to look learned with REINFORCE.

Mnih, Heess, Graves and Kavukcuoglu, 2014, "Recurrent Models of Visual Attention". The
model never sees the whole image. At step ``t`` it takes a glimpse at location
``l_t in [-1, 1]^2`` (``(row, col)``; ``-1`` the top or left edge, ``+1`` the bottom or
right), then decides where to look next:

* the **retina** (:func:`retina`) cuts ``scales`` square patches centred at ``l_t``, of
  ``P, 2P, 4P, ...`` canvas pixels, each averaged down to ``P x P`` (pixels beyond the canvas
  read 0, the background of the tasks that use it);
* the **glimpse network** mixes what was seen and where: ``g = relu(W_g relu(W_what rho) +
  W_l relu(W_where l))``;
* the **core** (a GRU, LSTM or plain RNN cell) updates its state ``h_t`` from ``g``;
* the **location network** gives the mean ``mu = tanh(W h_t)`` of a Gaussian policy with fixed
  standard deviation ``std`` (``locate_hidden > 0``: ``tanh(W relu(W' h_t))``); the next location
  is drawn from it and clamped to the canvas.
  The first location comes from the state before any glimpse (``h_0 = 0``): a learned
  starting point;
* a **baseline network** predicts the reward from ``h_t``; the **classifier** reads the
  class from the last state.

Locations are samples, not differentiable functions of the weights, so the location network
learns by REINFORCE (Williams, 1992): the reward ``R`` is 1 when the final class is right, and
:func:`hybrid_loss` adds ``-(R - b_t) log pi(l_t)`` summed over the glimpses (``b_t``
detached) to the classification NLL and the baseline's squared error. The location and
baseline networks read the core's state detached: the core and the glimpse network learn from
the classification gradient alone, the high-variance policy gradient trains only the location
head (``policy_grad="all"``: the policy gradient reaches the core and the glimpse network too,
scaled by ``core_grad``).
``policy="random"`` draws every location uniformly from ``[-1, 1]^2`` and trains without
REINFORCE: the same model, never taught where to look.

In eval mode the learned policy looks at its means (no sampling) and the random one draws from
the ``generator`` given (a fresh generator seeded 0 otherwise), so evaluation is a function of
the weights and the inputs.

Retina crops are integer crops: ``l`` is mapped to the pixel corner ``c = round((l + 1) S / 2)``
and a patch of side ``w`` covers pixels ``[c - w // 2, c - w // 2 + w)`` in each axis (exactly
the pixels plain slicing gives). :func:`glimpse_coverage` counts the canvas pixels under any
glimpse's largest patch (which contains its smaller ones).

Time per image O(G (scales P^2 glimpse_dim + dim^2) + sum_k (P 2^k)^2); memory O(B G dim).
Shape legend: ``B`` batch, ``C`` channels, ``S`` canvas side, ``P`` patch side, ``K`` scales,
``G`` glimpses, ``dim`` core width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from .common import check_images
from .config import GlimpseConfig
from .io import PretrainedMixin, register_model

__all__ = ["RecurrentAttention", "GlimpseOutput", "retina", "glimpse_corners", "glimpse_coverage", "hybrid_loss"]


def glimpse_corners(locations: Tensor, image_size: int) -> Tensor:
    """The pixel corners ``round((l + 1) S / 2)`` of locations ``(..., 2)`` in ``[-1, 1]``, int64 ``(..., 2)``."""
    return torch.round((locations.float().clamp(-1, 1) + 1) * (image_size / 2)).long()


def retina(images: Tensor, corners: Tensor, patch_size: int, scales: int) -> Tensor:
    """The glimpse's patches: ``scales`` squares centred at ``corners``, each averaged down to ``P x P``.

    Args:
        images: ``(B, C, S, S)``.
        corners: ``(B, 2)`` integer ``(row, col)`` pixel corners (:func:`glimpse_corners`), clamped to
            ``[0, S]``; patch ``k`` covers rows and columns ``[c - w // 2, c - w // 2 + w)`` with
            ``w = P 2^k``; pixels beyond the canvas read 0.
        patch_size: ``P``.
        scales: ``K``.

    Returns:
        ``(B, K, C, P, P)``: patch ``k`` is the ``w x w`` crop average-pooled by ``2^k``.
    """
    b, c, s, _ = images.shape
    widest = patch_size * 2 ** (scales - 1)
    padded = F.pad(images, (widest, widest, widest, widest))  # (B, C, S + 2w, S + 2w)
    batch = torch.arange(b, device=images.device)[:, None, None]
    out = []
    for k in range(scales):
        w = patch_size * 2 ** k
        start = corners.to(images.device).clamp(0, s) - w // 2 + widest  # (B, 2) in padded coordinates
        span = torch.arange(w, device=images.device)
        rows, cols = start[:, 0, None] + span, start[:, 1, None] + span  # (B, w) each
        crop = padded[batch, :, rows[:, :, None], cols[:, None, :]]  # (B, w, w, C)
        crop = crop.permute(0, 3, 1, 2)  # (B, C, w, w)
        out.append(F.avg_pool2d(crop, 2 ** k) if k else crop)  # (B, C, P, P)
    return torch.stack(out, dim=1)  # (B, K, C, P, P)


def glimpse_coverage(locations: Tensor, image_size: int, patch_size: int, scales: int) -> Tensor:
    """The fraction of the canvas under the union of the glimpses' largest patches, per image ``(B,)``.

    Args:
        locations: ``(B, G, 2)`` in ``[-1, 1]`` (what :class:`RecurrentAttention` returns).
        image_size, patch_size, scales: the model's ``S``, ``P`` and ``K``.
    """
    w = patch_size * 2 ** (scales - 1)
    start = glimpse_corners(locations, image_size) - w // 2  # (B, G, 2)
    pixels = torch.arange(image_size, device=locations.device)
    inside = (pixels >= start[..., None]) & (pixels < start[..., None] + w)  # (B, G, 2, S): rows, then columns
    covered = (inside[:, :, 0, :, None] & inside[:, :, 1, None, :]).any(1)  # (B, S, S)
    return covered.flatten(1).float().mean(1)


@dataclass
class GlimpseOutput:
    """What :class:`RecurrentAttention` returns.

    Attributes:
        logits: ``(B, num_classes)`` from the last state.
        locations: ``(B, G, 2)`` the glimpse locations in ``[-1, 1]``, ``(row, col)``, detached.
        log_probs: ``(B, G)`` ``log pi(l_t)`` under the policy (zeros for ``policy="random"``).
        baselines: ``(B, G)`` the baseline's prediction of the reward before each glimpse.
        attentions: always None (no attention weights; the trainer's interface).
    """

    logits: Tensor
    locations: Tensor
    log_probs: Tensor
    baselines: Tensor
    attentions: tuple[Tensor, ...] | None = None


def _what_network(c: GlimpseConfig) -> nn.Module:
    """The what pathway: the ``(B, K C, P, P)`` patches to ``(B, glimpse_dim)`` (before its ReLU).

    ``linear`` is Mnih et al.'s one layer on the flattened pixels; ``conv`` puts two 3x3
    convolutions of ``glimpse_dim / 4`` channels (ReLU) and a 2x2 max pool in front of it, so a
    digit that sits a few pixels off the patch's centre gives similar features.
    """
    if c.what == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(c.scales * c.channels * c.patch_size ** 2, c.glimpse_dim))
    width = max(1, c.glimpse_dim // 4)
    pooled = c.patch_size // 2 if c.patch_size >= 2 else 1
    return nn.Sequential(nn.Conv2d(c.scales * c.channels, width, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2) if c.patch_size >= 2 else nn.Identity(),  # (B, width, P / 2, P / 2)
                         nn.Flatten(), nn.Linear(width * pooled ** 2, c.glimpse_dim))


class _Core(nn.Module):
    """A GRU, LSTM or tanh RNN cell behind one interface: ``state -> (h, state)``."""

    def __init__(self, kind: str, dim: int):
        super().__init__()
        self.kind = kind
        cells = {"gru": nn.GRUCell, "lstm": nn.LSTMCell, "rnn": nn.RNNCell}
        self.cell = cells[kind](dim, dim)

    def forward(self, g: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        if self.kind == "lstm":
            h, c = self.cell(g, state)  # (B, dim) each
            return h, (h, c)
        h = self.cell(g, state[0])  # (B, dim)
        return h, (h,)


@register_model
class RecurrentAttention(PretrainedMixin, nn.Module):
    """Retina, glimpse network, recurrent core, Gaussian location policy, baseline and classifier.

    Args:
        config: a :class:`~attnlab.models.config.GlimpseConfig`.
    """

    config_class = GlimpseConfig

    def __init__(self, config: GlimpseConfig):
        self._keep_config(config)
        c = config
        self.what = _what_network(c)
        self.where = nn.Linear(2, c.glimpse_dim)
        self.what_out = nn.Linear(c.glimpse_dim, c.dim)
        self.where_out = nn.Linear(c.glimpse_dim, c.dim)
        self.core = _Core(c.core, c.dim)
        hidden = c.locate_hidden
        self.locate_in = nn.Sequential(nn.Linear(c.dim, hidden), nn.ReLU()) if hidden else nn.Identity()
        self.locate = nn.Linear(hidden or c.dim, 2)
        self.baseline = nn.Linear(c.dim, 1)
        self.classify = nn.Linear(c.dim, c.num_classes)

    def glimpse(self, images: Tensor, locations: Tensor) -> Tensor:
        """The glimpse vectors ``(B, dim)`` of ``images (B, C, S, S)`` at ``locations (B, 2)``."""
        c = self.config
        rho = retina(images, glimpse_corners(locations, c.image_size), c.patch_size, c.scales)  # (B, K, C, P, P)
        what = F.relu(self.what(rho.flatten(1, 2)))  # (B, glimpse_dim)
        where = F.relu(self.where(locations))  # (B, glimpse_dim)
        return F.relu(self.what_out(what) + self.where_out(where))  # (B, dim)

    def _next(self, h: Tensor, generator: torch.Generator | None, uniform: bool) -> tuple[Tensor, Tensor]:
        """The next location ``(B, 2)`` (detached, in ``[-1, 1]``) and its log-probability ``(B,)``
        (uniform: drawn uniformly, log-probability 0)."""
        c = self.config
        b = h.shape[0]
        if uniform:
            loc = torch.rand(b, 2, generator=generator) * 2 - 1  # drawn on the CPU: the generator's device
            return loc.to(h.device, h.dtype), h.new_zeros(b)
        if c.policy_grad == "all":  # the state's value, its gradient scaled by core_grad
            state = h if c.core_grad == 1.0 else h.detach() + c.core_grad * (h - h.detach())
        else:
            state = h.detach()
        mean = torch.tanh(self.locate(self.locate_in(state)))  # (B, 2)
        if self.training:
            noise = torch.randn(b, 2, generator=generator).to(h.device, h.dtype)
            sample = (mean + c.std * noise).detach()
        else:
            sample = mean.detach()
        log_prob = (-((sample - mean) ** 2) / (2 * c.std ** 2) - math.log(c.std * math.sqrt(2 * math.pi))).sum(-1)
        return sample.clamp(-1, 1), log_prob

    def forward(self, images: Tensor, *, generator: torch.Generator | None = None) -> GlimpseOutput:
        """Classify ``images (B, C, S, S)`` from ``G`` glimpses.

        Args:
            images: the canvases.
            generator: a CPU generator for the location draws (training samples and the random
                policy); None: the global RNG in training, a generator seeded 0 in eval.
        """
        c = self.config
        check_images(images, c.channels, c.image_size)
        b = images.shape[0]
        h = images.new_zeros(b, c.dim)
        state: tuple[Tensor, ...] = (h, h) if c.core == "lstm" else (h,)
        if generator is None and not self.training:
            generator = torch.Generator().manual_seed(0)  # one stream for all uniform draws of this call
        locations, log_probs, baselines = [], [], []
        for t in range(c.glimpses):
            if t == 0 and c.start == "center":  # a fixed place: no draw, no policy gradient
                loc, log_prob = h.new_zeros(b, 2), h.new_zeros(b)
            else:
                uniform = c.policy == "random" or (t == 0 and c.start == "random")
                loc, log_prob = self._next(h, generator if uniform or self.training else None, uniform)
            baselines.append(self.baseline(h.detach())[:, 0])  # (B,): the reward expected from here
            h, state = self.core(self.glimpse(images, loc), state)  # (B, dim)
            locations.append(loc)
            log_probs.append(log_prob)
        return GlimpseOutput(logits=self.classify(h), locations=torch.stack(locations, 1),
                             log_probs=torch.stack(log_probs, 1), baselines=torch.stack(baselines, 1))


def hybrid_loss(out: GlimpseOutput, labels: Tensor, *, label_smoothing: float = 0.0,
                reinforce: bool = True) -> tuple[Tensor, dict[str, Tensor]]:
    """The hybrid loss of Mnih et al.: classification NLL + REINFORCE + the baseline's squared error.

    The reward is ``R = 1`` when ``argmax logits`` is the label, else 0, for every glimpse of the
    image. The REINFORCE term is written ``-(R - b_t) (log pi_t - stopgrad(log pi_t))`` summed over
    the glimpses and averaged over the batch: 0 in value, ``-(R - b_t) grad log pi_t`` in gradient
    (``b_t`` detached). So the loss a run logs is the NLL plus the baseline's error, while the
    gradient is the hybrid one.

    Args:
        out: the model's output.
        labels: ``(B,)`` class ids.
        label_smoothing: of the classification cross-entropy.
        reinforce: False for ``policy="random"``: the NLL alone (no policy, nothing for a baseline to do).

    Returns:
        The loss and its parts (``nll``, ``baseline_mse``, ``reward``: the batch accuracy), detached.
    """
    nll = F.cross_entropy(out.logits.float(), labels, label_smoothing=label_smoothing)
    reward = (out.logits.detach().argmax(-1) == labels).float()  # (B,)
    parts = {"nll": nll.detach(), "reward": reward.mean()}
    if not reinforce:
        return nll, parts
    advantage = (reward[:, None] - out.baselines.detach()).float()  # (B, G)
    log_probs = out.log_probs.float()
    surrogate = -(advantage * (log_probs - log_probs.detach())).sum(1).mean()  # value 0, REINFORCE gradient
    mse = ((out.baselines.float() - reward[:, None]) ** 2).mean()
    parts["baseline_mse"] = mse.detach()
    return nll + surrogate + mse, parts
