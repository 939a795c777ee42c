"""
Self-attention, step by step
============================

The first tutorial writes scaled dot-product attention as one line,

.. code-block:: text

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

and then computes it by hand in NumPy for three tokens of dimension four. This page
runs that computation as the tutorial wrote it, checks that :func:`attnlab.attention`
gives the same numbers, and then measures why the division by √d_k is there.

Each token's query ``Q`` asks "what am I looking for", each key ``K`` says "what do I
contain", and each value ``V`` is what a token hands over when it is looked at. The
weights ``softmax(Q Kᵀ / √d_k)`` say how much each query takes from each value; every
row of them sums to one.
"""

# %%
# The tutorial's computation
# --------------------------
# Three tokens, each a 4-dimensional embedding: the tutorial's ``X``. The projection
# matrices are random (training would learn them); we fix NumPy's seed so this page
# prints the same numbers every time it is built.

import numpy as np

np.random.seed(0)
X = np.array([[0.1, 0.2, 0.3, 0.4],
              [0.5, 0.6, 0.7, 0.8],
              [0.9, 1.0, 1.1, 1.2]])

W_q = np.random.randn(4, 4) * 0.1
W_k = np.random.randn(4, 4) * 0.1
W_v = np.random.randn(4, 4) * 0.1

Q = np.dot(X, W_q)  # [seq_len, d_k]
K = np.dot(X, W_k)  # [seq_len, d_k]
V = np.dot(X, W_v)  # [seq_len, d_v]

scores = np.dot(Q, K.T)  # [3, 3]: how well each query matches each key
d_k = K.shape[-1]
scaled_scores = scores / np.sqrt(d_k)
attention_weights = np.exp(scaled_scores) / np.sum(np.exp(scaled_scores), axis=1, keepdims=True)
output = np.dot(attention_weights, V)

np.set_printoptions(precision=5, suppress=True)
print("attention weights (rows: queries, columns: keys)\n", attention_weights)
print("row sums:", attention_weights.sum(axis=1))
print("output\n", output)

# %%
# The same with attnlab
# ---------------------
# :func:`attnlab.attention` takes tensors shaped ``(batch, heads, seq, head_dim)``, so the
# three tokens become a batch of one with one head. It scales by ``1/√d_k`` by default.
# We ask for the weights too (``return_weights=True``) and compare both with NumPy's.

import torch

import attnlab

q, k, v = (torch.from_numpy(a).view(1, 1, 3, 4) for a in (Q, K, V))  # (B=1, H=1, N=3, D=4), float64
out, weights = attnlab.attention(q, k, v, return_weights=True)

print("largest difference of the output: ", float((out[0, 0] - torch.from_numpy(output)).abs().max()))
print("largest difference of the weights:", float((weights[0, 0] - torch.from_numpy(attention_weights)).abs().max()))
torch.testing.assert_close(out[0, 0], torch.from_numpy(output))
torch.testing.assert_close(weights[0, 0], torch.from_numpy(attention_weights))

# %%
# attnlab chose a backend for this call. :func:`attnlab.explain` says which one and why
# the others were not taken; ``backend="reference"`` is attnlab's own NumPy float64
# oracle, the formula above written once more, against which every backend is tested.

for verdict in attnlab.explain(q, k, v, return_weights=True):
    status = "chosen" if verdict.chosen else ("serves" if verdict.serves else f"no: {verdict.reason}")
    print(f"{verdict.backend:>9}  {status}")
reference = attnlab.attention(q, k, v, backend="reference")
print("reference backend vs NumPy:", float((reference[0, 0] - torch.from_numpy(output)).abs().max()))

# %%
# The second tutorial also describes an *additive* score, ``v^T tanh(W_1 h_i + W_2 s)``
# (Bahdanau's attention), beside the dot product. It is :class:`attnlab.layers.AdditiveAttention`:
# one query ``s`` against a sequence of keys ``h_i``, with weights that again sum to one.

from attnlab.layers import AdditiveAttention

torch.manual_seed(0)
additive = AdditiveAttention(query_dim=4, key_dim=4, hidden_dim=8).double()
context, alpha = additive(torch.from_numpy(X[:1]), torch.from_numpy(X)[None])  # query (1, 4), keys (1, 3, 4)
print("additive weights:", alpha.detach().numpy().round(4), "sum", float(alpha.detach().sum()))

# %%
# Why divide by √d_k
# ------------------
# The tutorial's demonstration: a dot product of two random vectors with ``d_k``
# standard-normal entries has variance ``d_k``, so raw scores grow like √d_k while the
# scaled ones stay near unit size.

torch.manual_seed(0)
np.random.seed(0)
for d_k in [8, 64, 256, 1024]:
    Qv = np.random.randn(1, d_k)
    Kv = np.random.randn(1, d_k)
    score = np.dot(Qv, Kv.T)[0, 0]
    scaled_score = score / np.sqrt(d_k)
    print(f"d_k={d_k}: raw score={score:.1f}, scaled={scaled_score:.1f}")

# %%
# One score says little; what matters is what large scores do to softmax. We measure
# it: for each ``d_k``, 64 keys and 256 queries with standard-normal entries, the
# softmax of the raw scores and of the scaled ones. Three numbers per case:
#
# * the largest weight of a row (1.0 means the row put everything on one key),
# * the row's entropy divided by ``log(64)`` (1.0 is uniform, 0 is one key),
# * the size of the gradient that reaches the scores (what training has to learn from).
#
# A saturated softmax is one whose rows are one-hot: its gradient vanishes.

d_ks = [4, 16, 64, 256, 1024]
rows = []
for d_k in d_ks:
    qs, ks = torch.randn(256, d_k), torch.randn(64, d_k)
    for scaled in (False, True):
        s = (qs @ ks.T / (d_k**0.5 if scaled else 1.0)).requires_grad_()
        p = torch.softmax(s, dim=-1)
        (p * torch.randn_like(p)).sum().backward()  # a random upstream gradient
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1) / np.log(64)
        rows.append((d_k, scaled, float(p.max(-1).values.mean()), float(entropy.mean()), float(s.grad.norm(dim=-1).mean())))

print(f"{'d_k':>5} {'scores':>7} {'max weight':>11} {'entropy':>8} {'|grad|':>9}")
for d_k, scaled, top, ent, grad in rows:
    print(f"{d_k:>5} {'scaled' if scaled else 'raw':>7} {top:>11.3f} {ent:>8.3f} {grad:>9.2e}")

# %%
# The same table as a picture: without scaling, rows saturate as ``d_k`` grows and the
# gradient that reaches the scores shrinks towards zero; with scaling, both stay where
# they were at small ``d_k``.

import matplotlib.pyplot as plt

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
for scaled, style in ((False, "o-"), (True, "s--")):
    sel = [r for r in rows if r[1] == scaled]
    label = "scaled by 1/√d_k" if scaled else "raw scores"
    ax1.plot([r[0] for r in sel], [r[2] for r in sel], style, label=label)
    ax2.plot([r[0] for r in sel], [r[4] for r in sel], style, label=label)
ax1.set(xscale="log", xlabel="d_k", ylabel="mean largest weight of a row", title="softmax saturation")
ax2.set(xscale="log", yscale="log", xlabel="d_k", ylabel="mean gradient norm at the scores", title="gradient reaching the scores")
ax1.legend()
fig.tight_layout()
plt.show()

# %%
# That is the tutorial's argument measured: large dot products push softmax into the
# region where its gradient is tiny, and dividing by √d_k keeps the scores at the scale
# where softmax still learns. attnlab's ``scale=`` argument overrides the default
# ``1/√d_k`` if a model needs another one.
