"""Adaptive span: exact causal attention when the spans reach every key, the ramp against the paper's formula
(NumPy), the span's gradient (float64 autograd of the dense formula, finite differences), keys beyond the window
skipped, a window that follows the spans, the penalty in training, and settings errors that name the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab import attention, masks
from attnlab.mechanisms import AdaptiveSpan, create, extra_loss, log_values
from attnlab.mechanisms import adaptive_span as span_module
from attnlab.mechanisms.adaptive_span import hides_future, span_mask
from attnlab.models import CausalLM, CausalLMConfig
from helpers import rand_qkv


def _mech(spans, max_span=64, ramp=8, **kw) -> AdaptiveSpan:
    """A float64 mechanism whose heads have these spans (positions)."""
    m = AdaptiveSpan(max_span=max_span, heads=len(spans), ramp=ramp, window_multiple=1, **kw).double()
    with torch.no_grad():
        m.fraction.copy_(torch.tensor(spans, dtype=torch.float64) / max_span)
    return m


def numpy_adaptive_span(q, k, v, spans, ramp):
    """The paper's formula in NumPy float64: a_pj = m(p - j) exp(s_pj) / sum_k m(p - k) exp(s_pk), j <= p."""
    q, k, v = (t.detach().double().numpy() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # (B, H, M, D), (B, H, M, Dv)
    N, M = q.shape[2], k.shape[2]
    s = np.einsum("bhnd,bhmd->bhnm", q, k) / np.sqrt(q.shape[-1])  # (B, H, N, M)
    x = (np.arange(N)[:, None] + M - N) - np.arange(M)[None, :]  # (N, M) distance back
    z = np.asarray(spans, dtype=np.float64)[None, :, None, None]  # (1, H, 1, 1)
    m = np.clip((ramp + z - x) / ramp, 0.0, 1.0) * (x >= 0)  # (1, H, N, M)
    e = m * np.exp(s - s.max(-1, keepdims=True))
    return torch.from_numpy((e / e.sum(-1, keepdims=True)) @ v)  # (B, H, N, Dv)


def _dense_formula(q, k, v, z, ramp):
    """The dense formula in torch (float64 autograd reference): masked exp-scores renormalised."""
    H, N, M = q.shape[1], q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, N, M)
    x = (torch.arange(N).view(-1, 1) + M - N - torch.arange(M).view(1, -1)).double()  # (N, M)
    m = ((ramp + z.view(1, -1, 1, 1) - x) / ramp).clamp(0, 1) * (x >= 0)  # (1, H, N, M)
    e = m * torch.exp(s - s.amax(-1, keepdim=True).detach())
    return (e / e.sum(-1, keepdim=True)) @ v  # (B, H, N, Dv)


@pytest.mark.parametrize("N,M,H,Hkv,D", [(1, 1, 2, 2, 8), (13, 13, 9, 3, 40), (5, 23, 4, 1, 59), (97, 97, 2, 2, 16)])
def test_spans_reaching_every_key_equal_exact_causal_attention(N, M, H, Hkv, D):
    q, k, v = rand_qkv(2, H, N, D, M=M, Hkv=Hkv, seed=N + M, requires_grad=True)
    mech = AdaptiveSpan(max_span=M, heads=H, init=1.0).double()
    got = mech(q, k, v, masks.causal())
    ref = attention(q, k, v, mask=masks.causal(), backend="math")  # float64 autograd: the gradients' reference
    oracle = attention(*(t.detach() for t in (q, k, v)), mask=masks.causal(), backend="reference")  # NumPy
    torch.testing.assert_close(got, oracle, rtol=0, atol=1e-6)
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)
    for a, b in zip(torch.autograd.grad((got * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_ramp_mask_matches_its_formula():
    x = torch.arange(0, 40, dtype=torch.float64)
    z, R = 10.3, 8
    want = torch.tensor([min(1.0, max(0.0, (R + z - xi) / R)) for xi in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(span_mask(x, torch.tensor(z, dtype=torch.float64), R), want, rtol=0, atol=0)
    mech = _mech([10.3, 0.0, 30.0], ramp=R)
    bias = mech.dense_bias(9, 40, 3)  # (1, 3, 9, 40): queries at positions 31..39
    for h, zh in enumerate([10.3, 0.0, 30.0]):
        dist = (torch.arange(9).view(-1, 1) + 31 - torch.arange(40).view(1, -1)).double()
        m = ((R + zh - dist) / R).clamp(0, 1)
        torch.testing.assert_close(bias[0, h].exp(), m, rtol=1e-12, atol=0)
        assert torch.isneginf(bias[0, h][m == 0]).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("N,M,H,Hkv,D", [(40, 40, 3, 3, 16), (17, 50, 6, 2, 40)])
def test_forward_matches_the_papers_formula(N, M, H, Hkv, D, dtype):
    spans = [0.0, 5.5, 12.25, 3.0, 30.0, 8.0][:H]
    q, k, v = rand_qkv(2, H, N, D, M=M, Hkv=Hkv, seed=3, dtype=dtype)
    mech = _mech(spans, ramp=6).to(dtype)
    got = mech(q, k, v, masks.causal())
    want = numpy_adaptive_span(q, k, v, spans, 6).to(dtype)
    torch.testing.assert_close(got, want, **({"rtol": 0, "atol": 1e-10} if dtype == torch.float64
                                             else {"rtol": 1e-5, "atol": 2e-6}))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_span_gradient_matches_the_float64_dense_formula(dtype):
    spans = [2.4, 7.7, 15.1, 0.6]
    q, k, v = rand_qkv(2, 4, 70, 16, Hkv=2, seed=5, dtype=dtype)
    mech = _mech(spans, ramp=5).to(dtype)
    out = mech(q, k, v, masks.causal())
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (out * w.to(dtype)).sum().backward()
    z = torch.tensor(spans, dtype=torch.float64, requires_grad=True)
    ref = _dense_formula(q.double(), k.double(), v.double(), z, 5)
    (gz,) = torch.autograd.grad((ref * w).sum(), (z,))
    got = mech.fraction.grad.double() / mech.max_span  # d/dz = d/dfraction / S
    torch.testing.assert_close(got, gz, **({"rtol": 1e-9, "atol": 1e-9} if dtype == torch.float64
                                           else {"rtol": 1e-4, "atol": 1e-4}))
    assert (gz.abs() > 1e-3).all()  # every head's span is on someone's ramp: a gradient worth comparing


def test_span_gradient_matches_finite_differences():
    spans = [3.3, 9.6]
    q, k, v = rand_qkv(1, 2, 24, 8, seed=6)
    mech = _mech(spans, max_span=32, ramp=4)
    w = torch.randn(1, 2, 24, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def f(frac: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            mech.fraction.copy_(frac)
        return (mech(q, k, v, masks.causal()) * w).sum()

    base = mech.fraction.detach().clone()
    f(base).backward()
    got = mech.fraction.grad.clone()
    eps = 1e-6
    fd = torch.stack([(f(base + eps * e) - f(base - eps * e)) / (2 * eps) for e in torch.eye(2, dtype=torch.float64)])
    torch.testing.assert_close(got, fd.detach(), rtol=1e-6, atol=1e-6)


def test_keys_beyond_the_spans_get_exactly_zero_weight():
    N, spans, R = 130, [4.0, 20.5], 4
    q, k, v = rand_qkv(1, 2, N, 8, seed=7, dtype=torch.float32)
    mech = _mech(spans, max_span=128, ramp=R).float()
    base = mech(q, k, v, masks.causal())
    p = 100  # query position; head h may weight keys p - j < z_h + R only
    for h, z in enumerate(spans):
        first = p - math.ceil(z + R) + 1  # the farthest key it may weight
        k2, v2 = k.clone(), v.clone()
        k2[:, h, :first], v2[:, h, :first] = 50.0, -50.0
        out = mech(q, k2, v2, masks.causal())
        assert torch.equal(out[:, h, p], base[:, h, p])
        k2[:, h, first], v2[:, h, first] = 50.0, -50.0  # the last key of its ramp does count
        assert not torch.equal(mech(q, k2, v2, masks.causal())[:, h, p], base[:, h, p])
    w = attention(q, k, v, mask=masks.causal(), bias=mech.dense_bias(N, N, 2), backend="math", return_weights=True)[1]
    dist = torch.arange(N).view(-1, 1) - torch.arange(N).view(1, -1)
    for h, z in enumerate(spans):
        assert (w[0, h][dist >= z + R] == 0).all() and (w[0, h][(dist >= 0) & (dist < z + R)] > 0).all()


def _tiles(mask, n: int) -> int:
    return int((mask.block_kinds(n, n, 64, 64) != masks.EMPTY).sum())


def test_the_window_follows_the_spans_and_the_call_skips_its_tiles(monkeypatch):
    N, R = 1024, 32
    mech = AdaptiveSpan(max_span=N, heads=4, ramp=R, init=1.0)
    c = masks.causal()
    assert mech.window(N) is None and mech.call_mask(c, N, N) is c  # spans reaching every key: no window
    calls = []

    def spy(q, k, v, *, mask=None, **kw):
        calls.append((q.shape[1], mask))
        return q

    monkeypatch.setattr(span_module, "attention", spy)
    q, k, v = rand_qkv(1, 4, N, 8, dtype=torch.float32)
    head_tiles = []
    for spans in ([1000.0, 10, 10, 10], [200.0, 10, 10, 10], [40.0, 10, 0, 0], [0.0, 0, 0, 0]):
        with torch.no_grad():
            mech.fraction.copy_(torch.tensor(spans) / N)
        want = [math.ceil((z + R) / 64) * 64 for z in spans]  # each head's window
        want = [None if w >= N - 1 else w for w in want]
        assert mech.head_windows(N) == want
        assert mech.window(N) == (None if None in want else max(want))  # the widest
        calls.clear()
        mech(q, k, v, masks.causal())
        keys = [N if w is None else min(N, w + 64) for w in want]
        grouped = sum(keys) <= mech.group_share * 4 * max(keys)  # the heads' keys against the widest window's
        assert mech.groups_pay(want, N) == grouped
        assert len(calls) == (len(set(want)) if grouped else 1)  # one call per window, or one over the widest
        assert sum(h for h, _ in calls) == 4
        for _heads, mask in calls:
            lo, hi = mask.row_interval(N, N)
            width = int((hi - lo).max())
            assert width == N or (width - 1) in want  # the query and its window's predecessors
        head_tiles.append(sum(h * _tiles(m, N) for h, m in calls))
    assert head_tiles[1] == (16 * 5 - 10) + 3 * (16 + 15)  # windows (256, 64, 64, 64): two calls
    assert head_tiles[-1] == 4 * (16 + 15)  # span 0: the window of 64 keys reaches one tile back
    assert head_tiles[2] == 4 * (16 + 15 + 14)  # windows (128, 64, 64, 64): alike, one call over 128 keys
    # one long head no longer widens the others' window: 1 full causal head + 3 heads of 64 keys
    assert head_tiles[0] == 136 + 3 * (16 + 15)


@pytest.mark.parametrize("H,Hkv", [(4, 4), (6, 2)])
def test_heads_grouped_by_window_equal_one_call_over_the_widest_window(H, Hkv):
    """The per-window calls (heads regrouped, GQA, a caller's bias function and tensor) equal one call."""
    N, max_span = 150, 128
    q, k, v = rand_qkv(2, H, N, 16, Hkv=Hkv, seed=5, requires_grad=True)
    spans = torch.tensor([3.0, 100.0, 40.0, 3.0, 128.0, 70.0][:H])  # windows of 16 to 144 keys: grouped
    tensor_bias = torch.randn(1, H, N, N, dtype=torch.float64)

    def fn_bias(b, h, qi, ki):
        return 0.01 * (torch.as_tensor(h) + 1) * (torch.as_tensor(qi) - torch.as_tensor(ki)).abs()

    for bias in (None, fn_bias, tensor_bias):
        mech = AdaptiveSpan(max_span=max_span, heads=H, ramp=8, window_multiple=16).double()
        with torch.no_grad():
            mech.fraction.copy_(spans.double() / max_span)
        assert mech.groups_pay(mech.head_windows(N), N)
        got = mech(q, k, v, masks.causal(), bias=bias)
        if bias is None or isinstance(bias, torch.Tensor):
            extra = 0.0 if bias is None else bias
        else:
            extra = fn_bias(0, torch.arange(H).view(-1, 1, 1), torch.arange(N).view(-1, 1), torch.arange(N).view(1, -1))
        ref = attention(q, k, v, mask=masks.causal(), bias=mech.dense_bias(N, N, H) + extra, backend="math")
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)
        g = torch.autograd.grad(got.square().sum(), (q, k, v, mech.fraction))
        r = torch.autograd.grad(ref.square().sum(), (q, k, v, mech.fraction))
        for a, b in zip(g, r):
            torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_causality_is_required_and_said():
    q, k, v = rand_qkv(2, 2, 12, 8)
    mech = _mech([3.0, 5.0])
    for mask in (None, masks.padding([12, 9]), masks.sliding_window(2, 2)):
        why = mech.supports(q, k, v, mask)
        assert why is not None and "causal" in why
        with pytest.raises(ValueError, match="needs a causal mask"):
            mech(q, k, v, mask)
    for mask in (masks.causal(), masks.causal() & masks.padding([12, 9]), masks.sliding_window(4, 0)):
        assert mech.supports(q, k, v, mask) is None and hides_future(masks.as_mask(mask, "mask"), 12, 12)
    assert mech.supports(q[:, :, -1:], k, v, None) is None  # one query (decoding): no mask needed
    assert "return_weights" in mech.supports(q, k, v, masks.causal(), return_weights=True)
    assert "heads=2" in mech.supports(*rand_qkv(1, 3, 12, 8), masks.causal())


def test_decoding_one_query_equals_the_last_row_of_the_full_call():
    q, k, v = rand_qkv(1, 2, 30, 8, seed=9)
    mech = _mech([4.5, 11.0], ramp=3)
    full = mech(q, k, v, masks.causal())
    torch.testing.assert_close(mech(q[:, :, -1:], k, v), full[:, :, -1:], rtol=0, atol=1e-12)


def test_a_callers_bias_adds_to_the_spans():
    q, k, v = rand_qkv(1, 2, 20, 8, seed=10)
    mech = _mech([4.5, 11.0], ramp=3)
    alibi = lambda b, h, qi, ki: -0.3 * (qi - ki).abs().double()  # noqa: E731
    alibi.relative = True
    own = mech.dense_bias(20, 20, 2).detach()  # (1, 2, N, M)
    want = attention(q, k, v, mask=masks.causal(), bias=own + alibi(0, 0, torch.arange(20).view(-1, 1),
                                                                       torch.arange(20).view(1, -1)), backend="reference")
    torch.testing.assert_close(mech(q, k, v, masks.causal(), bias=alibi), want, rtol=0, atol=1e-12)
    tensor_bias = torch.randn(1, 2, 20, 20, dtype=torch.float64)
    want = attention(q, k, v, mask=masks.causal(), bias=own + tensor_bias, backend="reference")
    torch.testing.assert_close(mech(q, k, v, masks.causal(), bias=tensor_bias), want, rtol=0, atol=1e-12)


def test_penalty_spans_and_clamping():
    mech = _mech([10.0, 30.0], max_span=40, penalty=0.01)
    torch.testing.assert_close(mech.extra_loss(), torch.tensor(0.01 * 20.0, dtype=torch.float64))
    assert mech.current_spans == [10.0, 30.0] and mech.log_values() == {"spans": [10.0, 30.0]}
    assert _mech([1.0], penalty=0.0).extra_loss() is None
    with torch.no_grad():
        mech.fraction.copy_(torch.tensor([-0.5, 1.5]))
    assert mech.current_spans == [0.0, 40.0]  # read clamped
    mech.train()(*rand_qkv(1, 2, 5, 4), masks.causal())
    assert mech.fraction.tolist() == [0.0, 1.0]  # stored clamped by a training forward


def test_models_build_one_span_per_head_and_sum_the_penalties():
    cfg = CausalLMConfig(vocab_size=11, dim=16, heads=4, layers=3, ff_dim=32, max_len=48,
                            mechanism="adaptive-span", mechanism_settings={"penalty": 0.5, "init": 0.25})
    model = CausalLM(cfg)
    mechs = [m for m in model.modules() if isinstance(m, AdaptiveSpan)]
    assert len(mechs) == 3 and all(m.fraction.shape == (4,) and m.max_span == 48 for m in mechs)
    torch.testing.assert_close(extra_loss(model), torch.tensor(3 * 0.5 * 12.0))
    assert log_values(model) == {"spans": [[12.0] * 4] * 3}
    model(torch.randint(0, 11, (2, 48)))  # the causal decoder passes a causal mask
    assert extra_loss(CausalLM(CausalLMConfig(vocab_size=11, dim=16, heads=4, layers=1, ff_dim=32))) is None


def _run(tmp_path, penalty: float):
    from attnlab.train import RunSpec, read_metrics, train

    model = {"dim": 16, "heads": 2, "layers": 1, "ff_dim": 32, "mechanism": "adaptive-span",
             "mechanism_settings": {"init": 0.5, "ramp": 2, "penalty": penalty}}
    spec = RunSpec(task="copy", task_options={"length": 6}, model=model,
                   train={"steps": 8, "lr": 0.02, "warmup": 0, "precision": "fp32", "progress": False, "log_every": 4,
                          "threads": 1, "eval_batches": 1, "final_eval": False})
    train(spec, tmp_path / f"p{penalty}", quiet=True)
    return [r for r in read_metrics(tmp_path / f"p{penalty}" / "metrics.jsonl") if r["split"] == "train"]


def test_training_adds_the_penalty_and_logs_the_spans(tmp_path):
    free, pulled = _run(tmp_path, 0.0), _run(tmp_path, 10.0)
    assert [r["step"] for r in pulled] == [4, 8] and len(pulled[-1]["spans"]) == 1 and len(pulled[-1]["spans"][0]) == 2
    start = pulled[0]["spans"][0]
    assert all(a < b for a, b in zip(pulled[-1]["spans"][0], start))  # the penalty pulls every span down
    assert all(a < b for a, b in zip(pulled[-1]["spans"][0], free[-1]["spans"][0]))


@pytest.mark.parametrize("settings,arg", [
    ({"max_span": 0}, "max_span"), ({"heads": 0}, "heads"), ({"ramp": 0}, "ramp"), ({"ramp": 1.5}, "ramp"),
    ({"init": 1.5}, "init"), ({"init": -0.1}, "init"), ({"penalty": -1.0}, "penalty"),
    ({"window_multiple": 0}, "window_multiple"), ({"backend": "nope"}, "backend"),
])
def test_bad_settings_name_the_argument(settings, arg):
    with pytest.raises(ValueError, match=arg):
        create("adaptive-span", **settings)


def test_cost_counts_the_keys_of_the_calls_that_run():
    N, D = 1024, 32
    mech = AdaptiveSpan(max_span=N, heads=4, ramp=32)
    for spans, keys in (([1000.0, 10, 10, 10], N + 3 * 65),  # grouped: one full head, three of 64 keys
                        ([40.0, 10, 0, 0], 4 * 129)):  # windows alike: one call over 128 keys for all four
        with torch.no_grad():
            mech.fraction.copy_(torch.tensor(spans) / N)
        assert mech.cost(N, N, D, 4).flops == pytest.approx(2.0 * N * keys * 2 * D)


def test_group_share_decides_between_one_call_and_one_per_window(monkeypatch):
    calls = []
    monkeypatch.setattr(span_module, "attention", lambda q, k, v, **kw: calls.append(q.shape[1]) or q)
    N = 1024
    mech = AdaptiveSpan(max_span=N, heads=4, ramp=32)
    with torch.no_grad():
        mech.fraction.copy_(torch.tensor([105.0, 0, 0, 0]) / N)  # windows (192, 64, 64, 64): 0.62 of the widest
    q, k, v = rand_qkv(1, 4, N, 8, dtype=torch.float32)
    for share, want in ((0.6, [4]), (0.7, [1, 3]), (0.0, [4])):
        mech.group_share = share
        calls.clear()
        mech(q, k, v, masks.causal())
        assert calls == want, share
