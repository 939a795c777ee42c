"""Masks given as data: key padding, per-row key masks, tokens to padding, and the '1 = blocked' conversion.

Dense boolean tensors (:func:`~attnlab.masks.base.dense`) live in :mod:`.base`, beside
:func:`~attnlab.masks.base.as_mask`, which turns a tensor given as ``mask=`` into one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import Mask, _bidx, _blocks, _int_tensor, _preview, dense, tile_kinds


class _Padding(Mask):
    depends = frozenset({"b", "k"})

    def __init__(self, lengths: Tensor, longest: int, any_empty: bool):
        self.lengths = lengths
        self.longest, self.any_empty = longest, any_empty  # host copies: no GPU sync to validate

    @property
    def batch_size(self):
        return self.lengths.shape[0]

    def validate(self, n_q, n_k):
        if self.longest > n_k:
            raise ValueError(f"padding: lengths must be in [0, {n_k}] for a call with M={n_k} keys, got "
                             f"{self.longest} (lengths={_preview(self.lengths)})")

    def allows(self, b, h, q, k, n_q, n_k):
        lengths = self.lengths.to(k.device)
        return k < lengths[_bidx(b, lengths.shape[0])]

    def block_kinds(self, n_q, n_k, block_q, block_k, device=None):
        self.validate(n_q, n_k)
        klo, khi = _blocks(n_k, block_k, device)
        lengths = self.lengths.to(device).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
        return tile_kinds(khi.view(1, 1, 1, -1) < lengths, klo.view(1, 1, 1, -1) < lengths)

    def has_empty_rows(self, n_q, n_k, device=None, batch=None):
        return self.any_empty

    def row_interval(self, n_q, n_k, device=None):
        self.validate(n_q, n_k)
        hi = self.lengths.to(device).view(-1, 1).expand(-1, n_q)
        return torch.zeros_like(hi), hi

    def to(self, device):
        return _Padding(self.lengths.to(device), self.longest, self.any_empty)

    def __repr__(self):
        return f"padding(lengths={self.lengths.tolist()})"


class _KeyMask(Mask):
    depends = frozenset({"b", "k"})

    def __init__(self, keep: Tensor):
        self.keep = keep  # (B, M) bool

    @property
    def batch_size(self):
        return self.keep.shape[0]

    def validate(self, n_q, n_k):
        if n_k != self.keep.shape[1]:
            raise ValueError(f"key mask covers {self.keep.shape[1]} keys but the call has n_k={n_k}")

    def allows(self, b, h, q, k, n_q, n_k):
        self.validate(n_q, n_k)
        return self.keep.to(k.device)[_bidx(b, self.keep.shape[0]), k]

    def row_interval(self, n_q, n_k, device=None):
        self.validate(n_q, n_k)
        keep = self.keep.to(device)
        count = keep.sum(-1)  # (B,)
        prefix = torch.arange(n_k, device=device).view(1, -1) < count.view(-1, 1)
        if not bool(torch.equal(prefix, keep)):  # not "the first count keys": no interval
            return None
        hi = count.view(-1, 1).expand(-1, n_q)
        return torch.zeros_like(hi), hi

    def to(self, device):
        return _KeyMask(self.keep.to(device))

    def __repr__(self):
        return f"key_mask(shape={tuple(self.keep.shape)})"


def padding(lengths: Sequence[int] | Tensor) -> Mask:
    """Key padding: in batch row ``b`` only keys ``0 .. lengths[b]-1`` may be attended."""
    t = _int_tensor(lengths, "padding: lengths", (1,))
    host = t.cpu()  # one copy (a sync for a GPU tensor); every size read below is a host int
    if (host < 0).any():
        raise ValueError(f"padding: lengths must be >= 0, got {host.tolist()}")
    longest = int(host.max()) if host.numel() else 0
    return _Padding(t, longest, bool((host == 0).any()))


def key_mask(keep: Tensor) -> Mask:
    """Per-row key mask from a boolean ``(B, M)`` tensor (True = key may be attended)."""
    keep = torch.as_tensor(keep)
    if keep.dtype != torch.bool or keep.ndim != 2:
        raise ValueError(f"key_mask: keep must be a 2-D bool tensor (B, M), got {keep.dtype} {tuple(keep.shape)}")
    return _KeyMask(keep)


def padding_from_tokens(tokens: Tensor, pad_id: int = 0) -> Mask:
    """Key padding mask from a batch of token ids ``(B, M)``: keys equal to ``pad_id`` are hidden.

    This is the tutorials' ``create_padding_mask(seq, pad_token=0)`` (which returns
    ``1`` where padding is) expressed in attnlab's sign: allowed where *not* padding.
    """
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"padding_from_tokens: tokens must be (B, M), got shape {tuple(tokens.shape)}")
    return _KeyMask(tokens != pad_id)


def from_blocked(blocked: Tensor) -> Mask:
    """Convert the tutorials' convention (``1``/``True`` = blocked, added as ``-1e9``) to a mask.

    Accepts the look-ahead mask ``triu(ones, 1)`` (N, M), the padding mask
    ``(B, 1, 1, M)`` or anything broadcastable to ``(B, H, N, M)``; nonzero means blocked.
    """
    blocked = torch.as_tensor(blocked)
    return dense(blocked == 0)
