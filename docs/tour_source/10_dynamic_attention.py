"""
Dynamic attention: patterns chosen by the input, the task and a reward
======================================================================

The second tutorial's outlook ends with three kinds of *dynamic* attention:

1. **conditional attention**, whose pattern adapts to the input;
2. **meta-learning attention**, which adapts quickly to a new task;
3. **attention steered by reinforcement learning**, whose allocation is optimized by a
   reward signal.

attnlab has one or two of each: top-k and adaptive-span attention
(:mod:`attnlab.mechanisms`), in-context linear regression (the ``icl-linear`` task and
:class:`attnlab.models.InContextRegressor`) and a recurrent attention model that learns
where to look with REINFORCE (:class:`attnlab.models.RecurrentAttention` on the
``cluttered-digits`` task). The :doc:`dynamic attention page <../dynamic>` describes them
and has their training runs, too long for this page. This page runs the parts that take
seconds: the masks, the windows, the baselines and the glimpses. The two models
here are untrained, and the page says so where it uses them.
"""

# %%
# 1. Conditional attention: top-k
# -------------------------------
# Top-k attention (Zhao et al., 2019) ranks each query's scores and keeps only its ``k``
# largest; every other key is masked out before the softmax. The mask is computed from
# ``q`` and ``k``, so every input gets its own pattern. On 12 tokens with ``k = 3``,
# :func:`attnlab.mechanisms.topk.topk_allowed` gives the kept keys and the mechanism gives the
# weights:

import torch

import attnlab
from attnlab import masks
from attnlab.mechanisms import create
from attnlab.mechanisms.topk import topk_allowed

torch.manual_seed(0)
N, D = 12, 16
q, k, v = torch.randn(3, 2, 1, N, D, dtype=torch.float64).unbind(0)  # two inputs, (2, 1, N, D) each
top3 = create("topk", k=3)
out, w = top3(q, k, v, None, return_weights=True)
kept = topk_allowed(q, k, v, 3)  # (2, 1, N, N) bool
_, w_exact = attnlab.attention(q, k, v, return_weights=True)
print("kept keys per query:", kept[0, 0].sum(-1).tolist())
print("weights sit only on kept keys:", bool((w[kept.logical_not()] == 0).all()),
      "| each row sums to", sorted({round(float(s), 12) for s in w.sum(-1).flatten()}))
same = (kept[0] == kept[1]).all(-1).sum()
print(f"queries whose kept keys are the same for input 0 and input 1: {int(same)} of {N}")

# %%
# At ``k = M`` nothing is dropped and top-k is exact attention; under a causal mask a
# query with fewer than ``k`` keys it may see keeps them all:

full = create("topk", k=N)(q, k, v, None)
print("k = M against exact attention, largest difference:", float((full - attnlab.attention(q, k, v)).abs().max()))
causal_kept = topk_allowed(q, k, v, 3, masks.causal())
print("kept keys per query under a causal mask:", causal_kept[0, 0].sum(-1).tolist())

# %%
# Exact attention spreads each row over every key; top-3 puts it on three, and which three
# depends on the input:

import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 3, figsize=(10, 3.5))
panels = [(w_exact[0, 0], "exact attention, input 0"), (w[0, 0], "top-3 weights, input 0"),
          (kept[1, 0].double(), "top-3 kept keys, input 1")]
for ax, (img, title) in zip(axes, panels):
    ax.imshow(img, cmap="viridis", vmin=0)
    ax.set(title=title, xlabel="key", ylabel="query")
fig.tight_layout()
plt.show()

# %%
# Top-k saves no work (every score is computed to rank them): what it changes is where the
# weight goes. It trains like any mechanism: ``attnlab train chars --attention topk:k=16``.
#
# 2. Conditional attention: a span each head learns
# -------------------------------------------------
# Adaptive attention span (Sukhbaatar et al., 2019) gives each head ``h`` of a causal
# layer a learned span ``z_h``. A key at distance ``x`` behind the query is weighted by the
# soft mask ``m_z(x) = clamp((R + z - x) / R, 0, 1)``: 1 up to the span, then a linear ramp
# of ``R`` positions down to 0 (:func:`attnlab.mechanisms.adaptive_span.span_mask`). The
# ramp is what lets the gradient reach ``z``; an L1 penalty on the spans pulls them down.

from attnlab.mechanisms.adaptive_span import span_mask

R = 32
x = torch.arange(0, 161, dtype=torch.float32)
fig, ax = plt.subplots(figsize=(6.5, 3))
for z in (0.0, 40.0, 100.0):
    ax.plot(x, span_mask(x, torch.tensor(z), R), label=f"span z = {z:g}")
ax.set(xlabel="distance back from the query, x", ylabel="m_z(x)", title=f"the soft mask (ramp R = {R})")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %%
# The mechanism keeps one span per head as the parameter ``fraction = z / max_span``. Its
# mask as a matrix, for three heads with different spans (``dense_bias`` is ``log m``, so
# ``exp`` gives ``m``):

span = create("adaptive-span", max_span=64, heads=3, ramp=8)
with torch.no_grad():
    span.fraction.copy_(torch.tensor([0.0, 0.125, 0.5]))
print("spans per head:", span.current_spans)
with torch.no_grad():
    m = span.dense_bias(64, 64, 3).exp()  # (1, 3, 64, 64)
fig, axes = plt.subplots(1, 3, figsize=(10, 3.5))
for h, ax in enumerate(axes):
    ax.imshow(m[0, h], cmap="viridis", vmin=0, vmax=1)
    ax.set(title=f"head {h}: span {span.current_spans[h]:g}, ramp {span.ramp}", xlabel="key", ylabel="query")
fig.tight_layout()
plt.show()

# %%
# **A short span is cheaper.** The call's mask is the causal mask ``&`` a sliding window of
# ``ceil(max_h z_h + R)`` keys, rounded up to a multiple of 64 (the native kernel's tile):
# every key a head may weight lies inside it, and the kernel (or ``chunked``) skips the tiles
# beyond. The window follows the longest span. The tiles of 64 x 64 the call walks at
# ``N = 1024``, out of the causal mask's:

N = 1024
span = create("adaptive-span", max_span=N, heads=4, ramp=R)
causal_tiles = int((masks.causal().block_kinds(N, N, 64, 64) != masks.EMPTY).sum())
for spans in ([1000.0, 0, 0, 0], [200.0, 10, 10, 10], [40.0, 10, 0, 0], [0.0, 0, 0, 0]):
    with torch.no_grad():
        span.fraction.copy_(torch.tensor(spans) / N)
    call_mask = span.call_mask(masks.causal(), N, N)
    tiles = int((call_mask.block_kinds(N, N, 64, 64) != masks.EMPTY).sum())
    print(f"spans {span.current_spans}: window {span.window(N)} keys, {tiles} of {causal_tiles} tiles")

# %%
# The window changes the work, not the result: with the spans of the last line, the
# mechanism's output equals exact causal attention with the bias ``log m`` over every key
# (the ``math`` backend, which materializes the ``N x N`` scores). Its forward time beside the
# same mechanism with spans that reach every key (median of 3 calls, on the machine that
# builds this page):

import timeit

import numpy as np


def median_s(fn):
    fn()  # warm-up
    return float(np.median(timeit.repeat(fn, number=1, repeat=3)))


q, k, v = torch.randn(3, 1, 4, N, 32).unbind(0)
span.eval()
wide = create("adaptive-span", max_span=N, heads=4, ramp=R, init=1.0).eval()
with torch.no_grad():
    short_out = span(q, k, v, masks.causal())
    reference = attnlab.attention(q, k, v, mask=masks.causal(), bias=span.dense_bias(N, N, 4), backend="math")
    print("short spans against the dense formula, largest difference:", float((short_out - reference).abs().max()))
    t_short = median_s(lambda: span(q, k, v, masks.causal()))
    t_wide = median_s(lambda: wide(q, k, v, masks.causal()))
print(f"forward, N = {N}: spans {span.current_spans} {1e3 * t_short:.1f} ms, "
      f"spans {wide.current_spans} {1e3 * t_wide:.1f} ms ({t_wide / t_short:.1f}x the short spans' time)")

# %%
# In a model, the spans are learned: ``attnlab train chars --attention adaptive-span`` logs
# every head's span in ``metrics.jsonl`` and :func:`attnlab.viz.plot_spans` draws them; the
# :doc:`dynamic page <../dynamic>` has a run at context 1,024 where most spans settle at 0.
#
# 3. Meta-learning attention: learning a function from the prompt
# ---------------------------------------------------------------
# "Adapting quickly to a new task" in its simplest measurable form (Garg et al., 2022): every
# prompt draws its own linear function ``w ~ N(0, I_d)`` and shows ``k`` examples
# ``(x_i, y_i = w . x_i + noise)``; a causal Transformer must predict each ``y_i`` from the
# pairs before it. Nothing about ``w`` can be stored in the weights: the model must fit it
# from the prompt, with no weight update. The ``icl-linear`` task generates the prompts; its
# 1,000 test prompts with ``noise = 1`` (``d = 8``, 24 pairs):

from attnlab.models.regression import interleave
from attnlab.tasks import create_task

task = create_task("icl-linear", noise=1.0)
prompts = task.example_batch("test", 1000)
xs, ys = prompts["xs"], prompts["ys"]  # (1000, 24, 8), (1000, 24)
print("xs", tuple(xs.shape), "ys", tuple(ys.shape))
tokens = interleave(xs[:1], ys[:1])  # (1, 48, 9): x_1, y_1, x_2, y_2, ...
print("the model reads", tuple(tokens.shape[1:]), "tokens: an x token is (0, x_i), a y token (y_i, 0, ..., 0)")
print(tokens[0, :2, :4])

# %%
# The model (:class:`attnlab.models.InContextRegressor`, the task's default: 4 layers of
# width 64) reads those tokens under a causal mask and predicts ``y_i`` at the token of
# ``x_i``. Untrained here, it already has the property the task relies on: changing ``y_i``
# and the pairs after it leaves the predictions of ``y_1 .. y_i`` as they were.

from attnlab.train import build_model

torch.manual_seed(0)
model = build_model(task, {}).eval()
with torch.no_grad():
    before = model(xs[:4], ys[:4]).predictions  # (4, 24)
    later = ys[:4].clone()
    later[:, 10:] += 5.0  # change y_11 (index 10) and everything after it
    after = model(xs[:4], later).predictions
print("predictions of y_1..y_11 moved by", float((after[:, :11] - before[:, :11]).abs().max()),
      "| of y_12..y_24 by", round(float((after[:, 11:] - before[:, 11:]).abs().max()), 3))

# %%
# **The baselines.** What a trained model is measured against: least squares (the
# minimum-norm fit of the examples so far), ridge (the Bayes-optimal predictor for these
# prompts), averaging (``w = mean y_j x_j``) and the mean ``y`` of the 3 nearest earlier
# examples, each computed in NumPy float64 by :func:`attnlab.tasks.icl.baseline_predictions`.
# Errors are squared errors divided by ``d``; predicting 0 scores ``(d + noise²) / d``.

from attnlab.tasks.icl import BASELINES, baseline_predictions

d = task.options["n_dims"]
y = ys.double().numpy()
preds = baseline_predictions(xs.double().numpy(), y, ridge=1.0)  # ridge penalty = the noise variance
curves = {name: ((p - y) ** 2).mean(0) / d for name, p in preds.items()}
labels = {"least_squares": "least squares", "ridge": "ridge", "averaging": "averaging",
          "nearest_3": "3-nearest neighbours"}
print("k    " + "".join(f"{labels[n]:>22}" for n in BASELINES))
for kk in (1, 4, d, 2 * d, 3 * d - 1):
    print(f"{kk:<4} " + "".join(f"{curves[n][kk]:>22.3f}" for n in BASELINES))
print(f"predicting 0: {task.baseline('test'):.3f}")

# %%
# Least squares' spike at ``k = d`` is the square system with noise: its fit is exact for
# the noisy examples and far from ``w``. Without noise least squares is exact from ``k = d``
# on, and there is nothing left to compare (200 noiseless prompts):

clean = create_task("icl-linear", eval_size=200).example_batch("test", 200)
yc = clean["ys"].double().numpy()
ls = baseline_predictions(clean["xs"].double().numpy(), yc, ridge=0.01)["least_squares"]
print("noiseless least squares, error at k = d - 1, d, d + 1:",
      [f"{e:.2e}" for e in (((ls - yc) ** 2).mean(0) / d)[d - 1:d + 2]])

# %%
# The trained Transformer's curve comes from a training run (12,000 steps of 64 prompts), not
# from this page. The :doc:`dynamic page <../dynamic>` has its table, made by these commands on
# the same 1,000 test prompts (the task's seed fixes them):
#
# .. code-block:: bash
#
#     attnlab train icl-linear --task-opt noise=1 --out runs/icl-linear
#     python scripts/icl_curve.py runs/icl-linear --png docs/dynamic/icl_curve.png
#
# This page reads that table and plots the recorded Transformer points beside the
# baselines computed above; the table's baseline columns should be the numbers computed here,
# to its 3 decimals.

from pathlib import Path

try:
    here = Path(__file__).resolve().parent
except NameError:  # sphinx-gallery runs the page from its own folder, without __file__
    here = Path.cwd()
lines = (here.parent / "dynamic.md").read_text().splitlines()
start = next(i for i, line in enumerate(lines) if line.startswith("| examples k | Transformer |"))
header = [c.strip() for c in lines[start].strip("|").split("|")]
recorded = []
for line in lines[start + 2:]:
    if not line.startswith("|"):
        break
    recorded.append([float(c) for c in line.strip("|").split("|")])
recorded = np.array(recorded)  # (rows, 1 + 5)
columns = {"least squares": "least_squares", "ridge": "ridge", "averaging": "averaging", "3-NN": "nearest_3"}
ks = recorded[:, 0].astype(int)
gap = max(abs(recorded[i, header.index(col)] - curves[name][kk]) for col, name in columns.items()
          for i, kk in enumerate(ks))
print(f"recorded table: k = {ks.tolist()}; largest difference of its baseline columns from the ones above: {gap:.4f}")

fig, ax = plt.subplots(figsize=(7, 4))
for name in BASELINES:
    ax.plot(range(len(curves[name])), curves[name], ls="--", lw=1.3, label=labels[name])
ax.plot(ks, recorded[:, header.index("Transformer")], "ko", label="Transformer (recorded run, dynamic page)")
ax.axhline(task.baseline("test"), color="gray", lw=0.8, ls=":", label="predicting 0")
ax.axvline(d, color="gray", lw=0.8, ls=":")
ax.set(yscale="log", xlabel="in-context examples k", ylabel="squared error / d",
       title=f"in-context linear regression, d = {d}, noise 1 ({len(y)} test prompts)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %%
# 4. Attention steered by a reward: glimpses
# ------------------------------------------
# The recurrent attention model (Mnih et al., 2014) never sees the whole image: it takes a
# few *glimpses*, each a stack of small patches around one location, and decides where to
# look next. The locations are samples from a Gaussian policy, so no gradient flows through
# them; the reward (1 when the final answer is right) trains the policy by REINFORCE.
#
# The ``cluttered-digits`` task generates its data from scikit-learn's bundled 8x8 digits:
# one digit on a 32 x 32 canvas among 8 fragments of other digits. Its first test canvas,
# with the digit's box from the task and an untrained model's six glimpses
# (:func:`attnlab.tasks.cluttered_digits.glimpse_paths`):

from attnlab.models.glimpse import glimpse_corners, glimpse_coverage, hybrid_loss, retina
from attnlab.tasks.cluttered_digits import glimpse_paths

digits = create_task("cluttered-digits")
torch.manual_seed(0)
ram = build_model(digits, {}).eval()  # untrained: RecurrentAttention with the task's defaults
cfg = ram.config
paths = glimpse_paths(ram, digits, "test", n=1)
canvas, corner = paths["images"][:1], paths["corners"][0]  # (1, 1, 32, 32), (row, col) of the digit
print(f"digit {int(paths['labels'][0])} at rows {int(corner[0])}..{int(corner[0]) + 7}, "
      f"columns {int(corner[1])}..{int(corner[1]) + 7}")
sides = [cfg.patch_size * 2 ** s for s in range(cfg.scales)]  # canvas pixels under each patch
print(f"glimpses: {cfg.glimpses} of {cfg.scales} patches of {cfg.patch_size} x {cfg.patch_size} "
      f"(covering {', '.join(map(str, sides))} pixels)")
print("the untrained model's locations (row, col in [-1, 1]):",
      [tuple(round(float(c), 2) for c in loc) for loc in paths["locations"][0]])
coverage = glimpse_coverage(paths["locations"], cfg.image_size, cfg.patch_size, cfg.scales)  # (1,)
fovea = glimpse_coverage(paths["locations"], cfg.image_size, cfg.patch_size, 1)  # the fine patches alone
print(f"its glimpses cover {float(coverage[0]):.0%} of the canvas, {float(fovea[0]):.0%} at full resolution")

# %%
# Untrained, every glimpse sits near the middle, where an untrained location network's
# ``tanh`` puts them (the task's model draws its first location from the policy too,
# ``start="learned"``; Mnih et al.'s first glimpse is at a random place). What the retina
# returns at three chosen locations: on the digit, at the centre of the canvas and near the
# top-right corner. Each glimpse is a fine patch (8 x 8 pixels as they are) and coarser ones
# (16 x 16 and 32 x 32 pixels averaged down to 8 x 8): from the centre, the coarsest sees the
# whole canvas at a quarter of its resolution, where the digit is a blob among the fragments:

from matplotlib.patches import Rectangle

S = cfg.image_size
centre = (corner.double() + 4) * 2 / S - 1  # the digit's centre in [-1, 1]
where = torch.stack([centre, torch.zeros(2, dtype=torch.float64), torch.tensor([-0.75, 0.75])]).float()  # (3, 2)
pixel = glimpse_corners(where, S)  # (3, 2) pixel corners
rho = retina(canvas.expand(3, -1, -1, -1), pixel, cfg.patch_size, cfg.scales)  # (3, scales, 1, 8, 8)
r0, c0 = (int(p) - cfg.patch_size // 2 for p in pixel[0])
print("fine patch on the digit is the plain crop:",
      torch.equal(rho[0, 0, 0], canvas[0, 0, r0:r0 + cfg.patch_size, c0:c0 + cfg.patch_size]))

fig = plt.figure(figsize=(10, 1.6 * max(cfg.scales, 2) + 0.8))
grid = fig.add_gridspec(cfg.scales, 5, width_ratios=[2.2, 0.15, 1, 1, 1])
ax = fig.add_subplot(grid[:, 0])
ax.imshow(canvas[0, 0], cmap="gray", vmin=0, vmax=1)
colours = ["tab:orange", "tab:green", "tab:red"]
for i, (r, c) in enumerate(pixel.tolist()):
    for side, lw in ((cfg.patch_size, 1.8), (cfg.largest_patch, 0.8)):
        ax.add_patch(Rectangle((c - side // 2 - 0.5, r - side // 2 - 0.5), side, side, fill=False,
                               ec=colours[i], lw=lw))
for r, c in glimpse_corners(paths["locations"][0], S).tolist():
    ax.plot(c - 0.5, r - 0.5, "x", color="yellow", ms=5)
ax.add_patch(Rectangle((int(corner[1]) - 0.5, int(corner[0]) - 0.5), 8, 8, fill=False, ec="cyan", ls="--", lw=1.2))
ax.set_xlim(-0.5, S - 0.5)
ax.set_ylim(S - 0.5, -0.5)
ax.set(title="test canvas: digit (dashed), 3 glimpses,\nuntrained model's locations (x)", xticks=[], yticks=[])
names = ["on the digit", "centre", "top-right"]
for i in range(3):
    for s in range(cfg.scales):
        a = fig.add_subplot(grid[s, 2 + i])
        a.imshow(rho[i, s, 0], cmap="gray", vmin=0, vmax=1)
        a.set_xticks([])
        a.set_yticks([])
        for spine in a.spines.values():
            spine.set_color(colours[i])
            spine.set_linewidth(2)
        if s == 0:
            a.set_title(names[i], fontsize=9)
        if i == 0:
            a.set_ylabel(f"{sides[s]} px" + (" (fine)" if s == 0 else ""), fontsize=9)
fig.tight_layout()
plt.show()

# %%
# **Where the reward enters.** :func:`attnlab.models.glimpse.hybrid_loss` adds to the
# classification loss the REINFORCE term ``-(R - b_t) log pi(l_t)`` and the baseline's
# squared error. The locations are samples, so the classification loss cannot reach the
# location network: its only gradient is the reward's (a tenth of which continues into the
# core, the task's ``policy_grad="all", core_grad=0.1``). One training batch of 64 canvases,
# the untrained model in training mode (sampled locations):

batch = digits.global_batch(step=digits.options["spread_steps"], batch_size=64)  # digits anywhere
ram.train()
for reinforce in (True, False):
    ram.zero_grad()
    out = ram(batch["images"], generator=torch.Generator().manual_seed(0))
    loss, parts = hybrid_loss(out, batch["labels"], reinforce=reinforce)
    loss.backward()
    g = ram.locate.weight.grad  # None: no gradient reached it
    print(f"reinforce={reinforce}: nll {float(parts['nll']):.3f}, reward (batch accuracy) "
          f"{float(parts['reward']):.3f}, gradient on the location network: "
          + ("none" if g is None else f"{float(g.norm()):.2e}"))

# %%
# With ``reinforce=False`` (the ``ram-random`` model's loss, which draws every location
# uniformly) nothing teaches the model where to look. Trained for 12,000 steps (or 36,000,
# ``--task-opt profile=long``), the learned policy finds the digit on most canvases and is
# far more accurate than the same model with random locations, which learns only what its
# random glimpses happen to show; the runs, their table and their glimpse paths are on the
# :doc:`dynamic page <../dynamic>`:
#
# .. code-block:: bash
#
#     attnlab train cluttered-digits --out runs/ram
#     attnlab train cluttered-digits --task-opt model=ram-random --out runs/ram-random
#     python scripts/glimpse_paths.py runs/ram runs/ram-random --png glimpses.png --hits
