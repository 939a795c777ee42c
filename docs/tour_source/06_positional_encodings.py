"""
Positional encodings: sinusoidal, learned, rotary
=================================================

Self-attention has no notion of order: shuffle the tokens and each output is shuffled
with them, nothing else changes. Positions have to be put in. The first tutorial
writes the sinusoidal encoding of the original Transformer and a learned one, and
says the sinusoidal codes "can extrapolate to sequences longer than those seen in
training" while the learned ones cannot. This page draws the sinusoidal codes, checks
attnlab's against the tutorial's, and then measures the extrapolation claim by
training three small models, one per encoding (rotary, the encoding most recent
models use, is the third).
"""

# %%
# The tutorial's sinusoidal encoding
# ----------------------------------
# Even dimensions hold ``sin(p · w_i)``, odd ones ``cos(p · w_i)``, with frequencies
# ``w_i = 10000^(-2i/d_model)`` falling from 1 to 1/10000 across the dimensions.

import math

import torch
import torch.nn as nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


# %%
# attnlab's :class:`~attnlab.positional.SinusoidalPositional` computes the same codes
# (in float64, then cast), for any length without a ``max_len``:

from attnlab.positional import SinusoidalPositional, sinusoidal_table

x = torch.zeros(1, 100, 64)
theirs = PositionalEncoding(64)(x)
ours = SinusoidalPositional(64)(x)
print("largest difference:", float((theirs - ours).abs().max()))

# %%
# The picture of the table: each row a position, each column a dimension. Low
# dimensions change fast with position, high ones slowly, like the hands of a clock.

import matplotlib.pyplot as plt

table = sinusoidal_table(torch.arange(100), 64)  # (positions, dims)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.4, 1]})
im = ax1.imshow(table.T.numpy(), aspect="auto", cmap="RdBu", origin="lower")
ax1.set(xlabel="position", ylabel="dimension", title="sinusoidal codes, d_model = 64")
fig.colorbar(im, ax=ax1)
for d in (0, 8, 16, 32):
    ax2.plot(table[:, d].numpy(), label=f"dimension {d}")
ax2.set(xlabel="position", title="a few dimensions")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %%
# The tutorial lists three properties. Each position has its own code; and the code
# of position ``p + k`` is a fixed linear map (a rotation of each sin/cos pair by
# ``k · w_i``) of the code of ``p``, the same map for every ``p``. We check the second
# numerically for ``k = 5``:

k = 5
w = torch.exp(torch.arange(0, 64, 2, dtype=torch.float64) * (-math.log(10000.0) / 64))  # (32,) frequencies
cos, sin = torch.cos(k * w), torch.sin(k * w)
p = sinusoidal_table(torch.arange(100), 64)
s, c = p[:, 0::2], p[:, 1::2]
shifted = torch.stack([s * cos + c * sin, c * cos - s * sin], dim=-1).flatten(1)  # rotate each (sin, cos) pair
print("codes of p+5 from codes of p, largest error:", float((shifted[:-k] - p[k:]).abs().max()))
distinct = torch.cdist(p, p) + torch.eye(100) * 1e9
print("smallest distance between the codes of two different positions:", float(distinct.min()))

# %%
# The third property, extrapolation, is the one worth measuring.
#
# Learned against sinusoidal against rotary, measured
# ---------------------------------------------------
# A task that needs positions: each output token is the input token three positions
# back (a causal model must find "three to the left"). We train three small GPT-style
# :class:`~attnlab.models.CausalLM` models (2 layers, width 64, 4 heads) that differ only
# in their positional encoding, on sequences of 64 tokens, for a fixed budget of 600
# steps each (batch 32, AdamW, learning rate 3e-3, the same seed), and then test them
# on sequences of 64, 128, 256 and 512 tokens.
#
# * ``learned``: :class:`~attnlab.positional.LearnedPositional`, one trained vector per
#   position; positions past 64 are never trained.
# * ``sinusoidal``: the codes above, added to the embeddings.
# * ``rotary``: :class:`~attnlab.positional.RotaryEmbedding` rotates queries and keys by
#   their positions, so scores depend only on the distance between them.

import time

import torch.nn.functional as F

from attnlab.models import CausalLM, CausalLMConfig

VOCAB, SHIFT, TRAIN_LEN, STEPS = 16, 3, 64, 600


def shift_batch(n, batch, generator):
    """Tokens 1..15; the target at position i is the token at i - 3 (0, ignored, for the first three)."""
    x = torch.randint(1, VOCAB, (batch, n), generator=generator)
    y = torch.roll(x, SHIFT, dims=1)
    y[:, :SHIFT] = 0
    return x, y


def train(positional):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    cfg = CausalLMConfig(vocab_size=VOCAB, dim=64, heads=4, layers=2, max_len=512, positional=positional,
                         scale_embeddings=True)
    model = CausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(STEPS):
        x, y = shift_batch(TRAIN_LEN, 32, gen)
        loss = F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def accuracy(model, n):
    x, y = shift_batch(n, 64, torch.Generator().manual_seed(1))
    with torch.no_grad():
        pred = model(x).logits.argmax(-1)
    keep = y != 0
    return float((pred[keep] == y[keep]).float().mean())


test_lengths = [64, 128, 256, 512]
results = {}
for positional in ("learned", "sinusoidal", "rotary"):
    t0 = time.perf_counter()
    model = train(positional)
    results[positional] = [accuracy(model, n) for n in test_lengths]
    print(f"{positional:>10}: trained in {time.perf_counter() - t0:5.1f} s; accuracy at N = "
          + ", ".join(f"{n}: {a:.3f}" for n, a in zip(test_lengths, results[positional])))

# %%
# The measured answer as a plot (the accuracy of a predictor that guesses is 1/15):

fig, ax = plt.subplots(figsize=(6, 3.6))
for positional, accs in results.items():
    ax.plot(test_lengths, accs, "o-", label=positional)
ax.axvline(TRAIN_LEN, color="gray", ls=":", label="training length")
ax.axhline(1 / 15, color="gray", ls="--", lw=0.8, label="chance")
ax.set(xscale="log", xlabel="test sequence length", ylabel="accuracy", title="extrapolation past the training length")
ax.set_xticks(test_lengths, [str(n) for n in test_lengths])
ax.legend()
fig.tight_layout()
plt.show()

# %%
# Read the numbers printed above for this build. Past position 64 a learned encoding
# has only its untrained initial vectors, so its accuracy there falls towards chance
# and the average over a longer sequence falls with it. Sinusoidal codes are defined at
# every position, but the model never saw the codes past 64 either; rotary encodes only
# the distance between query and key, which is the same three positions at every
# length. The second tutorial also mentions relative position biases: attnlab has
# :class:`~attnlab.positional.ALiBi` and :class:`~attnlab.positional.T5RelativeBias`
# (``positional="alibi"`` or ``"t5"`` in a model config), and
# :class:`~attnlab.positional.SinusoidalND` for the 2-D and 3-D grids of images and video.
