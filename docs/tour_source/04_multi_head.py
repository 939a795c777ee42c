"""
Multi-head attention: the per-head loop and the fused layer
===========================================================

One attention head mixes values with one set of weights. Multi-head attention runs
several heads side by side, each on its own slice of the model dimension, so that one
head can follow position while another follows meaning (the heat map page found such
heads in MiniLM), and concatenates what they return. The second tutorial writes it in
PyTorch with a Python loop over the heads. This page runs that code, shows that
:class:`attnlab.layers.MultiHeadAttention` computes the same outputs once given the
same weights, and measures the speed difference of the loop and the fused call.
"""

# %%
# The tutorial's code
# -------------------
# Written as in the second tutorial: ``ScaledDotProductAttention`` on ``(batch, seq,
# d)`` tensors, and a ``MultiHeadAttention`` that projects, splits the heads, calls
# the single-head attention once per head in a loop, concatenates and projects back.

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.sqrt_dim = torch.sqrt(torch.tensor(d_model, dtype=torch.float32))

    def forward(self, Q, K, V):
        # Q, K, V: [batch_size, seq_len, d_model]
        scores = torch.bmm(Q, K.transpose(1, 2)) / self.sqrt_dim
        weights = F.softmax(scores, dim=-1)
        return torch.bmm(weights, V)


class TutorialMultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.d_head = d_model // num_heads
        self.num_heads = num_heads
        self.Wq = nn.Linear(d_model, d_model)
        self.Wk = nn.Linear(d_model, d_model)
        self.Wv = nn.Linear(d_model, d_model)
        self.Wo = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch_size, seq_len, _ = x.size()
        Q = self.Wq(x)  # [batch, seq_len, d_model]
        K = self.Wk(x)
        V = self.Wv(x)
        Q = Q.view(batch_size, seq_len, self.num_heads, self.d_head).transpose(1, 2)
        K = K.view(batch_size, seq_len, self.num_heads, self.d_head).transpose(1, 2)
        V = V.view(batch_size, seq_len, self.num_heads, self.d_head).transpose(1, 2)
        attn_outputs = []
        for i in range(self.num_heads):
            q, k, v = Q[:, i], K[:, i], V[:, i]
            attn = ScaledDotProductAttention(self.d_head)(q, k, v)
            attn_outputs.append(attn)
        concat = torch.cat(attn_outputs, dim=-1)
        return self.Wo(concat)


# %%
# attnlab's layer with the same weights
# -------------------------------------
# :class:`attnlab.layers.MultiHeadAttention` takes the arguments in
# ``torch.nn.MultiheadAttention``'s order (``embed_dim, num_heads``). Its projections are
# ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``: we copy the tutorial's four
# linear layers into them.

from attnlab.layers import MultiHeadAttention

torch.manual_seed(0)
d_model, num_heads = 512, 8
tutorial = TutorialMultiHeadAttention(d_model, num_heads).eval()
fused = MultiHeadAttention(d_model, num_heads).eval()
with torch.no_grad():
    for ours, theirs in ((fused.q_proj, tutorial.Wq), (fused.k_proj, tutorial.Wk),
                         (fused.v_proj, tutorial.Wv), (fused.out_proj, tutorial.Wo)):
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)

x = torch.randn(4, 256, d_model)  # (batch, seq, d_model)
with torch.no_grad():
    a, b = tutorial(x), fused(x)
print("output shapes:", tuple(a.shape), tuple(b.shape))
print("largest difference:", float((a - b).abs().max()))
torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

# %%
# Where the two differ is how the heads run. The loop launches one batched matrix
# product per head, a softmax per head, and allocates every head's ``N x N`` score
# matrix. attnlab's layer hands all heads to one :func:`attnlab.attention` call, which
# here picks PyTorch's fused SDPA kernel: one call for all heads, scores computed tile
# by tile, never the whole ``N x N`` matrix per head.

import attnlab

q = fused.q_proj(x).view(4, 256, num_heads, -1).transpose(1, 2)  # (B, H, N, D)
print("the backend attnlab picks for this call:", attnlab.choose_backend(q, q, q))

# %%
# The speed difference, measured
# ------------------------------
# Forward passes without gradients, batch 4, ``d_model`` 512, 8 heads, for two
# sequence lengths; each figure is the median of 5 timed calls after one warm-up, on the
# machine that built this page (its CPU and thread count are printed).

import time

import numpy as np


def median_ms(fn, repeats=5):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


from attnlab.utils import cpu_model

print(f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
lengths = [256, 1024]
results = []
with torch.no_grad():
    for n in lengths:
        xn = torch.randn(4, n, d_model)
        loop_ms = median_ms(lambda: tutorial(xn))
        fused_ms = median_ms(lambda: fused(xn))
        results.append((n, loop_ms, fused_ms))
        print(f"N={n:5}: per-head loop {loop_ms:8.1f} ms, attnlab fused {fused_ms:8.1f} ms, {loop_ms / fused_ms:4.1f}x")

# %%
# The same as a picture:

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.4))
xs = np.arange(len(lengths))
ax.bar(xs - 0.2, [r[1] for r in results], width=0.4, label="the tutorial's per-head loop")
ax.bar(xs + 0.2, [r[2] for r in results], width=0.4, label="attnlab MultiHeadAttention")
ax.set_xticks(xs, [f"N={n}" for n in lengths])
ax.set_ylabel("forward time, ms (median of 5)")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# Beyond the loop
# ---------------
# The fused layer has what the tutorial's does not: a ``mask=`` of any kind (see
# :doc:`03_masks`), ``return_weights=True`` for the per-head maps, grouped-query heads
# (``kv_heads=2``: fewer key/value heads than query heads, a smaller KV cache), a
# :class:`~attnlab.layers.KVCache` for decoding one token at a time, and a
# ``mechanism=`` to swap exact attention for an approximation (see
# :doc:`07_efficient_variants`).

gqa = MultiHeadAttention(d_model, num_heads, kv_heads=2)
y, w = gqa(x, mask=attnlab.masks.causal(), return_weights=True)
print("grouped-query output", tuple(y.shape), "weights per head", tuple(w.shape))
print("key/value projection size:", tuple(gqa.k_proj.weight.shape), "instead of", tuple(fused.k_proj.weight.shape))
