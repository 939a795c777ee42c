"""
Vision and cross-modal attention
================================

Attention is not only for text. The first tutorial ends with a *vision attention*
module: every pixel of a convolutional feature map attends to every other pixel. The
second lists where attention links two different sequences: the cross-language
alignment of translation, matching images with text. This page runs the tutorial's
module against :class:`attnlab.layers.SpatialSelfAttention`, looks at what one pixel
attends to, and then trains a small encoder-decoder to see its cross-attention align
target with source.
"""

# %%
# The tutorial's vision attention
# -------------------------------
# A 1x1 convolution makes queries, keys and values from the ``C`` channels of each
# pixel; attention runs over the ``H x W`` pixels; a last 1x1 convolution projects.

import torch
import torch.nn as nn


class VisionAttention(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.qkv = nn.Conv2d(channels, channels * 3, kernel_size=1)
        self.proj = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x):
        B, C, H, W = x.shape
        qkv = self.qkv(x).chunk(3, dim=1)
        q, k, v = [y.view(B, -1, H * W).transpose(1, 2) for y in qkv]
        attn = (q @ k.transpose(-2, -1)) * (C**-0.5)
        attn = attn.softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(B, C, H, W)
        return self.proj(out)


# %%
# :class:`attnlab.layers.SpatialSelfAttention` is the same layer with separate ``q``,
# ``k``, ``v`` and ``proj`` convolutions (and more heads, a smaller query/key width and
# SAGAN's learnable residual as options). Copying the tutorial's weights into it gives
# the same output:

from attnlab.layers import SpatialSelfAttention

torch.manual_seed(0)
C = 16
theirs = VisionAttention(C).eval()
ours = SpatialSelfAttention(C, heads=1).eval()
with torch.no_grad():
    for i, conv in enumerate((ours.q, ours.k, ours.v)):
        conv.weight.copy_(theirs.qkv.weight[i * C:(i + 1) * C])
        conv.bias.copy_(theirs.qkv.bias[i * C:(i + 1) * C])
    ours.proj.load_state_dict(theirs.proj.state_dict())
    x = torch.randn(2, C, 12, 12)  # (B, C, H, W)
    print("largest difference:", float((theirs(x) - ours(x)).abs().max()))

# %%
# What one pixel attends to
# -------------------------
# A toy image makes the behaviour visible: a dark background with three squares, two
# of them red and one blue. Its "feature map" is each pixel's colour plus noise (a
# trained network would supply learned features). With queries and keys equal to the
# features (identity 1x1 convolutions), a pixel's attention goes to the pixels that look
# like it, wherever they are: the long-range link a convolution's local window cannot
# make.

H = W = 24
image = torch.zeros(3, H, W)
image[0, 3:9, 3:9] = 1.0  # red square, top left
image[0, 15:21, 14:20] = 1.0  # red square, bottom right
image[2, 3:9, 15:21] = 1.0  # blue square, top right
features = torch.cat([image, 0.05 * torch.randn(C - 3, H, W)])[None] * 4  # (1, C, H, W)

probe = SpatialSelfAttention(C, heads=1, bias=False).eval()
with torch.no_grad():
    for conv in (probe.q, probe.k, probe.v, probe.proj):
        conv.weight.copy_(torch.eye(C)[:, :, None, None])
    _, weights = probe(features, return_weights=True)  # weights (B, heads, H*W, H*W)
print("weights:", tuple(weights.shape), "rows sum to", float(weights[0, 0].sum(-1).mean()))

import matplotlib.pyplot as plt

queries = {"a pixel of the top-left red square": (5, 5), "a pixel of the blue square": (5, 18),
           "a background pixel": (14, 4)}
fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
axes[0].imshow(image.permute(1, 2, 0).numpy())
axes[0].set_title("the image")
for ax, (name, (r, c)) in zip(axes[1:], queries.items()):
    ax.imshow(weights[0, 0, r * W + c].view(H, W).numpy(), cmap="YlGnBu")
    ax.scatter([c], [r], marker="x", color="red")
    ax.set_title(f"attention from\n{name}", fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
plt.show()

# %%
# Cross-attention: a decoder looking at its source
# ------------------------------------------------
# In translation, the decoder's *cross-attention* lets each word it writes look at the
# source sentence; its weights are an alignment between the two languages. To see one
# form within the time a page may take, we train a small
# :class:`attnlab.models.EncoderDecoder` (2 + 2 layers, width 64) on a task whose
# alignment is known in advance: the target is the source written backwards, so target
# word ``i`` should attend to source word ``S - 1 - i``. A fixed budget of 200 steps
# (batch 32), trained when the site is built.

import time

import torch.nn.functional as F

from attnlab.models import EncoderDecoder, Seq2SeqConfig

VOCAB, S, BOS, EOS = 20, 10, 1, 2  # words are ids 3..19


def reverse_batch(batch, gen):
    src = torch.randint(3, VOCAB, (batch, S), generator=gen)
    tgt = torch.cat([torch.full((batch, 1), BOS), src.flip(1), torch.full((batch, 1), EOS)], dim=1)
    return src, tgt  # the decoder reads tgt[:, :-1] and predicts tgt[:, 1:]


torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
cfg = Seq2SeqConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dim=64, heads=4, layers=2, max_len=32,
                    scale_embeddings=True)
model = EncoderDecoder(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
t0 = time.perf_counter()
STEPS = 200
for _ in range(STEPS):
    src, tgt = reverse_batch(32, gen)
    logits = model(src, tgt[:, :-1]).logits  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
src, tgt = reverse_batch(256, torch.Generator().manual_seed(1))
with torch.no_grad():
    out = model(src, tgt[:, :-1], return_weights=True)
accuracy = float((out.logits.argmax(-1) == tgt[:, 1:]).float().mean())
print(f"trained {STEPS} steps in {time.perf_counter() - t0:.0f} s; teacher-forced token accuracy {accuracy:.3f}")

# %%
# The last decoder layer's cross-attention, averaged over its heads, for one test
# sentence: rows are the words the decoder writes, columns the source words. Reversal
# shows as the anti-diagonal.

from attnlab.viz import plot_attention

cross = out.cross_attentions[-1][0].mean(0)  # (T, S): heads averaged
src_words = [f"w{int(t)}" for t in src[0]]
tgt_words = [f"w{int(t)}" for t in tgt[0, 1:-1]] + ["</s>"]
fig = plot_attention(cross, tgt_words, key_tokens=src_words, title="cross-attention: target (down) vs source (across)")
expected = torch.arange(S - 1, -1, -1)
print("share of target words whose strongest source word is the mirrored one:",
      float((out.cross_attentions[-1].mean(1)[:, :S].argmax(-1) == expected).float().mean()))

# %%
# The same picture for real translation
# -------------------------------------
# ``attnlab translate RUN SENTENCE --alignment FILE.png`` draws this map for a trained
# translation model. The picture below was drawn from the Multi30k German-to-English
# model of the :doc:`benchmarks page <../benchmarks>` (85 minutes of CPU training; its
# command is there) by
# ``attnlab translate runs/translation "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun." --alignment docs/translation_alignment.png``;
# it is not redrawn when this site is built.
#
# .. image:: /translation_alignment.png
#    :alt: Cross-attention of the Multi30k translation model
#    :width: 640px
