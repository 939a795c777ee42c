"""Tests of attnlab.positional: absolute codes, rotary, ALiBi and T5 relative bias."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import attnlab
from attnlab import masks
from attnlab.exact import chunked_attention, make_call
from attnlab.positional import (
    ALiBi,
    LearnedPositional,
    RotaryEmbedding,
    SinusoidalND,
    SinusoidalPositional,
    T5RelativeBias,
    alibi_slopes,
    relative_position_bucket,
)
from helpers import rand_qkv, tol


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _chunked(q, k, v, block=64, **kw):
    """The chunked backend with small tiles, so N=300 spans several of them."""
    return chunked_attention(make_call(q, k, v, **kw), block_q=block, block_k=block)


# ------------------------------------------------------------------ sinusoidal (1-D)


def _seed_formula(n: int, d: int, dtype=torch.float32) -> torch.Tensor:
    """The seeds' PositionalEncoding, written as they write it (even d)."""
    pe = torch.zeros(n, d, dtype=dtype)
    position = torch.arange(0, n, dtype=dtype).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=dtype) * (-math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


@pytest.mark.parametrize("dim", [2, 40, 64])
def test_sinusoidal_matches_seed_formula(dim):
    enc = SinusoidalPositional(dim)
    # the seeds compute in float32; exact in float64
    torch.testing.assert_close(enc.table(97).float(), _seed_formula(97, dim))
    torch.testing.assert_close(enc.table(97), _seed_formula(97, dim, torch.float64), **tol(torch.float64))
    x = torch.randn(3, 97, dim, generator=_gen())
    torch.testing.assert_close(enc(x), x + _seed_formula(97, dim))


def test_sinusoidal_odd_dim_ends_with_a_sine():
    d = 59
    pos = torch.arange(50, dtype=torch.float64).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))  # 30 frequencies
    want = torch.zeros(50, d, dtype=torch.float64)
    want[:, 0::2] = torch.sin(pos * div)
    want[:, 1::2] = torch.cos(pos * div[:29])
    torch.testing.assert_close(SinusoidalPositional(d).table(50), want, **tol(torch.float64))


def test_sinusoidal_any_length_offset_and_dtype():
    enc = SinusoidalPositional(40)
    x = torch.randn(2, 9, 40, generator=_gen())
    enc(x)  # caches a short table first; a long request must grow it
    long = enc.table(3000)
    torch.testing.assert_close(long[2990:], _seed_formula(3000, 40, torch.float64)[2990:], **tol(torch.float64))
    # KV-cached decoding: the positions of a suffix are its absolute ones
    full = enc(x)
    torch.testing.assert_close(enc(x[:, 5:], offset=5), full[:, 5:])
    torch.testing.assert_close(enc(x[:, 8:9], offset=8), full[:, 8:9])
    xb = x.to(torch.bfloat16)
    assert enc(xb).dtype == torch.bfloat16
    assert not list(enc.state_dict())  # the table is a cache, not a weight
    with pytest.raises(ValueError, match="offset"):
        enc(x, offset=-1)
    with pytest.raises(ValueError, match="dim=40"):
        enc(torch.randn(2, 9, 41))


# ------------------------------------------------------------------ learned


def test_learned_offsets_and_gradient():
    enc = LearnedPositional(16, max_len=12)
    x = torch.randn(2, 12, 16, generator=_gen())
    full = enc(x)
    torch.testing.assert_close(full, x + enc.weight)
    torch.testing.assert_close(enc(x[:, 7:10], offset=7), full[:, 7:10])
    full.sum().backward()
    torch.testing.assert_close(enc.weight.grad, torch.full((12, 16), 2.0))


@pytest.mark.parametrize("n,offset", [(13, 0), (5, 8), (1, 12)])
def test_learned_beyond_max_len_names_max_len(n, offset):
    enc = LearnedPositional(8, max_len=12)
    with pytest.raises(ValueError, match=r"max_len=12") as info:
        enc(torch.randn(1, n, 8), offset=offset)
    assert f"length {n}" in str(info.value)
    assert f"needs {n + offset}" in str(info.value)


# ------------------------------------------------------------------ N-D sinusoidal


@pytest.mark.parametrize("grid,dim", [((4, 6), 16), ((3, 4, 5), 24), ((1, 7), 8), ((97,), 40)])
def test_sinusoidal_nd_shapes_and_distinct_codes(grid, dim):
    enc = SinusoidalND(dim, grid)
    table = enc.table()
    n = math.prod(grid)
    assert table.shape == (n, dim)
    # every pair of cells has a different code
    dist = torch.cdist(table, table)  # (n, n)
    off_diag = dist[~torch.eye(n, dtype=torch.bool)]
    assert off_diag.numel() == 0 or float(off_diag.min()) > 1e-3
    x = torch.randn(2, n, dim, generator=_gen())
    torch.testing.assert_close(enc(x), x + table.float())
    torch.testing.assert_close(enc(x[:, 3:], offset=3), enc(x)[:, 3:])


def test_sinusoidal_nd_axis_split():
    """Slice a of the channels is the 1-D code of the coordinate along axis a (row-major cells)."""
    T, H, W, dim = 3, 4, 5, 36
    table = SinusoidalND(dim, (T, H, W)).table().view(T, H, W, dim)  # (T, H, W, dim)
    one_d = SinusoidalPositional(dim // 3)
    torch.testing.assert_close(table[..., 0:12], one_d.table(T).view(T, 1, 1, 12).expand(T, H, W, 12))
    torch.testing.assert_close(table[..., 12:24], one_d.table(H).view(1, H, 1, 12).expand(T, H, W, 12))
    torch.testing.assert_close(table[..., 24:36], one_d.table(W).view(1, 1, W, 12).expand(T, H, W, 12))
    # a one-axis grid is the 1-D code
    torch.testing.assert_close(SinusoidalND(40, (97,)).table(), SinusoidalPositional(40).table(97))


def test_sinusoidal_nd_errors():
    with pytest.raises(ValueError, match="multiple of 2 \\* len\\(grid\\) = 6"):
        SinusoidalND(20, (2, 3, 4))
    with pytest.raises(ValueError, match="multiple of 2 \\* len\\(grid\\) = 4"):
        SinusoidalND(6, (2, 3))
    with pytest.raises(ValueError, match="grid"):
        SinusoidalND(8, (2, 0))
    enc = SinusoidalND(8, (2, 3))
    with pytest.raises(ValueError, match=r"grid \(2, 3\) has only 6 cells"):
        enc(torch.randn(1, 4, 8), offset=3)


# ------------------------------------------------------------------ rotary


def _complex_rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE as complex multiplication, channel j paired with j + D/2 (float64)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (D/2,)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double())
    rot = torch.polar(torch.ones_like(theta), pos.double().unsqueeze(-1) * theta)  # (P, D/2)
    z = z * rot
    return torch.cat((z.real, z.imag), dim=-1)


def test_rotary_equals_complex_implementation():
    rope = RotaryEmbedding(40)
    q, k, _ = rand_qkv(2, 9, 7, 40, M=11, Hkv=3, dtype=torch.float64, draw_dtype=None)
    qp = torch.tensor([0, 1, 5, 9, 100, 2047, 3])
    kp = torch.arange(11) * 3
    qr, kr = rope.apply(q, k, qp, kp)
    torch.testing.assert_close(qr, _complex_rope(q, qp), **tol(torch.float64))
    torch.testing.assert_close(kr, _complex_rope(k, kp), **tol(torch.float64))


def test_rotary_scores_depend_only_on_offset():
    rope = RotaryEmbedding(40)
    q, k, _ = rand_qkv(2, 6, 5, 40, M=8, Hkv=2, dtype=torch.float64, draw_dtype=None)
    g = _gen(1)
    qp = torch.randint(0, 500, (2, 5), generator=g)  # per-batch positions (B, N)
    kp = torch.randint(0, 500, (2, 8), generator=g)

    def scores(shift):
        qr, kr = rope.apply(q, k, qp + shift, kp + shift)
        return qr.view(2, 2, 3, 5, 40) @ kr.unsqueeze(2).transpose(-1, -2)  # (B, Hkv, G, N, M)

    torch.testing.assert_close(scores(0), scores(1234), atol=1e-9, rtol=1e-9)
    assert not torch.allclose(scores(0), (q.view(2, 2, 3, 5, 40) @ k.unsqueeze(2).transpose(-1, -2)))
    # rotation keeps norms
    torch.testing.assert_close(rope.rotate(q, qp).norm(dim=-1), q.norm(dim=-1), **tol(torch.float64))


def test_rotary_interpolation_divides_positions():
    q, k, _ = rand_qkv(1, 2, 6, 16, M=6, Hkv=2, dtype=torch.float64, draw_dtype=None)
    pos = torch.tensor([0, 3, 8, 13, 40, 4096])
    plain, pi = RotaryEmbedding(16), RotaryEmbedding(16, interpolation_factor=4.0)
    torch.testing.assert_close(pi.rotate(q, pos), plain.rotate(q, pos / 4.0), **tol(torch.float64))
    # position 8 with factor 4 behaves like position 2
    torch.testing.assert_close(pi.rotate(q[:, :, :1], torch.tensor([8])), plain.rotate(q[:, :, :1], torch.tensor([2])))


def test_rotary_defaults_dtypes_and_errors():
    rope = RotaryEmbedding(8)
    q, k, _ = rand_qkv(1, 4, 3, 8, M=7, Hkv=2, dtype=torch.float32, draw_dtype=None)
    qr, kr = rope.apply(q, k)  # queries default to the last positions of the keys
    qr2, kr2 = rope.apply(q, k, torch.arange(4, 7), torch.arange(7))
    torch.testing.assert_close(qr, qr2)
    torch.testing.assert_close(kr, kr2)
    qb, kb = rope.apply(q.bfloat16(), k.bfloat16())
    assert qb.dtype == kb.dtype == torch.bfloat16
    torch.testing.assert_close(qb.float(), qr, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="head_dim must be a positive even int"):
        RotaryEmbedding(59)
    with pytest.raises(ValueError, match=r"positions must have shape"):
        rope.apply(q, k, torch.arange(4), torch.arange(7))
    with pytest.raises(ValueError, match="head_dim=8"):
        rope.apply(torch.randn(1, 4, 3, 6), torch.randn(1, 4, 3, 6))


def test_rotary_keeps_module_apply_working():
    """``apply`` is also nn.Module.apply: a parent's model.apply(init) must still recurse."""
    model = nn.Sequential(nn.Linear(4, 4), RotaryEmbedding(4))
    seen = []
    model.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "RotaryEmbedding", "Sequential"]


def test_rotary_cached_decoding_equals_full():
    """Keys rotated in pieces at their absolute positions equal keys rotated at once."""
    rope = RotaryEmbedding(16)
    q, k, v = rand_qkv(2, 4, 10, 16, M=10, Hkv=2, dtype=torch.float32, draw_dtype=None)
    qr, kr = rope.apply(q, k, torch.arange(10), torch.arange(10))
    full = attnlab.attention(qr, kr, v, mask=masks.causal(), backend="math")
    k_cached = torch.cat([rope.rotate(k[:, :, :6], torch.arange(6)), rope.rotate(k[:, :, 6:], torch.arange(6, 10))], 2)
    q_last, _ = rope.apply(q[:, :, 9:], k[:, :, :1], torch.tensor([9]), torch.tensor([0]))
    step = attnlab.attention(q_last, k_cached, v, mask=masks.causal(), backend="chunked")
    torch.testing.assert_close(step, full[:, :, 9:], **tol(torch.float32))


# ------------------------------------------------------------------ ALiBi


def test_alibi_slopes_paper_examples():
    # Press et al. 2022, section 3: 8 heads -> 1/2^1 .. 1/2^8; 16 heads -> 1/2^0.5 .. 1/2^8
    torch.testing.assert_close(torch.tensor(alibi_slopes(8)), 2.0 ** -torch.arange(1.0, 9.0))
    torch.testing.assert_close(torch.tensor(alibi_slopes(16)), 2.0 ** -(torch.arange(1.0, 17.0) / 2))
    assert alibi_slopes(1) == [2.0**-8]


@pytest.mark.parametrize("heads", [3, 6, 9, 12])
def test_alibi_slopes_non_power_of_two(heads):
    p = 2 ** int(math.log2(heads))
    want = [2.0 ** (-8 * i / p) for i in range(1, p + 1)]
    want += [2.0 ** (-8 * i / (2 * p)) for i in range(1, 2 * p + 1, 2)][: heads - p]
    torch.testing.assert_close(torch.tensor(alibi_slopes(heads)), torch.tensor(want))
    slopes = alibi_slopes(heads)
    assert len(set(slopes)) == heads


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("n,m", [(5, 5), (3, 8), (1, 4)])
def test_alibi_dense_values(symmetric, n, m):
    al = ALiBi(3, symmetric=symmetric)
    got = al.dense(n, m)  # (1, H, N, M)
    assert got.shape == (1, 3, n, m)
    qpos = torch.arange(n).view(n, 1) + (m - n)
    dist = (qpos - torch.arange(m).view(1, m)).float()
    if symmetric:
        dist = dist.abs()
    want = -torch.tensor(alibi_slopes(3)).view(1, 3, 1, 1) * dist
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "heads,kv_heads,n,m,symmetric",
    [(3, 3, 300, 300, False), (6, 2, 97, 300, False), (3, 1, 300, 200, False), (9, 9, 300, 300, True), (4, 2, 1, 97, False)],
)
def test_alibi_through_chunked_equals_dense_bias(heads, kv_heads, n, m, symmetric):
    al = ALiBi(heads, symmetric=symmetric)
    q, k, v = rand_qkv(1, heads, n, 40, M=m, Hkv=kv_heads, dtype=torch.float32, requires_grad=True, draw_dtype=None)
    mask = None if symmetric else masks.causal()
    want = attnlab.attention(q, k, v, bias=al.dense(n, m), mask=mask, backend="math")
    got = _chunked(q, k, v, bias=al.bias_fn(n, m), mask=mask)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    if n > m and mask is not None:
        assert float(got.detach()[:, :, : n - m].abs().max()) == 0.0  # rows before the first key see nothing
    # gradients to q, k, v agree too
    dout = torch.randn_like(want)
    g_want = torch.autograd.grad(want, (q, k, v), dout)
    g_got = torch.autograd.grad(got, (q, k, v), dout)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # the backends that take the function directly agree as well
    for backend in ("math", "sdpa", "chunked"):
        out = attnlab.attention(q, k, v, bias=al.bias_fn(n, m), mask=mask, backend=backend)
        torch.testing.assert_close(out, want, **tol(torch.float32))


def test_alibi_float64_and_head_mismatch():
    al = ALiBi(4).double()
    q, k, v = rand_qkv(1, 4, 70, 8, M=90, Hkv=4, dtype=torch.float64, draw_dtype=None)
    want = attnlab.attention(q, k, v, bias=al.dense(70, 90), mask=masks.causal(), backend="reference")
    got = _chunked(q, k, v, bias=al.bias_fn(70, 90), mask=masks.causal())
    torch.testing.assert_close(got, want, **tol(torch.float64))
    q8 = torch.randn(1, 8, 5, 8)
    with pytest.raises(ValueError, match="ALiBi was built for 4 heads but attention has 8"):
        attnlab.attention(q8, q8, q8, bias=ALiBi(4).bias_fn(5, 5), backend="math")
    with pytest.raises(ValueError, match="n_q"):
        al.bias_fn(0, 5)


# ------------------------------------------------------------------ T5 relative bias


def test_t5_buckets_bidirectional_hand_derived():
    # 32 buckets, bidirectional: 16 per side, exact below 8, log-spaced 8..15 up to 128
    rel = torch.tensor([0, -1, -7, 1, 7, -8, -16, -64, -127, -128, -1000, 1000, 8, 16])
    want = [0, 1, 7, 16 + 1, 16 + 7, 8, 8 + 2, 8 + 6, 15, 15, 15, 31, 16 + 8, 16 + 10]
    # -16: log(16/8)/log(128/8) * 8 = 2;  -64: log(8)/log(16) * 8 = 6;  -127: floor(7.98) = 7
    assert relative_position_bucket(rel).tolist() == want
    assert T5RelativeBias(2).bucket(rel).tolist() == want


def test_t5_buckets_causal_hand_derived():
    # 32 buckets, causal: all 32 for the past, exact below 16, log-spaced 16..31 up to 128
    rel = torch.tensor([0, -1, -15, -16, -32, -64, -1000, 1, 50])
    # -32: log(32/16)/log(128/16) * 16 = 16/3 -> 5;  -64: log(4)/log(8) * 16 = 32/3 -> 10
    want = [0, 1, 15, 16, 16 + 5, 16 + 10, 31, 0, 0]  # future keys (rel > 0) share bucket 0
    assert relative_position_bucket(rel, bidirectional=False).tolist() == want


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (6, 7)])
def test_t5_buckets_monotone_and_in_range(bidirectional, num_buckets, max_distance):
    d = torch.arange(0, 3 * max_distance)
    past = relative_position_bucket(-d, bidirectional, num_buckets, max_distance)
    assert bool((past[1:] >= past[:-1]).all())
    side = num_buckets // 2 if bidirectional else num_buckets
    assert int(past.min()) == 0 and int(past.max()) == side - 1
    assert bool((past[max_distance:] == side - 1).all())  # beyond max_distance: the last bucket
    future = relative_position_bucket(d[1:], bidirectional, num_buckets, max_distance)
    if bidirectional:
        torch.testing.assert_close(future, past[1:] + side)  # sign split: upper half mirrors
    else:
        assert bool((future == 0).all())


def test_t5_bucket_errors():
    with pytest.raises(ValueError, match="max_distance"):
        T5RelativeBias(2, num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_buckets"):
        T5RelativeBias(2, num_buckets=2)


@pytest.mark.parametrize("n,m", [(6, 6), (3, 9)])
def test_t5_dense_values(n, m):
    t5 = T5RelativeBias(3, num_buckets=8, max_distance=20)
    got = t5.dense(n, m)  # (1, H, N, M)
    w = t5.embedding.weight.detach()
    for i in range(n):
        for j in range(m):
            b = int(t5.bucket(torch.tensor(j - (i + m - n))))
            torch.testing.assert_close(got[0, :, i, j].detach(), w[b])


@pytest.mark.parametrize(
    "heads,kv_heads,n,m,bidirectional",
    [(3, 3, 300, 300, True), (4, 2, 97, 300, False), (2, 1, 300, 150, False), (3, 3, 1, 97, True)],
)
def test_t5_through_chunked_equals_math_with_gradients(heads, kv_heads, n, m, bidirectional):
    t5 = T5RelativeBias(heads, num_buckets=32, max_distance=128, bidirectional=bidirectional)
    with torch.no_grad():
        t5.embedding.weight.normal_(generator=_gen(5))  # large enough to matter
    q, k, v = rand_qkv(1, heads, n, 16, M=m, Hkv=kv_heads, dtype=torch.float32, requires_grad=True, draw_dtype=None)
    mask = None if bidirectional else masks.causal()
    dout = torch.randn(1, heads, n, 16, generator=_gen(7))

    def run(fn):
        # one .backward(): chunked reaches the embedding by a nested backward inside its
        # own backward, so torch.autograd.grad(out, (q, k, v)) would also fill .grad
        t5.zero_grad()
        for t in (q, k, v):
            t.grad = None
        out = fn()
        out.backward(dout)
        return out.detach(), (q.grad, k.grad, v.grad), t5.embedding.weight.grad.clone()

    want, g_want, e_want = run(lambda: attnlab.attention(q, k, v, bias=t5.dense(n, m), mask=mask, backend="math"))
    got, g_got, e_got = run(lambda: _chunked(q, k, v, bias=t5.bias_fn(n, m), mask=mask))
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert float(e_want.abs().max()) > 0
    torch.testing.assert_close(e_got, e_want, atol=1e-4, rtol=1e-4)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for backend in ("math", "sdpa"):
        out, _, e = run(lambda backend=backend: attnlab.attention(q, k, v, bias=t5.bias_fn(n, m), mask=mask, backend=backend))
        torch.testing.assert_close(out, want, **tol(torch.float32))
        torch.testing.assert_close(e, e_want, atol=1e-4, rtol=1e-4)


def test_t5_gradient_through_chunked_without_qkv_grad():
    """Only the bias table requires grad: chunked must still build a graph to it, and
    torch.autograd.grad must return it without side effects on .grad."""
    t5 = T5RelativeBias(2)
    q, k, v = rand_qkv(1, 2, 10, 8, M=12, Hkv=2, dtype=torch.float32, draw_dtype=None)
    out = attnlab.attention(q, k, v, bias=t5.bias_fn(10, 12), backend="chunked")
    (g,) = torch.autograd.grad(out.sum(), (t5.embedding.weight,))
    assert t5.embedding.weight.grad is None
    want = attnlab.attention(q, k, v, bias=t5.bias_fn(10, 12), backend="math")
    (g_want,) = torch.autograd.grad(want.sum(), (t5.embedding.weight,))
    torch.testing.assert_close(g, g_want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_alibi_and_t5_through_flex_forward():
    """FlexAttention evaluates the bias functions on scalar indices (compiles: slow on CPU)."""
    from attnlab.exact import get_backend

    q, k, v = rand_qkv(1, 4, 32, 16, M=48, Hkv=2, dtype=torch.float32, draw_dtype=None)
    call = make_call(q, k, v)
    if get_backend("flex").verdict(call) is not None:
        pytest.skip(get_backend("flex").verdict(call))
    for pos in (ALiBi(4), T5RelativeBias(4, bidirectional=False)):
        with torch.no_grad():
            want = attnlab.attention(q, k, v, bias=pos.dense(32, 48), mask=masks.causal(), backend="math")
            got = attnlab.attention(q, k, v, bias=pos.bias_fn(32, 48), mask=masks.causal(), backend="flex")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_casting_the_model_keeps_rope_frequencies_and_alibi_slopes_exact():
    rope = RotaryEmbedding(64).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float64
    pos = torch.arange(1000, 1001)
    torch.testing.assert_close(rope.cos_sin(pos)[0], RotaryEmbedding(64).cos_sin(pos)[0], rtol=0, atol=0)
    alibi = ALiBi(6).to(torch.bfloat16)
    assert alibi.slopes.dtype == torch.float32
    torch.testing.assert_close(alibi.slopes, ALiBi(6).slopes, rtol=0, atol=0)
