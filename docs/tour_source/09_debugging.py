"""
Debugging attention: the tutorials' checklist as attnlab calls
==============================================================

The first tutorial's debugging advice is a checklist of three points:

1. **attention weights**: every row sums to one after softmax (and holds no NaN);
2. **gradients**: they are right, in particular after the scaling;
3. **masks**: padding and look-ahead masks are really applied.

The second adds a fourth, from looking at heat maps: **abnormal patterns**, such as
heads that pile their attention onto separators. This page runs each check with
attnlab, first on attention that is right, then on attention with the bug the check is
meant to catch.
"""

# %%
# 1. Rows sum to one, no NaN
# --------------------------
# The tutorial's check, as written:

import torch

import attnlab
from attnlab import masks


def check_attention(attention_weights):
    sums = attention_weights.sum(dim=-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5), "Attention weights do not sum to 1"
    assert not torch.isnan(attention_weights).any(), "NaN values in attention weights"


torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 32, 16) for _ in range(3))  # (B, H, N, D)
out, w = attnlab.attention(q, k, v, return_weights=True)
check_attention(w)
print("the tutorial's check passes on attnlab's weights")

# %%
# :func:`attnlab.diagnostics.check_attention` does the same and more: it takes the mask,
# checks that no weight lands on a key the mask hides, that no weight is negative, and
# that a row which may see no key is all zeros (not NaN); it returns what it measured,
# and on failure names the offending positions.

from attnlab.diagnostics import AttentionCheckError
from attnlab.diagnostics import check_attention as attnlab_check

mask = masks.causal() & masks.padding([32, 20])
out, w = attnlab.attention(q, k, v, mask=mask, return_weights=True)
print(attnlab_check(w, mask))

# %%
# Now the bug it is for: a softmax taken over the wrong dimension (over the queries)
# still gives numbers between 0 and 1, and nothing raises until the model fails to learn.

scores = q @ k.transpose(-2, -1) / 16**0.5
wrong = torch.softmax(scores, dim=-2)  # the bug: dim=-2 instead of -1
try:
    attnlab_check(wrong)
except AttentionCheckError as e:
    print("caught:", str(e)[:140], "...")

# %%
# 2. Gradients
# ------------
# ``torch.autograd.gradcheck`` compares the analytic gradient with finite differences
# in float64. attnlab's memory-lean ``chunked`` backend has its own backward (it
# recomputes the scores tile by tile), so this is the check that matters for it; the
# other backends' gradients are PyTorch's.

q64, k64, v64 = (torch.randn(1, 2, 12, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
for backend in ("math", "chunked"):
    ok = torch.autograd.gradcheck(
        lambda q, k, v, backend=backend: attnlab.attention(q, k, v, mask=masks.causal(), backend=backend),
        (q64, k64, v64))
    print(f"gradcheck, {backend} backend, causal mask:", ok)

# %%
# "Whether the gradients are reasonable after the scaling" is the question the
# :doc:`first page <01_self_attention>` measures: without the ``1/√d_k`` scale, softmax
# saturates as ``d_k`` grows and the gradient that reaches the scores shrinks.

# %%
# 3. Masks are applied
# --------------------
# :func:`attnlab.diagnostics.leak_test` perturbs every key and value a query may not see
# and fails if the query's output moves (the :doc:`mask page <03_masks>` shows it on the
# tutorial's masks). A classic bug is an off-by-one look-ahead mask, ``triu(ones, k=2)``
# instead of ``k=1``: each position also sees the next one, so a language model learns
# to copy the answer it should predict.

import numpy as np

from attnlab.diagnostics import leak_test

qn, kn, vn = (torch.randn(1, 4, 16, 16) for _ in range(3))
right = leak_test(lambda q, k, v, m: attnlab.attention(q, k, v, mask=m), qn, kn, vn, masks.causal())
print(f"causal(): largest move {right:.1e}")

off_by_one = masks.from_blocked(np.triu(np.ones((16, 16)), k=2))  # the bug
try:
    leak_test(lambda q, k, v, m: attnlab.attention(q, k, v, mask=off_by_one), qn, kn, vn, masks.causal())
    print("off-by-one mask passed (unexpected)")
except AttentionCheckError as e:
    print("caught:", str(e)[:120], "...")

# %%
# 4. Abnormal heads
# -----------------
# The second tutorial: look at the heat maps, spot heads that over-focus on separators,
# compare heads. :func:`attnlab.diagnostics.analyze_heads` flags a head *abnormal* when at
# least half of its weight goes to ``[CLS]``/``[SEP]`` (a "sink", often an idle head), and
# :func:`attnlab.diagnostics.redundant_heads` finds pairs of heads that attend alike.
# On MiniLM and the tutorial's sentence:

from attnlab.diagnostics import analyze_heads, head_similarity, redundant_heads
from attnlab.viz import load_source, text_attention

ta = text_attention(load_source("minilm"), "The animal didn't cross the street because it was too tired")
stats = analyze_heads(ta.weights, ta.tokens)
abnormal = [(s.layer, s.head) for s in stats if s.abnormal]
print(f"{len(abnormal)} of {len(stats)} heads flagged abnormal (sink); per layer:",
      [sum(1 for layer, _ in abnormal if layer == i) for i in range(len(ta.weights))])
pairs = redundant_heads(head_similarity(ta.weights), heads_per_layer=ta.weights[0].shape[0], threshold=0.95)
print(f"{len(pairs)} pairs of heads with similarity >= 0.95; the closest:", pairs[:3])

# %%
# The tutorials' common problems, and the attnlab switch for each
# ---------------------------------------------------------------
# * **the loss does not fall at first** (weights too uniform at initialization): a
#   learning-rate warm-up (``attnlab train ... --warmup 200``; ``TrainConfig(warmup=...)``)
#   and the initialization (``--init xavier``; :func:`attnlab.train.xavier_init`), which
#   the second tutorial also recommends.
# * **out of memory on long sequences** (the ``N x N`` matrix): a memory-lean backend,
#   which ``backend="auto"`` picks, checkpointing, bf16, or an efficient mechanism (see
#   :doc:`05_memory` and :doc:`07_efficient_variants`).
# * **validation much worse than training** (overfitting, or positions past the
#   training length): ``--dropout``, and a positional encoding that extrapolates (see
#   :doc:`06_positional_encodings`).
# * the second tutorial's **L2 penalty on attention weights**:
#   ``TrainConfig(attn_penalty="l2", attn_penalty_weight=...)``
#   (``attnlab train ... --attn-penalty l2``).
