"""
Padding and look-ahead masks
============================

Two masks come up in every Transformer. A **padding mask** hides the filler tokens that
make the sequences of a batch the same length; a **look-ahead** (causal) mask hides the
future from a decoder, so position ``i`` sees only positions ``0..i``. The first
tutorial builds both in NumPy, with its own convention: ``1`` marks a *blocked*
position, and the mask is added to the scores as ``-1e9``. attnlab's masks say the
opposite, where attention is *allowed*, and are objects that know their own shape.
This page builds the tutorial's masks, converts them, checks that both give the same
attention, and proves with :func:`attnlab.diagnostics.leak_test` that a mask hides
what it should.
"""

# %%
# The tutorial's padding mask
# ---------------------------
# Three sequences padded with ``0`` to length 6: real lengths 4, 2 and 6.

import numpy as np


def create_padding_mask(seq, pad_token=0):
    """The tutorial's padding mask: 1 where the token is padding, shaped to broadcast."""
    mask = (seq == pad_token).astype(float)
    return mask[:, np.newaxis, np.newaxis, :]  # [batch_size, 1, 1, seq_len]


batch_sequences = np.array([
    [1, 2, 3, 4, 0, 0],  # length 4
    [1, 2, 0, 0, 0, 0],  # length 2
    [1, 2, 3, 4, 5, 6],  # length 6
])
padding_mask = create_padding_mask(batch_sequences)
print(padding_mask.shape)  # (3, 1, 1, 6)
print(padding_mask[:, 0, 0])

# %%
# The same mask in attnlab: :func:`attnlab.masks.padding_from_tokens` reads the token
# ids (keys equal to ``pad_id`` are hidden), or :func:`attnlab.masks.padding` takes the
# lengths. ``dense`` materializes a mask as booleans, compact in the dimensions it does
# not depend on, so a padding mask is ``(B, 1, 1, M)`` like the tutorial's.

import torch

from attnlab import masks

pad = masks.padding_from_tokens(batch_sequences, pad_id=0)
by_length = masks.padding([4, 2, 6])
print(pad.dense(6, 6).shape, "allowed:\n", pad.dense(6, 6)[:, 0, 0].int())
print("the tutorial's mask is the negation:", bool((pad.dense(6, 6) == torch.from_numpy(padding_mask == 0)).all()))
print("padding_from_tokens equals padding(lengths):", bool((pad.dense(6, 6) == by_length.dense(6, 6)).all()))

# %%
# The tutorial's way to apply it adds ``-1e9`` to the blocked scores before softmax.
# We run that on random queries, keys and values and compare with
# :func:`attnlab.attention` given attnlab's mask: the outputs agree.

torch.manual_seed(0)
q, k, v = (torch.randn(3, 1, 6, 8, dtype=torch.float64) for _ in range(3))  # (B, H=1, N=6, D=8)


def apply_mask(scores, mask):
    """The tutorial's apply_mask: blocked positions get -1e9."""
    if mask is not None:
        scores = scores + (mask * -1e9)
    return scores


def tutorial_attention(q, k, v, blocked):
    scores = q @ k.transpose(-2, -1) / np.sqrt(q.shape[-1])
    return torch.softmax(apply_mask(scores, blocked), dim=-1) @ v


import attnlab

ours = attnlab.attention(q, k, v, mask=pad)
theirs = tutorial_attention(q, k, v, torch.from_numpy(padding_mask))
print("largest difference:", float((ours - theirs).abs().max()))

# %%
# The look-ahead mask
# -------------------
# The tutorial's ``create_look_ahead_mask`` is the strict upper triangle: ``1`` above
# the diagonal, blocked.


def create_look_ahead_mask(size):
    """The tutorial's causal mask: 1 above the diagonal."""
    return np.triu(np.ones((size, size)), k=1)


look_ahead_mask = create_look_ahead_mask(6)
print(look_ahead_mask)

# %%
# In attnlab it is :func:`attnlab.masks.causal`, which needs no size: the call's
# lengths give it one. :func:`attnlab.masks.from_blocked` converts any mask written in
# the tutorial's convention.

causal = masks.causal()
print("causal() is the negation of the tutorial's mask:",
      bool((causal.dense(6, 6)[0, 0] == torch.from_numpy(look_ahead_mask == 0)).all()))
print("from_blocked(look_ahead_mask) equals causal():",
      bool((masks.from_blocked(look_ahead_mask).dense(6, 6) == causal.dense(6, 6)).all()))

# %%
# A decoder over a padded batch needs both. attnlab masks combine with ``&`` (both
# allow), ``|`` and ``~``. :func:`attnlab.viz.plot_mask` draws what a mask allows for the
# second sequence of the batch (length 2), dark where attention is allowed:

import matplotlib.pyplot as plt

from attnlab.viz import plot_mask

both = causal & pad
fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
for ax, (name, m) in zip(axes, [("padding", pad), ("causal", causal), ("causal & padding", both)]):
    plot_mask(m, 6, 6, batch_index=1, block=2, ax=ax, title=f"{name} (sequence 2)")
fig.tight_layout()
plt.show()

ours = attnlab.attention(q, k, v, mask=both)
theirs = tutorial_attention(q, k, v, torch.from_numpy(np.maximum(padding_mask, look_ahead_mask)))
print("causal & padding, largest difference to the tutorial's -1e9 version:", float((ours - theirs).abs().max()))

# %%
# Where the two conventions part: a row that may see nothing
# ----------------------------------------------------------
# Take an all-padding sequence. With ``-1e9`` added to *every* score, softmax sees equal
# scores and spreads the weight evenly over the padding, so the output is the mean of
# the padding's values. attnlab returns zeros for a query that may see no key, on every
# backend, with zero gradients.

q1, k1, v1 = q[:1], k[:1], v[:1]
all_pad = np.zeros((1, 6))
theirs = tutorial_attention(q1, k1, v1, torch.from_numpy(create_padding_mask(all_pad)))
ours = attnlab.attention(q1, k1, v1, mask=masks.padding_from_tokens(all_pad, pad_id=0))
print("tutorial's output for an all-padding row:", theirs[0, 0, 0, :4].numpy().round(3))
print("attnlab's:                               ", ours[0, 0, 0, :4].numpy().round(3))

# %%
# Proving that a mask works: ``leak_test``
# ----------------------------------------
# A mask bug rarely raises: the model just trains on information it should not have.
# :func:`attnlab.diagnostics.leak_test` makes it visible. For every query it replaces
# the keys and values that query may *not* see by large random numbers and runs the
# attention again: if the query's output moves, something leaked. It takes any
# attention function ``f(q, k, v, mask)``, so it tests your own code as well as
# attnlab's.

from attnlab.diagnostics import AttentionCheckError, leak_test

q32, k32, v32 = (x.float() for x in (q, k, v))
moved = leak_test(lambda q, k, v, m: attnlab.attention(q, k, v, mask=m), q32, k32, v32, both)
print(f"attnlab.attention with causal & padding: largest move {moved:.1e}")


def forgot_the_mask(q, k, v, mask):
    """A common bug: the mask is accepted and never applied."""
    return attnlab.attention(q, k, v)


def flipped_sign(q, k, v, mask):
    """Another: the tutorial's 1-is-blocked mask passed where 1 means allowed."""
    blocked = ~mask.dense(q.shape[2], k.shape[2])
    return attnlab.attention(q, k, v, mask=masks.dense(blocked))


for bug in (forgot_the_mask, flipped_sign):
    try:
        leak_test(bug, q32, k32, v32, both)
        print(bug.__name__, "passed (unexpected)")
    except AttentionCheckError as e:
        print(f"{bug.__name__}: {str(e)[:110]}...")

# %%
# ``leak_test`` also runs in attnlab's own test suite over every backend, mechanism and
# mask kind. For attention weights you already have, :func:`attnlab.diagnostics.check_attention`
# checks that no weight lands on a hidden key (see :doc:`09_debugging`).
