"""Tests of attnlab.layers: multi-head attention (torch parity, KV cache, masks, errors),
Bahdanau/Luong attention against their formulas, and 2-D spatial self-attention."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab import masks
from attnlab.layers import (
    AdditiveAttention,
    KVCache,
    LuongAttention,
    MultiHeadAttention,
    SpatialSelfAttention,
)
from attnlab.mechanisms import Exact, Mechanism
from helpers import TOL


def close(a, b, dtype=None):
    dtype = dtype or a.dtype
    torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- parity with torch.nn.MultiheadAttention ---------------------------------------------


@pytest.mark.parametrize("masking", ["none", "key_padding", "causal", "both"])
def test_parity_with_torch_mha(masking):
    B, N, dim, heads = 3, 13, 36, 9
    mha = nn.MultiheadAttention(dim, heads, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()  # torch zero-initializes biases: make them count
        mha.out_proj.bias.normal_()
    ours = MultiHeadAttention.from_torch(mha).eval()
    x = torch.randn(B, N, dim)

    kpm = None  # torch: True = ignore
    attn_mask = None  # torch bool: True = not allowed
    mask = None
    if masking in ("key_padding", "both"):
        lengths = torch.tensor([13, 4, 9])
        kpm = torch.arange(N)[None, :] >= lengths[:, None]
        mask = masks.key_mask(~kpm)
    if masking in ("causal", "both"):
        attn_mask = torch.ones(N, N, dtype=torch.bool).triu(1)
        mask = masks.causal() if mask is None else mask & masks.causal()

    ref_out, ref_w = mha(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=True,
                         average_attn_weights=False)
    _, ref_avg = mha(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=True)
    out, w = ours(x, mask=mask, return_weights=True)
    close(out, ref_out)
    close(w, ref_w)
    close(w.mean(1), ref_avg)
    close(ours(x, mask=mask), ref_out)  # the weight-free (fast backend) path too


def test_from_torch_cross_attention_kdim_vdim_no_bias():
    B, N, M, dim, heads = 2, 5, 11, 20, 4
    mha = nn.MultiheadAttention(dim, heads, bias=False, kdim=7, vdim=3, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(mha).eval()
    assert ours.q_proj.bias is None and ours.out_proj.bias is None
    q, k, v = torch.randn(B, N, dim), torch.randn(B, M, 7), torch.randn(B, M, 3)
    ref, _ = mha(q, k, v, need_weights=False)
    close(ours(q, k, v), ref)


def test_from_torch_float_attn_mask_is_bias():
    B, N, dim, heads = 2, 6, 16, 2
    mha = nn.MultiheadAttention(dim, heads, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(mha).eval()
    x = torch.randn(B, N, dim)
    float_mask = torch.randn(N, N)
    ref, _ = mha(x, x, x, attn_mask=float_mask)
    close(ours(x, bias=float_mask), ref)


def test_from_torch_rejects_add_bias_kv():
    mha = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(mha)


# -- KV cache: incremental decoding equals the full forward ------------------------------


class _ToyRotary:
    """A rotary-style q/k transform (rotate feature pairs by position * freq); records positions."""

    def __init__(self, head_dim: int):
        self.freq = 1.0 / (10.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.seen: list[tuple[list[int], list[int]]] = []

    def _rot(self, x, pos):
        ang = (pos.to(torch.float64)[:, None] * self.freq[None, :]).to(x.dtype)  # (L, D/2)
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)

    def apply(self, q, k, q_positions, k_positions):
        self.seen.append((q_positions.tolist(), k_positions.tolist()))
        return self._rot(q, q_positions), self._rot(k, k_positions)


@pytest.mark.parametrize("chunks", [[1] * 11, [3, 1, 5, 2], [11]])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
def test_cached_decoding_equals_full_causal_gqa(chunks, grad, rotary):
    B, T, dim, heads, kv_heads, hd = 2, 11, 30, 6, 2, 40
    layer = MultiHeadAttention(dim, heads, kv_heads=kv_heads, head_dim=hd).double().eval()
    x = torch.randn(B, T, dim, dtype=torch.float64)
    pos = _ToyRotary(hd) if rotary else None
    full = layer(x, mask=masks.causal(), positional=pos)
    cache = KVCache(capacity=2)
    outs, t = [], 0
    with torch.set_grad_enabled(grad):
        for c in chunks:
            outs.append(layer(x[:, t : t + c], mask=masks.causal(), cache=cache, positional=pos))
            t += c
    close(torch.cat(outs, dim=1), full)
    assert cache.length == T and cache.k.shape == (B, kv_heads, T, hd)
    if rotary:  # positions continue from the cache length
        starts = [0, *torch.tensor(chunks).cumsum(0).tolist()[:-1]]
        assert [s[0][0] for s in pos.seen[1:]] == starts


def test_cached_decoding_with_layer_rotary_slot():
    positional = pytest.importorskip("attnlab.positional")
    layer = MultiHeadAttention(36, 9, kv_heads=3, positional=positional.RotaryEmbedding(4)).double().eval()
    x = torch.randn(2, 6, 36, dtype=torch.float64)
    full = layer(x, mask=masks.causal())
    cache = KVCache()
    with torch.no_grad():
        steps = [layer(x[:, i : i + 1], mask=masks.causal(), cache=cache) for i in range(6)]
    close(torch.cat(steps, dim=1), full)
    # the rotary transform is in effect: without it the output differs
    plain = MultiHeadAttention(36, 9, kv_heads=3).double().eval()
    plain.load_state_dict(layer.state_dict())
    assert not torch.allclose(plain(x, mask=masks.causal()), full)


def test_static_cache_cross_attention_step_by_step():
    B, N, M, dim, heads = 3, 7, 9, 24, 6
    layer = MultiHeadAttention(dim, heads, kv_heads=3, kdim=10, vdim=10).double().eval()
    memory = torch.randn(B, M, 10, dtype=torch.float64)
    y = torch.randn(B, N, dim, dtype=torch.float64)
    mem_mask = masks.padding(torch.tensor([9, 2, 5]))
    full = layer(y, memory, mask=mem_mask)

    calls = []
    layer.k_proj.register_forward_hook(lambda *a: calls.append(1))
    cache = KVCache(static=True)
    outs = [layer(y[:, :1], memory, mask=mem_mask, cache=cache)]
    outs += [layer(y[:, i : i + 1], mask=mem_mask, cache=cache) for i in range(1, N)]  # key=None from the cache
    close(torch.cat(outs, dim=1), full)
    assert len(calls) == 1, "encoder keys must be projected once"
    assert cache.length == M


def test_kv_cache_growth_reorder_and_errors():
    cache = KVCache(capacity=2)
    ks = [torch.randn(2, 3, t, 5) for t in (1, 2, 4)]
    vs = [torch.randn(2, 3, t, 4) for t in (1, 2, 4)]
    caps = []
    for k, v in zip(ks, vs):
        cache.append(k, v)
        caps.append(cache.capacity)
    assert caps == [2, 4, 8]
    assert torch.equal(cache.k, torch.cat(ks, dim=2)) and torch.equal(cache.v, torch.cat(vs, dim=2))
    cache.reorder(torch.tensor([1, 1, 0]))
    assert torch.equal(cache.k, torch.cat(ks, dim=2)[[1, 1, 0]])
    with pytest.raises(ValueError, match="do not match"):
        cache.append(torch.randn(3, 3, 1, 6), torch.randn(3, 3, 1, 4))
    with pytest.raises(ValueError, match="static"):
        KVCache(static=True).append(ks[0], vs[0])
    with pytest.raises(ValueError, match="capacity"):
        KVCache(capacity=0)
    cache.reset()
    assert cache.length == 0 and cache.k is None


def test_growing_cache_rejects_cross_attention():
    layer = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="static"):
        layer(torch.randn(1, 1, 8), torch.randn(1, 3, 8), cache=KVCache())


# -- masks: padded batches, leaks, fully masked rows -------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_padded_batch_equals_rows_one_by_one(causal):
    lengths = [5, 1, 8]
    B, T, dim, heads = 3, 8, 18, 3
    layer = MultiHeadAttention(dim, heads, kv_heads=1).double().eval()
    x = torch.randn(B, T, dim, dtype=torch.float64)
    mask = masks.padding(torch.tensor(lengths))
    if causal:
        mask = mask & masks.causal()
    out = layer(x, mask=mask)
    for b, n in enumerate(lengths):
        one = layer(x[b : b + 1, :n], mask=masks.causal() if causal else None)
        close(out[b, :n], one[0])


def test_changing_a_masked_key_does_not_move_the_output():
    B, T, dim, heads = 2, 9, 16, 4
    layer = MultiHeadAttention(dim, heads).double().eval()
    x = torch.randn(B, T, dim, dtype=torch.float64)
    out = layer(x, mask=masks.causal())
    x2 = x.clone()
    x2[:, 6:] += 10 * torch.randn(B, 3, dim, dtype=torch.float64)  # future of positions 0..5
    out2 = layer(x2, mask=masks.causal())
    close(out2[:, :6], out[:, :6])
    assert not torch.allclose(out2[:, 6:], out[:, 6:])  # the perturbation is visible where allowed

    # cross-attention: a hidden memory position cannot influence any query
    mem = torch.randn(B, 5, dim, dtype=torch.float64)
    keep = torch.tensor([[True, True, False, True, False], [False, True, True, True, True]])
    ref = layer(x, mem, mask=keep[:, None, None, :])
    mem2 = mem.masked_fill(~keep[..., None], 123.0)
    close(layer(x, mem2, mask=masks.key_mask(keep)), ref)


@pytest.mark.parametrize("backend", ["math", "chunked", "sdpa"])
def test_fully_masked_rows_give_finite_output_and_gradients(backend):
    B, T, dim, heads = 2, 6, 12, 3
    layer = MultiHeadAttention(dim, heads, mechanism=Exact(backend=backend)).double()
    x = torch.randn(B, T, dim, dtype=torch.float64, requires_grad=True)
    mask = masks.padding(torch.tensor([0, 4]))  # batch row 0 sees no key at all
    out = layer(x, mask=mask)
    close(out[0], layer.out_proj.bias.expand(T, dim))  # zero attention -> only the output bias
    out.square().sum().backward()
    for name, p in [("x", x), *layer.named_parameters()]:
        assert torch.isfinite(p.grad).all(), name
    assert x.grad[1].abs().sum() > 0


# -- weights, mechanisms, options --------------------------------------------------------


def test_return_weights_shapes_and_rows():
    B, N, M, dim = 2, 4, 7, 24
    layer = MultiHeadAttention(dim, 6, kv_heads=2).eval()
    out, w = layer(torch.randn(B, N, dim), torch.randn(B, M, dim), mask=masks.padding(torch.tensor([7, 3])),
                   return_weights=True)
    assert out.shape == (B, N, dim) and w.shape == (B, 6, N, M)
    close(w.sum(-1), torch.ones(B, 6, N))
    assert (w[1, :, :, 3:] == 0).all()


class _Recorder(Mechanism):
    name = "_recorder"

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        self.calls.append((q.shape, k.shape, v.shape, mask, bias, return_weights))
        return torch.zeros_like(q)


def test_mechanism_slot_receives_heads_mask_and_bias():
    rec = _Recorder()
    layer = MultiHeadAttention(27, 9, kv_heads=3, mechanism=rec)
    m, bias = masks.causal(), torch.zeros(1, 9, 5, 5)
    out = layer(torch.randn(2, 5, 27), mask=m, bias=bias)
    assert rec.calls == [((2, 9, 5, 3), (2, 3, 5, 3), (2, 3, 5, 3), m, bias, False)]
    close(out, layer.out_proj.bias.expand(2, 5, 27))


@pytest.mark.parametrize("backend", ["math", "chunked", "sdpa", "reference"])
def test_backends_agree_inside_the_layer(backend):
    layer = MultiHeadAttention(20, 5, kv_heads=5).double().eval()
    x = torch.randn(2, 9, 20, dtype=torch.float64)
    mask = masks.sliding_window(3, 1)
    ref = layer(x, mask=mask)
    other = MultiHeadAttention(20, 5, mechanism=Exact(backend=backend)).double().eval()
    other.load_state_dict(layer.state_dict())
    with torch.no_grad():  # the NumPy reference has no autograd
        close(other(x, mask=mask), ref)


def test_dropout_only_in_training():
    layer = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 8, 16)
    layer.eval()
    close(layer(x), layer(x))
    layer.train()
    assert not torch.allclose(layer(x), layer.eval()(x))


def test_projection_init_is_xavier_uniform():
    layer = MultiHeadAttention(64, 4, kv_heads=2, head_dim=40)
    assert layer.k_proj.weight.shape == (80, 64)
    for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
        fan_out, fan_in = lin.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert lin.weight.abs().max() <= bound
        assert lin.weight.abs().max() > 0.9 * bound  # uses the range, not a smaller init
        assert (lin.bias == 0).all()


# -- argument errors ---------------------------------------------------------------------


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"dim=10.*heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match=r"kv_heads=4.*heads=6"):
        MultiHeadAttention(12, 6, kv_heads=4)
    with pytest.raises(ValueError, match="heads"):
        MultiHeadAttention(12, 0)
    layer = MultiHeadAttention(12, 3, kdim=5)
    with pytest.raises(ValueError, match="query"):
        layer(torch.randn(4, 12))
    with pytest.raises(ValueError, match="key"):
        layer(torch.randn(1, 4, 12), torch.randn(1, 3, 12))
    with pytest.raises(ValueError, match="kdim"):
        layer(torch.randn(1, 4, 12))  # self-attention with kdim != dim
    with pytest.raises(ValueError, match="value"):
        MultiHeadAttention(12, 3)(torch.randn(1, 4, 12), value=torch.randn(1, 4, 12))
    with pytest.raises(ValueError, match="positional"):
        MultiHeadAttention(12, 3)(torch.randn(1, 4, 12), torch.randn(1, 2, 12), positional=_ToyRotary(4))


# -- torch's argument order ------------------------------------------------------------


def test_third_positional_argument_is_dropout_as_in_torch():
    layer = MultiHeadAttention(512, 8, 0.1)
    torch_layer = nn.MultiheadAttention(512, 8, 0.1)
    assert layer.mechanism.dropout == torch_layer.dropout == 0.1
    assert (layer.embed_dim, layer.num_heads, layer.kv_heads) == (512, 8, 8)
    assert MultiHeadAttention(16, 4, 0.1, False).q_proj.bias is None
    assert MultiHeadAttention(16, 4, 0).mechanism.dropout == 0.0  # int 0 is a dropout, not kv_heads
    with pytest.raises(TypeError):
        MultiHeadAttention(16, 4, 0.1, True, 2)  # kv_heads and the rest are keyword-only


def test_from_torch_keeps_dropout_and_heads():
    mha = nn.MultiheadAttention(24, 6, 0.25, batch_first=True)
    ours = MultiHeadAttention.from_torch(mha)
    assert (ours.embed_dim, ours.num_heads, ours.kv_heads, ours.mechanism.dropout) == (24, 6, 6, 0.25)


# -- Bahdanau and Luong ------------------------------------------------------------------


def _softmax_loop(scores, allowed):
    """Masked softmax over the last dim written out per row; empty rows -> zeros."""
    out = torch.zeros_like(scores)
    for idx in torch.cartesian_prod(*[torch.arange(s) for s in scores.shape[:-1]]):
        idx = tuple(idx.tolist())
        ok = allowed[idx]
        if ok.any():
            e = torch.where(ok, torch.exp(scores[idx] - scores[idx][ok].max()), torch.zeros(()).double())
            out[idx] = e / e.sum()
    return out


def _hand_scores(layer, q, k):
    B, N, M = q.shape[0], q.shape[1], k.shape[1]
    s = torch.empty(B, N, M, dtype=torch.float64)
    for b in range(B):
        for n in range(N):
            for m in range(M):
                qs, h = q[b, n], k[b, m]
                if isinstance(layer, AdditiveAttention):
                    w1, b1 = layer.key_proj.weight, layer.key_proj.bias
                    w2, v = layer.query_proj.weight, layer.score_proj.weight[0]
                    s[b, n, m] = v @ torch.tanh(w1 @ h + b1 + w2 @ qs)
                elif layer.score == "dot":
                    s[b, n, m] = qs @ h
                elif layer.score == "general":
                    s[b, n, m] = qs @ (layer.key_proj.weight @ h)
                else:
                    w, v = layer.concat_proj.weight, layer.score_proj.weight[0]
                    s[b, n, m] = v @ torch.tanh(w @ torch.cat([qs, h]))
    return s


def _classic(kind):
    if kind == "additive":
        return AdditiveAttention(6, 5, 7).double()
    return LuongAttention(6, 6 if kind == "dot" else 5, score=kind, hidden_dim=7 if kind == "concat" else None).double()


@pytest.mark.parametrize("kind", ["additive", "dot", "general", "concat"])
@pytest.mark.parametrize("mask_kind", ["none", "bool_keys", "padding", "causal"])
def test_classic_attention_matches_formula(kind, mask_kind):
    layer = _classic(kind)
    B, N, M = 2, 4, 4
    q = torch.randn(B, N, 6, dtype=torch.float64)
    k = torch.randn(B, M, layer.key_dim, dtype=torch.float64)
    v = torch.randn(B, M, 3, dtype=torch.float64)
    allowed = torch.ones(B, N, M, dtype=torch.bool)
    mask = None
    if mask_kind == "bool_keys":
        mask = torch.tensor([[True, False, True, True], [False, False, False, False]])  # row 1 fully masked
        allowed = mask[:, None, :].expand(B, N, M)
    elif mask_kind == "padding":
        mask = masks.padding([3, 1])
        allowed = (torch.arange(M) < torch.tensor([3, 1])[:, None])[:, None, :].expand(B, N, M)
    elif mask_kind == "causal":
        mask = masks.causal()
        allowed = torch.ones(N, M, dtype=torch.bool).tril().expand(B, N, M)
    ctx, w = layer(q, k, v, mask=mask)
    ref_w = _softmax_loop(_hand_scores(layer, q, k), allowed)
    close(w, ref_w)
    close(ctx, ref_w @ v)
    assert torch.isfinite(ctx).all()


def test_luong_dot_is_unscaled_softmax_attention():
    q, k, v = torch.randn(3, 5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 2)
    ctx, w = LuongAttention(8, 8, "dot")(q, k, v)
    ref_w = torch.softmax(q @ k.transpose(1, 2), dim=-1)
    close(w, ref_w)
    close(ctx, ref_w @ v)


@pytest.mark.parametrize("kind", ["additive", "dot", "general", "concat"])
def test_classic_single_step_query_and_fully_masked_gradients(kind):
    layer = _classic(kind)
    q = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, layer.key_dim, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[False] * 5, [True, True, False, True, False]])
    ctx, w = layer(q, k, mask=keep)
    assert ctx.shape == (2, layer.key_dim) and w.shape == (2, 5)
    assert (ctx[0] == 0).all() and (w[0] == 0).all()
    close(w[1].sum(), torch.tensor(1.0, dtype=torch.float64))
    # values default to keys; a masked key does not move the context
    k2 = k.detach().clone()
    k2[1, [2, 4]] = 7.0
    close(layer(q, k2, mask=keep)[0][1], ctx[1])
    (ctx.sum() + w.square().sum()).backward()
    for t in (q, k, *layer.parameters()):
        assert torch.isfinite(t.grad).all()


def test_classic_bad_arguments():
    with pytest.raises(ValueError, match="query_dim == key_dim"):
        LuongAttention(4, 5, "dot")
    with pytest.raises(ValueError, match="score"):
        LuongAttention(4, 4, "bilinear")
    layer = AdditiveAttention(4, 5, 3)
    with pytest.raises(ValueError, match="query"):
        layer(torch.randn(2, 3, 3, 4), torch.randn(2, 6, 5))
    with pytest.raises(ValueError, match="keys"):
        layer(torch.randn(2, 4), torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match="key mask"):
        layer(torch.randn(2, 4), torch.randn(2, 6, 5), mask=torch.ones(2, 5, dtype=torch.bool))


# -- spatial self-attention --------------------------------------------------------------


def _spatial_direct(layer, x):
    """The layer spelled out with einsum on the conv weights."""
    B, C, Hh, Ww = x.shape
    h = layer.heads

    def conv(c, t):
        return torch.einsum("oi,bihw->bohw", c.weight[:, :, 0, 0], t) + c.bias[None, :, None, None]

    q = conv(layer.q, x).reshape(B, h, -1, Hh * Ww)  # (B, h, Dqk, L)
    k = conv(layer.k, x).reshape(B, h, -1, Hh * Ww)
    v = conv(layer.v, x).reshape(B, h, -1, Hh * Ww)  # (B, h, Dv, L)
    s = torch.einsum("bhdi,bhdj->bhij", q, k) / math.sqrt(q.shape[2])
    a = torch.softmax(s, dim=-1)
    o = torch.einsum("bhij,bhdj->bhdi", a, v).reshape(B, C, Hh, Ww)
    o = conv(layer.proj, o)
    if layer.residual == "add":
        o = x + o
    elif layer.residual == "gamma":
        o = x + layer.gamma * o
    return o, a


@pytest.mark.parametrize("residual", ["none", "add", "gamma"])
@pytest.mark.parametrize("backend", ["auto", "chunked"])
def test_spatial_matches_einsum(residual, backend):
    layer = SpatialSelfAttention(12, heads=3, qk_channels=6, residual=residual, backend=backend).double().eval()
    if residual == "gamma":
        with torch.no_grad():
            layer.gamma.fill_(0.7)
    x = torch.randn(2, 12, 5, 7, dtype=torch.float64)
    out = layer(x)
    ref, ref_a = _spatial_direct(layer, x)
    assert out.shape == x.shape
    close(out, ref)
    if backend == "auto":  # weights come from the math backend
        _, w = layer(x, return_weights=True)
        close(w, ref_a)


def test_spatial_gradients_flow_and_gamma_starts_at_identity():
    x = torch.randn(2, 8, 4, 3, requires_grad=True)
    layer = SpatialSelfAttention(8, heads=2)
    layer(x).square().sum().backward()
    for name, p in [("x", x), *layer.named_parameters()]:
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name

    sagan = SpatialSelfAttention(8, heads=2, qk_channels=2, residual="gamma")
    close(sagan(x), x)
    sagan(x).sum().backward()
    assert sagan.gamma.grad.abs() > 0


def test_spatial_bad_arguments():
    with pytest.raises(ValueError, match="heads"):
        SpatialSelfAttention(10, heads=3)
    with pytest.raises(ValueError, match="residual"):
        SpatialSelfAttention(8, residual="sagan")
    with pytest.raises(ValueError, match="x must be"):
        SpatialSelfAttention(8)(torch.randn(8, 4, 4))
    with pytest.raises(ValueError, match="channels"):
        SpatialSelfAttention(8)(torch.randn(1, 6, 4, 4))
