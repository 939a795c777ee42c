"""
Memory savers: checkpointing, mixed precision, chunked attention
================================================================

Long sequences run out of memory first in attention: the score matrix has ``N x N``
entries per head, and training keeps it for the backward pass. The first tutorial
lists three remedies: **gradient checkpointing** (recompute activations in the
backward pass instead of storing them), **mixed precision** (store activations in 16
bits) and **chunked attention** (compute the scores block by block). This page
measures each on the same training step at one length, with attnlab's switches for
them.
"""

# %%
# How memory is measured here
# ---------------------------
# On a CPU there is no ``torch.cuda.max_memory_allocated``. This small tracker counts
# the bytes of every tensor torch creates inside a ``with`` block, from its creation
# until it is freed, and keeps the peak: exact and repeatable, unlike the process's
# resident memory. (attnlab's test suite uses the same idea.)

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorPeak(TorchDispatchMode):
    """Peak bytes of the CPU tensors created inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self._owners = 0, 0, {}

    def _free(self, key, nbytes):
        if self._owners.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in self._owners:  # a new storage, not a view or an in-place op
                    self._owners[key] = weakref.finalize(t, self._free, key, nbytes)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
        return out


# %%
# The training step
# -----------------
# A small GPT-style :class:`attnlab.models.CausalLM` (4 layers, width 128, 4 heads) on a
# batch of 2 sequences of ``N = 1024`` tokens: one forward, the loss, one backward. The
# baseline computes attention with the ``math`` backend, the formula as the tutorials
# write it, which materializes every ``N x N`` score matrix and keeps it for the
# backward pass.

import torch.nn.functional as F

from attnlab.models import CausalLM, CausalLMConfig

N, BATCH = 1024, 2


def training_step(backend="math", checkpointing=False, bf16=False):
    """Peak tensor memory (MiB) of one forward + backward."""
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=256, dim=128, heads=4, layers=4, max_len=N, mechanism="exact",
                         mechanism_settings={"backend": backend}, checkpointing=checkpointing)
    model = CausalLM(cfg).train()
    tokens = torch.randint(0, 256, (BATCH, N))
    with TensorPeak() as peak:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens).logits  # (B, N, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1)[:-1], tokens.flatten()[1:])
        loss.backward()
    return peak.peak / 2**20


# %%
# The three remedies are three switches:
#
# * **gradient checkpointing**: ``checkpointing=True`` in the model's config wraps each
#   layer in ``torch.utils.checkpoint``, the tutorial's ``checkpoint(self.attention, ...)``;
#   ``attnlab train --checkpointing`` on the command line.
# * **mixed precision**: ``torch.autocast``. The tutorial's ``torch.cuda.amp`` with a
#   ``GradScaler`` is the float16 recipe for GPUs; on a CPU, bfloat16 autocast needs no
#   scaler (bfloat16 has float32's range). ``attnlab train --precision bf16`` (or
#   ``auto``, which measures whether bf16 is faster on this CPU) does it in training.
# * **chunked attention**: the ``chunked`` backend computes attention tile by tile with
#   an online softmax and its own backward, so no ``N x N`` matrix is ever stored;
#   ``backend="auto"`` picks it (or SDPA, which is memory-lean too) by itself.

variants = {
    "baseline (math backend)": {},
    "gradient checkpointing": {"checkpointing": True},
    "mixed precision (bf16)": {"bf16": True},
    "chunked attention": {"backend": "chunked"},
    "chunked + checkpointing": {"backend": "chunked", "checkpointing": True},
}
measured = {name: training_step(**kw) for name, kw in variants.items()}
base = measured["baseline (math backend)"]
print(f"one training step, N={N}, batch {BATCH}: peak tensor memory")
for name, mib in measured.items():
    print(f"  {name:26} {mib:7.1f} MiB  ({base / mib:4.1f}x less than the baseline)")

# %%
# As a picture:

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.2))
names = list(measured)
ax.barh(names[::-1], [measured[n] for n in names[::-1]], color="tab:blue")
ax.set_xlabel(f"peak tensor memory of one training step, MiB (N={N}, batch {BATCH})")
fig.tight_layout()
plt.show()

# %%
# Checkpointing trades time for memory: the backward pass runs each layer's forward
# again. Mixed precision shrinks what is stored but keeps the ``N x N``
# scores. Chunked attention removes the ``N x N`` term altogether, which is why it
# combines well with checkpointing: what is left are the layers' ``N x width``
# activations.
#
# The tutorial's ``chunked_attention``
# ------------------------------------
# The tutorial's own chunking splits the *queries* into blocks of 64 and runs full
# attention per block. Here it is as written (it leaves out the ``1/√d_k`` scale, so
# we compare with ``scale=1.0``) against :func:`attnlab.attention`, and the peak memory
# of one forward call at ``N = 4096`` against the unchunked formula.

import attnlab


def chunked_attention(Q, K, V, chunk_size=64):
    outputs = []
    for i in range(0, Q.size(1), chunk_size):
        q = Q[:, i:i + chunk_size]
        scores = torch.matmul(q, K.transpose(-2, -1))
        attn = torch.softmax(scores, dim=-1)
        output = torch.matmul(attn, V)
        outputs.append(output)
    return torch.cat(outputs, dim=1)


torch.manual_seed(0)
Q, K, V = (torch.randn(8, 4096, 64) / 4 for _ in range(3))  # (batch * heads, N, D), as the tutorial indexes dim 1
with torch.no_grad():
    with TensorPeak() as p_full:
        full = torch.softmax(Q @ K.transpose(-2, -1), dim=-1) @ V
    with TensorPeak() as p_tut:
        tut = chunked_attention(Q, K, V)
    with TensorPeak() as p_ours:
        ours = attnlab.attention(Q[None], K[None], V[None], scale=1.0, backend="chunked")[0]
print("the tutorial's chunks vs full attention, largest difference:", float((tut - full).abs().max()))
print("attnlab chunked vs full attention, largest difference:     ", float((ours - full).abs().max()))
print(f"forward peak: full formula {p_full.peak / 2**20:.0f} MiB, the tutorial's chunks {p_tut.peak / 2**20:.0f} MiB, "
      f"attnlab chunked {p_ours.peak / 2**20:.0f} MiB")

# %%
# The tutorial's chunking saves memory in the forward pass. Under autograd, though,
# every chunk's softmax output is kept for the backward pass, so training still stores
# all ``N x N`` weights; attnlab's ``chunked`` backend tiles keys as well as queries,
# merges the tiles by their log-sum-exp and recomputes the scores in its backward.
# Forward and backward at ``N = 2048``:

Qg, Kg, Vg = (x[:, :2048].clone().requires_grad_() for x in (Q, K, V))
with TensorPeak() as p_tut:
    chunked_attention(Qg, Kg, Vg).sum().backward()
with TensorPeak() as p_ours:
    attnlab.attention(Qg[None], Kg[None], Vg[None], scale=1.0, backend="chunked").sum().backward()
print(f"forward + backward peak: the tutorial's chunks {p_tut.peak / 2**20:.0f} MiB, attnlab chunked {p_ours.peak / 2**20:.0f} MiB")

# %%
# So attnlab's training memory stays linear in ``N`` (the :doc:`benchmarks page <../benchmarks>` has it training at
# N = 65,536 in under 1 GiB).
