"""Divided space-time attention (TimeSformer): time, then space, each a pre-norm residual branch.

Bertasius, Wang and Torresani, 2021, "Is Space-Time Attention All You Need for Video
Understanding?". Over the tokens of a ``(T, H, W)`` video (attnlab's layout, see
:mod:`attnlab.masks.structured`), optionally after a class token:

1. time: every patch token attends over the ``T`` tokens at its ``(h, w)``
   (:func:`attnlab.masks.same_position`); the branch is projected once more
   (``time_proj``, TimeSformer's ``temporal_fc``) and added: ``x_t = x + proj(attn_t(norm_t(x)))``.
   The class token takes no part.
2. space: every token attends over its frame (:func:`attnlab.masks.same_frame`); the class
   token joins every frame as a copy (a ``(T, 1 + H W)`` layout, one row per frame), and its
   branch is the mean of its ``T`` copies' outputs. ``out = [cls, x_t] + [mean, attn_s(norm_s([cls, x_t]))]``:
   the space branch is added to ``x_t`` while the class token adds to its input.
3. optionally (``ff_dim``) the feed-forward block of a whole TimeSformer layer:
   ``out + fc2(act(fc1(norm_ff(out))))``.

That is Hugging Face's ``TimesformerLayer`` (``attention_type="divided_space_time"``), which
:meth:`DividedSpaceTimeAttention.from_hf` copies: equal up to the token order, because HF
orders its patch tokens ``(H, W, T)`` (time fastest) where attnlab orders them ``(T, H, W)``
(:func:`from_hf_order` / :func:`to_hf_order` convert). Stochastic depth is left out (an
identity at evaluation).

Both attentions are masks over the whole sequence that are pure reshapes, so ``auto`` runs
them on the ``regroup`` backend: ``T``-long and ``H W``-long dense attentions, time
O(B heads T H W (T + H W) D) instead of joint attention's O(B heads (T H W)^2 D). Videos
with fewer real frames (``frames=``) mask the padded frames as keys (frames are the slowest
axis, so that is key padding) and average the class token over real frames only; outputs
at padded frames are unspecified.

Shape legend: ``B`` batch, ``T`` frames, ``H`` x ``W`` patches per frame, ``P = H W``,
``n = T P`` patch tokens, ``dim`` width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .. import masks
from ..mechanisms import Exact
from ..utils import positive_int
from .multihead import MultiHeadAttention

__all__ = ["DividedSpaceTimeAttention", "from_hf_order", "to_hf_order", "check_video_shape", "frame_counts"]

_ACTIVATIONS = {"gelu": lambda: nn.GELU(), "gelu_new": lambda: nn.GELU(approximate="tanh"),
                "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"), "relu": lambda: nn.ReLU()}


def check_video_shape(x: Tensor, shape: Sequence[int], dim: int, name: str = "x") -> tuple[tuple[int, int, int], bool]:
    """``((T, H, W), has_class_token)`` for tokens ``x (B, [1 +] T H W, dim)``; ValueError naming what is wrong."""
    try:
        t, h, w = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be (T, H, W), three positive ints, got {shape!r}") from None
    if min(t, h, w) < 1:
        raise ValueError(f"shape must be (T, H, W), three positive ints, got {shape!r}")
    if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != dim:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have shape (batch, tokens, {dim}), got {got}")
    n = t * h * w
    if x.shape[1] not in (n, n + 1):
        raise ValueError(f"shape {(t, h, w)} has {n} positions: {name} must hold {n} tokens (or {n + 1} with a "
                         f"class token first), got {x.shape[1]}")
    return (t, h, w), x.shape[1] == n + 1


def frame_counts(frames, batch: int, t: int, device) -> Tensor | None:
    """Real frames per video as a ``(B,)`` long tensor, checked to lie in ``[1, T]`` (None passes through)."""
    if frames is None:
        return None
    f = torch.as_tensor(frames, device=device)
    if f.dtype.is_floating_point or f.shape != (batch,):
        raise ValueError(f"frames must be {batch} integers (real frames per video), got {frames!r}")
    if bool(((f < 1) | (f > t)).any()):
        raise ValueError(f"frames must lie in [1, {t}] (T={t}), got {f.tolist()}")
    return f.long()


def _hf_perm(t: int, h: int, w: int) -> Tensor:
    """``perm[i]``: the HF (H, W, T) index of attnlab's (T, H, W) token ``i``."""
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return ((hh * w + ww) * t + tt).reshape(-1)


def from_hf_order(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Tokens in Hugging Face TimeSformer's ``(H, W, T)`` order -> attnlab's ``(T, H, W)`` (a class token stays first)."""
    (t, h, w), cls = check_video_shape(x, shape, x.shape[-1] if isinstance(x, Tensor) else 0)
    perm = _hf_perm(t, h, w).to(x.device)
    return torch.cat([x[:, :1], x[:, 1:][:, perm]], 1) if cls else x[:, perm]


def to_hf_order(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Tokens in attnlab's ``(T, H, W)`` order -> Hugging Face TimeSformer's ``(H, W, T)`` (inverse of :func:`from_hf_order`)."""
    (t, h, w), cls = check_video_shape(x, shape, x.shape[-1] if isinstance(x, Tensor) else 0)
    inv = torch.argsort(_hf_perm(t, h, w)).to(x.device)
    return torch.cat([x[:, :1], x[:, 1:][:, inv]], 1) if cls else x[:, inv]


class DividedSpaceTimeAttention(nn.Module):
    """TimeSformer's divided space-time attention over ``(T, H, W)`` tokens (see the module docstring).

    Args:
        dim: width of the tokens.
        heads: heads of each attention (``dim`` must be divisible by it).
        ff_dim: hidden width of the feed-forward block of a whole TimeSformer layer; None
            (default) leaves it to the caller.
        dropout: dropout on every residual branch (training mode only).
        norm_eps: LayerNorm epsilon (TimeSformer's is 1e-6).
        activation: the feed-forward nonlinearity (``gelu``, ``gelu_new``, ``relu``).
        backend: exact attention backend (``auto`` regroups the two masks).
    """

    def __init__(self, dim: int, heads: int, *, ff_dim: int | None = None, dropout: float = 0.0,
                 norm_eps: float = 1e-6, activation: str = "gelu", backend: str = "auto"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        positive_int(ff_dim, "ff_dim", allow_none=True)
        self.dim, self.heads, self.ff_dim, self.activation = dim, heads, ff_dim, activation
        self.time_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.time_attn = MultiHeadAttention(dim, heads, mechanism=Exact(backend=backend))
        self.time_proj = nn.Linear(dim, dim)
        self.space_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.space_attn = MultiHeadAttention(dim, heads, mechanism=Exact(backend=backend))
        self.drop = nn.Dropout(dropout)
        if ff_dim is not None:
            self.ff_norm = nn.LayerNorm(dim, eps=norm_eps)
            self.fc1, self.act, self.fc2 = nn.Linear(dim, ff_dim), _ACTIVATIONS[activation](), nn.Linear(ff_dim, dim)

    def forward(self, x: Tensor, shape: Sequence[int], *, frames=None) -> Tensor:
        """``x (B, [1 +] T H W, dim) -> (B, [1 +] T H W, dim)``, residuals included.

        Args:
            x: patch tokens in the ``(T, H, W)`` layout, optionally after a class token.
            shape: ``(T, H, W)``.
            frames: real frames per video ``(B,)`` (None: all ``T``); the rest is padding.

        Raises:
            ValueError: when ``x`` does not hold ``T H W`` (or ``1 + T H W``) tokens of width
                ``dim``, or ``frames`` is outside ``[1, T]``.
        """
        (t, h, w), has_cls = check_video_shape(x, shape, self.dim)
        b, p = x.shape[0], h * w
        real = frame_counts(frames, b, t, x.device)
        keep = None if real is None else masks.padding(real * p)  # padded frames are a key suffix
        cls, tokens = (x[:, :1], x[:, 1:]) if has_cls else (None, x)  # (B, 1, dim), (B, n, dim)

        time_mask = masks.same_position((t, h, w))
        branch = self.time_attn(self.time_norm(tokens), mask=time_mask if keep is None else time_mask & keep)
        tokens = tokens + self.drop(self.time_proj(branch))  # (B, n, dim)

        if cls is None:
            out = tokens + self.drop(self.space_attn(self.space_norm(tokens), mask=masks.same_frame((t, h, w))))
        else:
            framed = torch.cat([cls.unsqueeze(1).expand(b, t, 1, self.dim), tokens.view(b, t, p, self.dim)], dim=2)
            framed = framed.reshape(b, t * (p + 1), self.dim)  # (B, T (1 + P), dim): a class token per frame
            s = self.space_attn(self.space_norm(framed), mask=masks.axial((t, p + 1), -1))
            s = s.view(b, t, p + 1, self.dim)  # (B, T, 1 + P, dim)
            if real is None:
                cls_branch = s[:, :, 0].mean(1, keepdim=True)  # (B, 1, dim)
            else:  # the mean over real frames only
                w_t = (torch.arange(t, device=x.device) < real[:, None]).to(s.dtype)  # (B, T)
                cls_branch = ((s[:, :, 0] * w_t[..., None]).sum(1) / real[:, None].to(s.dtype)).unsqueeze(1)
            out = torch.cat([cls + self.drop(cls_branch), tokens + self.drop(s[:, :, 1:].reshape(b, t * p, self.dim))], 1)
        if self.ff_dim is not None:
            out = out + self.drop(self.fc2(self.act(self.fc1(self.ff_norm(out)))))
        return out

    @classmethod
    def from_hf(cls, layer: nn.Module) -> DividedSpaceTimeAttention:
        """A layer computing what a Hugging Face ``TimesformerLayer`` (divided space-time) computes.

        Its weights are copied; the result has the feed-forward block (``ff_dim`` =
        ``intermediate_size``) and the config's LayerNorm epsilon and activation. Feed it tokens in
        attnlab's ``(T, H, W)`` order (:func:`from_hf_order` converts HF's ``(H, W, T)``).

        Raises:
            ValueError: for something other than a divided space-time ``TimesformerLayer``.
        """
        cfg = getattr(layer, "config", None)
        if cfg is None or not hasattr(layer, "temporal_attention"):
            raise ValueError(f"layer must be a transformers TimesformerLayer with attention_type='divided_space_time', "
                             f"got {type(layer).__name__}")
        act = cfg.hidden_act if isinstance(cfg.hidden_act, str) else ""
        if act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(_ACTIVATIONS)} to copy a TimesformerLayer, got "
                             f"{cfg.hidden_act!r}")
        ref = layer.layernorm_before.weight
        out = cls(cfg.hidden_size, cfg.num_attention_heads, ff_dim=cfg.intermediate_size,
                  norm_eps=cfg.layer_norm_eps, activation=act).to(device=ref.device, dtype=ref.dtype)

        def attention(dst: MultiHeadAttention, src: nn.Module) -> None:
            qkv, dense = src.attention.qkv, src.output.dense
            for proj, weight in zip((dst.q_proj, dst.k_proj, dst.v_proj), qkv.weight.chunk(3, dim=0)):
                proj.weight.copy_(weight)
            for proj, bias in zip((dst.q_proj, dst.k_proj, dst.v_proj),
                                  qkv.bias.chunk(3) if qkv.bias is not None else [torch.zeros_like(dense.bias)] * 3):
                proj.bias.copy_(bias)
            dst.out_proj.weight.copy_(dense.weight)
            dst.out_proj.bias.copy_(dense.bias)

        with torch.no_grad():
            pairs = [(out.time_norm, layer.temporal_layernorm), (out.time_proj, layer.temporal_dense),
                     (out.space_norm, layer.layernorm_before), (out.ff_norm, layer.layernorm_after),
                     (out.fc1, layer.intermediate.dense), (out.fc2, layer.output.dense)]
            for dst, src in pairs:
                dst.weight.copy_(src.weight)
                dst.bias.copy_(src.bias)
            attention(out.time_attn, layer.temporal_attention)
            attention(out.space_attn, layer.attention)
        return out

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, ff_dim={self.ff_dim}"
