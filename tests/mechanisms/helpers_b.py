"""Shared helpers for the tests of the structured/sparse mechanisms (local, longformer, bigbird, reformer).

Imported by putting this folder on ``sys.path`` (the tests folder has no package
``__init__``); keep it free of test functions.
"""

from __future__ import annotations

import torch
from torch import nn

TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
}


def rand_qkv(B, H, N, D, *, M=None, Hkv=None, Dv=None, dtype=torch.float64, seed=0, requires_grad=False):
    """Random ``q (B, H, N, D)``, ``k (B, Hkv, M, D)``, ``v (B, Hkv, M, Dv)`` from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    M = N if M is None else M
    Hkv = H if Hkv is None else Hkv
    Dv = D if Dv is None else Dv
    q = torch.randn(B, H, N, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, M, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, M, Dv, generator=g, dtype=dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def assert_no_future_leak(fn, q, k, v, *, perturb_q: bool = False):
    """Causal check: changing keys/values after position ``t`` leaves outputs ``0..t`` unchanged.

    ``fn(q, k, v) -> out``; square self-attention (N == M). With ``perturb_q`` the
    queries after ``t`` are perturbed too (for shared-QK mechanisms whose keys are q).
    """
    N = q.shape[2]
    base = fn(q, k, v)
    for t in sorted({0, N // 3, N // 2, N - 2}):
        if t < 0 or t >= N - 1:
            continue
        g = torch.Generator().manual_seed(t + 1)
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        k2[:, :, t + 1 :] = torch.randn(k2[:, :, t + 1 :].shape, generator=g, dtype=k.dtype) * 3
        v2[:, :, t + 1 :] = torch.randn(v2[:, :, t + 1 :].shape, generator=g, dtype=v.dtype) * 3
        if perturb_q:
            q2[:, :, t + 1 :] = torch.randn(q2[:, :, t + 1 :].shape, generator=g, dtype=q.dtype) * 3
        out = fn(q2, k2, v2)
        torch.testing.assert_close(out[:, :, : t + 1], base[:, :, : t + 1], **TOL[q.dtype])
        # and the future did change (the perturbation reached the later outputs)
        assert not torch.allclose(out[:, :, t + 1 :], base[:, :, t + 1 :])


class TinyModel(nn.Module):
    """embedding -> q/k/v linear -> mechanism -> linear head (per-position logits)."""

    def __init__(self, mechanism, vocab=12, dim=16, heads=2, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, classes)
        self.mechanism, self.heads = mechanism, heads

    def forward(self, tokens, mask=None):
        B, N = tokens.shape
        x = self.emb(tokens)  # (B, N, dim)
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (3, B, H, N, dh)
        out = self.mechanism(q, k, v, mask=mask)  # (B, H, N, dh)
        return self.head(out.transpose(1, 2).reshape(B, N, -1))  # (B, N, classes)


def toy_batch(gen, B=16, N=32, vocab=12, classes=4):
    """Each sequence has a class ``y``; half its tokens are the class token ``y``, the rest noise.

    Target at every position is ``y``: pooling over attended positions tells it.
    """
    y = torch.randint(0, classes, (B, 1), generator=gen)
    noise = torch.randint(classes, vocab, (B, N), generator=gen)
    signal = torch.rand(B, N, generator=gen) < 0.5
    tokens = torch.where(signal, y.expand(B, N), noise)
    return tokens, y.expand(B, N)


def train_losses(mechanism, steps=30, seed=0, N=32, mask=None):
    """Train :class:`TinyModel` for ``steps`` AdamW steps; return the loss of each step."""
    torch.manual_seed(seed)
    model = TinyModel(mechanism)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        tokens, target = toy_batch(gen, N=N)
        logits = model(tokens, mask=mask)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def assert_loss_falls(losses):
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, f"loss did not fall: first five {first:.3f}, last five {last:.3f}"


def assert_linear_cost(mech, n=4096, D=64, H=8):
    """``cost()`` is positive and roughly doubles when N doubles (O(N), not O(N^2))."""
    c1, c2 = mech.cost(n, n, D, H), mech.cost(2 * n, 2 * n, D, H)
    assert c1.flops > 0 and c1.bytes > 0
    assert 1.6 < c2.flops / c1.flops < 2.6, (c1, c2)
    assert 1.6 < c2.bytes / c1.bytes < 2.6, (c1, c2)
