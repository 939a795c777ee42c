"""
The efficient variants: what they keep, what they save
======================================================

Exact attention costs time proportional to ``N²``. Both tutorials list the variants
that cut it: **Linformer** (project keys and values to a few rows), **Reformer**
(hash similar queries and keys into buckets), **Performer** and **linear attention**
(replace softmax by a kernel of random or fixed features), **Longformer** (a sliding
window plus global tokens), and sparse patterns such as BigBird's. The first tutorial
ends with a claim: "these methods keep more than 90 % of the accuracy while cutting
the memory of long sequences 5-10x". attnlab has each of them behind one interface
(:mod:`attnlab.mechanisms`), and its arena (``attnlab bench tasks``) measures that
claim by training the same model with every mechanism.

This page shows the arena's answer in one plot, then measures on this build's machine
what each variant computes: how far its output is from exact attention, and its time.
"""

# %%
# The arena's answer
# ------------------
# The arena's standard profile trains a 2-layer model from scratch with each mechanism,
# with the same seed, data and length curriculum: multi-query associative recall (MQAR)
# at 512, 1,024 and 2,048 tokens, ListOps at 2,000, passkey retrieval at 2,048 and a
# character LM at 1,024. Those cases took 1 h 39 min on a 2-core CPU, too long to run
# while this site builds, so this page
# reads the table that run produced from the :doc:`benchmarks page <../benchmarks>`
# (command, machine and the full report are there) and plots it.

import re
from pathlib import Path

try:
    here = Path(__file__).resolve().parent
except NameError:  # sphinx-gallery runs the page from its own folder, without __file__
    here = Path.cwd()
benchmarks = (here.parent / "benchmarks.md").read_text()
header = next(line for line in benchmarks.splitlines()
              if line.startswith("| mechanism |") and ": score | vs exact | mem vs naive / lean" in line)
lines = benchmarks.splitlines()
rows = []
for line in lines[lines.index(header) + 2:]:
    if not line.startswith("|"):
        break
    rows.append([c.strip() for c in line.strip("|").split("|")])
tasks = [re.match(r"(\w+ \d+)", h.strip()).group(1) for h in header.strip("|").split("|")[1::3]]
print("tasks:", tasks)

arena = {}  # (mechanism, task) -> (score vs exact, memory vs lean exact)
for row in rows:
    name = row[0]
    for t, task in enumerate(tasks):
        ratio, mem = row[2 + 3 * t], row[3 + 3 * t]
        if ratio.endswith("%") and " / " in mem:
            arena[(name, task)] = (float(ratio[:-1]) / 100, float(mem.split(" / ")[1].rstrip("x")))
for (name, task), (ratio, mem) in sorted(arena.items()):
    print(f"{task:13} {name:11} score {ratio:5.0%} of exact's, memory {mem:.2f}x of exact (memory-lean kernel)")

# %%
# One point per mechanism and task: across, the peak training memory against exact
# attention through a memory-lean kernel; up, the score as a fraction of exact
# attention's. The tutorial's claim is the top-left region: at least 90 % of the score
# in a fifth of the memory or less.

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(9, 4.4))
markers = {task: "os^Dvp<>*"[i % 9] for i, task in enumerate(tasks)}  # one marker per task
names = sorted({n for n, _ in arena})
palette = plt.cm.tab20.colors  # one colour per mechanism, however many the table has
colors = {name: palette[i % len(palette)] for i, name in enumerate(names)}
for (name, task), (ratio, mem) in arena.items():
    ax.scatter(mem, ratio, marker=markers[task], color=colors[name], s=50)
for name in names:
    ax.scatter([], [], color=colors[name], label=name)
for task in tasks:
    ax.scatter([], [], marker=markers[task], edgecolors="black", facecolors="none", label=task)
ax.axhline(0.9, color="gray", ls=":", lw=1)
ax.axvspan(0, 0.2, color="green", alpha=0.08, label="the tutorial's claim")
ax.set(xlabel="peak training memory / exact attention's (memory-lean kernel)", ylabel="score / exact attention's",
       title="the arena, standard profile (recorded run)", xlim=(0, 1.05 * max(m for _, m in arena.values())))
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
fig.tight_layout()
plt.show()

inside = sorted(f"{n} on {t}" for (n, t), (r, m) in arena.items() if r >= 0.9 and m <= 0.2)
print(f"points in the claimed region: {len(inside)}", inside)

# %%
# Against exact attention computed by the naive
# formula that materializes ``N x N`` scores, the memory half of the claim holds (the
# benchmarks page has those ratios too), but a memory-lean exact kernel (SDPA, attnlab's
# ``chunked``) removes that term already; at these model sizes the weights, the
# optimizer and the layers outside attention dominate. On accuracy, the answer depends
# on the task: windowed and sparse mechanisms keep most of exact attention's ListOps
# score and lose recall (MQAR), which needs far-away keys.
#
# What each variant computes, measured now
# ----------------------------------------
# On the machine that builds this page: queries, keys and values of one layer at
# ``N = 2048`` (batch 1, 4 heads, head dimension 64) with some structure, as trained
# models have (each query close to a few keys), every mechanism at settings that make
# it approximate, its output's relative error against exact attention and its forward
# time (median of 3 calls).

import time

import numpy as np
import torch

import attnlab
from attnlab.mechanisms import create

torch.manual_seed(0)
N, H, D = 2048, 4, 64
centers = torch.randn(H, 32, D)
assign = torch.randint(0, 32, (H, N))
k = (centers.gather(1, assign[..., None].expand(H, N, D)) + 0.5 * torch.randn(H, N, D))[None]  # (1, H, N, D)
q = k + 0.3 * torch.randn_like(k)
v = torch.randn(1, H, N, D)
exact = attnlab.attention(q, k, v)

settings = {
    "linear": {}, "performer": {"features": 256}, "nystrom": {"num_landmarks": 64},
    "linformer": {"max_len": N, "k": 256}, "reformer": {"bucket_size": 64, "n_hashes": 2},
    "local": {"block_size": 256}, "longformer": {"window": 256}, "bigbird": {"block_size": 64},
}


def median_s(fn, repeats=3):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


with torch.no_grad():
    t_exact = median_s(lambda: attnlab.attention(q, k, v))
    measured = {}
    for name, st in settings.items():
        torch.manual_seed(0)
        mech = create(name, **st)
        out = mech(q, k, v, None)
        err = float((out - exact).abs().max() / exact.abs().max())
        measured[name] = (err, median_s(lambda: mech(q, k, v, None)))
print(f"exact attention (auto backend): {1e3 * t_exact:.1f} ms")
for name, (err, t) in sorted(measured.items(), key=lambda kv: kv[1][0]):
    print(f"{name:10} relative error {err:6.3f}   {1e3 * t:7.1f} ms ({t_exact / t:4.1f}x exact's speed)")

# %%
# Error against speed:

fig, ax = plt.subplots(figsize=(6.5, 3.8))
for name, (err, t) in measured.items():
    ax.scatter(t_exact / t, err, color=colors.get(name, "black"))
    ax.annotate(name, (t_exact / t, err), fontsize=8, xytext=(4, 2), textcoords="offset points")
ax.axvline(1.0, color="gray", ls=":", lw=1)
ax.set(xscale="log", xlabel="speed vs exact attention (forward, N = 2048)", ylabel="max relative error of the output",
       title="measured on this build's machine")
fig.tight_layout()
plt.show()

# %%
# Each mechanism is one argument away in a layer or a model
# (``MultiHeadAttention(..., mechanism=create("performer", features=128))``,
# ``attnlab train TASK --attention performer:features=128``), and
# ``attnlab view --compare performer:features=64`` shows its weights beside exact
# attention's on your own sentence. The arena with your tasks and budget:
# ``attnlab bench tasks --profile quick`` (minutes) or ``--profile standard``.
