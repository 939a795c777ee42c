"""The conformance grid: what every registered entry must satisfy, generated from the registries.

A new backend, mechanism, model, task or bench suite is tested here by registering it;
nothing in this file names an entry. Cases are tiny so that the grid stays within the
default run's budget:

* every exact backend x mask kind x dtype x shape, forward and gradients, against the
  float64 reference (a backend that cannot serve a case is skipped with its own reason);
  float32/float64 within :data:`helpers.TOLERANCES`, bfloat16/float16 within twice plain
  PyTorch's own error in that dtype;
* every example of every enrolled mask kind (:func:`attnlab.masks.kinds`: grids, videos,
  trees) on every backend against the same mask as a dense bool tensor through ``math``,
  forward and gradients, within 1e-6;
* every mechanism: ``supports`` agrees with what runs, no leak under ``causal()``, its
  exactness limit (:meth:`~attnlab.mechanisms.Mechanism.exact_settings`) equals exact
  attention, float64 ``gradcheck``, padding invariance, and peak memory per doubling of N
  within what its ``cost()`` predicts;
* every model type: config JSON round trip, save/load bit for bit, eval determinism;
* every task: the same seed gives the same batches, and a few training steps run;
* every bench suite: its tiny run (:meth:`~attnlab.bench.suite.Suite.tiny_options`)
  writes results that match the schema.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnlab import attention, masks
from attnlab.exact import backends, make_call
from attnlab.mechanisms import mechanisms
from attnlab.models import model_types
from attnlab.tasks import MissingDataError, create_task, tasks
from helpers import assert_low_precision_error, naive_attention, rand_qkv, random_edges, tensor_peak_bytes, tol

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    yield


# -- exact backends ---------------------------------------------------------------------------------

#: mask kinds: name -> mask maker for a call of N queries and M keys (every kind and the usual combinations:
#: those a per-row interval says, and those it cannot: recurring documents, global tokens, a dense mask)
MASKS = {
    "none": lambda n, m: None,
    "causal": lambda n, m: masks.causal(),
    "sliding_window": lambda n, m: masks.sliding_window(3, 2),
    "padding": lambda n, m: masks.padding([m, max(1, m - 3)]),
    "fully_masked_row": lambda n, m: masks.padding([m, 0]),
    "document": lambda n, m: masks.document([0] * (m // 2) + [1] * (m - m // 2)) if n == m else masks.causal(),
    "prefix_lm": lambda n, m: masks.prefix_lm(max(1, m // 3)),
    "causal_padding": lambda n, m: masks.causal() & masks.padding([m, max(1, m - 5)]),
    "document_causal": lambda n, m: masks.document([0] * (m // 3) + [1] * (m - m // 3)) & masks.causal(),
    "recurring_document": lambda n, m: masks.document([i % 2 for i in range(m)]),  # one id in many runs
    "global_window": lambda n, m: masks.sliding_window(2, 1) | masks.global_tokens([0]),
    "dense": lambda n, m: masks.dense(torch.rand(n, m, generator=torch.Generator().manual_seed(n + m)) > 0.3),
    # n targets attend to m sources along random edges (an isolated target, duplicate edges, self-loops)
    "graph": lambda n, m: masks.graph(random_edges(m, n, seed=n * 7 + m), num_nodes=(m, n)),
}

#: shapes (B, H, Hkv, N, M, D): length 1, grouped-query heads with 9 heads, queries != keys with head dim 59, 97,
#: a decoding step (one query, many keys), odd sizes everywhere, head dims 64 and 128 over several tiles
SHAPES = {
    "len1": (2, 1, 1, 1, 1, 8),
    "gqa9": (2, 9, 3, 17, 17, 40),
    "cross": (2, 2, 1, 5, 23, 59),
    "len97": (2, 2, 2, 97, 97, 16),
    "decode": (2, 4, 1, 1, 33, 8),  # one new query against a KV cache
    "odd": (2, 3, 3, 7, 7, 5),
    "d64": (2, 2, 2, 70, 130, 64),  # several 64-wide tiles, neither length a multiple of 64
    "d128": (2, 4, 2, 65, 65, 128),
}
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _compiles_here(name: str) -> bool:
    """A backend ``auto`` may pick whose cost model says a first call costs seconds on this machine
    (compile time dominates: flex on CPU compiles each shape) is slow to test: its cases run with
    ``-m slow``; ``tests/exact/test_oracle_contract.py`` (three shapes in a row) and ``tests/exact/test_flex.py`` call it in the default run."""
    from attnlab.exact.calibration import DEFAULT_SECONDS_PER_UNIT

    b = backends()[name]
    if b.available() is not None:
        return False
    q = torch.zeros(1, 1, 32, 8)
    call = make_call(q, q, q)
    return b.in_auto and b.supports(call) is None and b.estimate(call) * DEFAULT_SECONDS_PER_UNIT >= 1.0


def _backend_params():
    for name in backends():
        marks = [pytest.mark.slow] if _compiles_here(name) else []
        for mask in MASKS:
            for dt in DTYPES:
                for shape in SHAPES:
                    for grad in (False, True):
                        yield pytest.param(name, mask, dt, shape, grad, marks=marks,
                                           id=f"{name}-{mask}-{dt}-{shape}-{'grad' if grad else 'fwd'}")


def _allowed(mask, B: int, N: int, M: int) -> torch.Tensor | None:
    return None if mask is None else masks.as_mask(mask, "mask").dense(N, M, batch=B)


@pytest.mark.parametrize("name,mask_kind,dtype,shape,grad", list(_backend_params()))
def test_backend_matches_float64_reference(name, mask_kind, dtype, shape, grad):
    B, H, Hkv, N, M, D = SHAPES[shape]
    dt = DTYPES[dtype]
    mask = MASKS[mask_kind](N, M)
    q64, k64, v64 = rand_qkv(B, H, N, D, M=M, Hkv=Hkv, seed=N * 31 + M, scale=0.7)
    q, k, v = (t.clone().to(dt).requires_grad_(grad) for t in (q64, k64, v64))  # clone: float64 .to() is a no-op
    why = backends()[name].verdict(make_call(q, k, v, mask=mask))
    if why is not None:
        pytest.skip(f"{name}: {why}")
    out = attention(q, k, v, mask=mask, backend=name)  # (B, H, N, D)
    assert out.shape == (B, H, N, D) and out.dtype == dt
    ref = attention(q64, k64, v64, mask=mask, backend="reference")  # the float64 NumPy oracle
    if not grad:
        if dt in (torch.float64, torch.float32):
            torch.testing.assert_close(out.double(), ref, **tol(dt))
        else:
            plain = naive_attention(q.detach(), k.detach(), v.detach(), _allowed(mask, B, N, M))
            assert_low_precision_error(out.detach(), plain, ref)
        return
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    got = torch.autograd.grad((out.double() * w).sum(), (q, k, v))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q64, k64, v64))
    want = torch.autograd.grad((attention(qr, kr, vr, mask=mask, backend="math") * w).sum(), (qr, kr, vr))
    if dt in (torch.float64, torch.float32):
        for g, r in zip(got, want):
            torch.testing.assert_close(g.double(), r, **tol(dt, loose=True))
        return
    ql, kl, vl = (t.detach().to(dt).requires_grad_() for t in (q64, k64, v64))
    plain_out = naive_attention(ql, kl, vl, _allowed(mask, B, N, M))
    plain = torch.autograd.grad((torch.nan_to_num(plain_out.double(), nan=0.0) * w).sum(), (ql, kl, vl))
    for g, p, r in zip(got, plain, want):
        assert_low_precision_error(g, p, r)


# -- awkward inputs ---------------------------------------------------------------------------------

#: inputs attention() accepts that are easy to get wrong: name -> (q, k, v, scale, dout maker), float32
def _awkward(name: str):
    q, k, v = rand_qkv(2, 2, 70, 16, M=90, dtype=torch.float32, seed=11)
    scale, dout = None, None
    if name == "empty_batch":
        q, k, v = q[:0], k[:0], v[:0]
    elif name == "nan_inf_rows":
        q[0, 1, 5, 3], q[1, 0, 66, 0] = float("nan"), float("inf")
    elif name == "stride0_dout":
        dout = lambda out: torch.randn(1, 1, 1, out.shape[3], dtype=torch.float64).expand(out.shape)  # noqa: E731
    elif name == "transposed_views":
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last stride N
        k = k[:, :, :1].expand(k.shape)  # row stride 0
    elif name in ("zero_scale", "negative_scale"):
        scale = 0.0 if name == "zero_scale" else -0.4
    return q, k, v, scale, dout


AWKWARD = ("empty_batch", "nan_inf_rows", "stride0_dout", "transposed_views", "zero_scale", "negative_scale")


def _awkward_params():
    for name in backends():
        marks = [pytest.mark.slow] if _compiles_here(name) else []
        for case in AWKWARD:
            for mask in ("none", "causal"):
                yield pytest.param(name, case, mask, marks=marks, id=f"{name}-{case}-{mask}")


@pytest.mark.parametrize("name,case,mask_kind", list(_awkward_params()))
def test_backend_on_awkward_inputs_matches_float64_math(name, case, mask_kind):
    """Forward and gradients against float64 ``math`` (NaN where it is NaN; gradients where it is finite)."""
    q, k, v, scale, dout = _awkward(case)
    mask = MASKS[mask_kind](70, 90)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    why = backends()[name].verdict(make_call(q, k, v, mask=mask, scale=scale))
    if why is not None:
        pytest.skip(f"{name}: {why}")
    out = attention(q, k, v, mask=mask, scale=scale, backend=name)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention(q64, k64, v64, mask=mask, scale=scale, backend="math")
    torch.testing.assert_close(out.double(), ref, equal_nan=True, **tol(torch.float32))
    w = dout(out) if dout is not None else torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                                                        dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), w.to(out.dtype))
    want = torch.autograd.grad(ref, (q64, k64, v64), w)
    for g, r in zip(got, want):  # where both are finite: PyTorch's kernels give 0 * NaN = NaN for masked pairs
        # too (tests/exact/test_native_inputs.py holds attnlab's kernel to math's finite gradients)
        fin = torch.isfinite(r) & torch.isfinite(g)
        assert bool(fin.any()) or r.numel() == 0 or case == "nan_inf_rows"
        torch.testing.assert_close(g.double()[fin], r[fin], **tol(torch.float32, loose=True))


# -- mask kinds -------------------------------------------------------------------------------------

#: self-attention shapes ``(B, H, Hkv, N, D)`` of the mask kinds: a 6 x 10 / 3 x 4 x 5 grid with grouped-query
#: heads, a 7 x 15 / 3 x 5 x 7 one with head dim 9, and one position
KIND_SHAPES = {"n60": (2, 4, 2, 60, 16), "n105": (1, 3, 3, 105, 9), "n1": (2, 1, 1, 1, 8)}
#: the bound of the mask kinds' test: max|got - want| <= KIND_TOL * max(1, max|want|), forward and gradients
KIND_TOL = 1e-6


def _assert_within(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = (got - want).abs().max().item()
    scale = max(1.0, want.abs().max().item())
    assert err <= KIND_TOL * scale, f"{what}: max error {err:.2e} above {KIND_TOL:g} x {scale:.2f}"


def _kind_params():
    for kind in masks.kinds():
        for name in backends():
            marks = [pytest.mark.slow] if _compiles_here(name) else []
            for dt in ("float64", "float32"):
                for shape in KIND_SHAPES:
                    yield pytest.param(kind, name, dt, shape, marks=marks, id=f"{kind}-{name}-{dt}-{shape}")


@pytest.mark.parametrize("kind,name,dtype,shape", list(_kind_params()))
def test_mask_kind_on_every_backend_equals_its_dense_tensor_through_math(kind, name, dtype, shape):
    """Every example of :func:`attnlab.masks.kinds` (the grid, video and tree masks enroll there) on every
    backend equals the same mask as a dense boolean tensor through ``math``, forward and gradients, within
    1e-6 of the
    tensor's scale (a backend that cannot serve it is skipped with its reason)."""
    B, H, Hkv, N, D = KIND_SHAPES[shape]
    dt = DTYPES[dtype]
    mask = masks.kinds()[kind](N)
    dense = mask.dense(N, N, batch=B)  # the same mask as a plain bool tensor
    q, k, v = rand_qkv(B, H, N, D, Hkv=Hkv, dtype=dt, seed=N + len(kind), scale=0.7)
    grad = backends()[name].verdict(make_call(*(t.requires_grad_() for t in (q, k, v)), mask=mask)) is None
    if not grad:
        q, k, v = (t.detach() for t in (q, k, v))
        why = backends()[name].verdict(make_call(q, k, v, mask=mask))
        if why is not None:
            pytest.skip(f"{name}: {why}")
    out = attention(q, k, v, mask=mask, backend=name)  # (B, H, N, D)
    want = attention(q, k, v, mask=dense, backend="math")
    _assert_within(out, want, "output")
    if grad:
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=dt)
        got = torch.autograd.grad((out * w).sum(), (q, k, v))
        for label, g, r in zip("qkv", got, torch.autograd.grad((want * w).sum(), (q, k, v))):
            _assert_within(g, r, f"d{label}")


# -- mechanisms -------------------------------------------------------------------------------------

MECHS = list(mechanisms())

#: requests of the supports test: name -> (mask maker over N, M; bias; return_weights; N; M)
REQUESTS = {
    "plain": (lambda n, m: None, False, False, 12, 12),
    "causal": (lambda n, m: masks.causal(), False, False, 12, 12),
    "padding": (lambda n, m: masks.padding([m, m - 4]), False, False, 12, 12),
    "window": (lambda n, m: masks.sliding_window(2, 2), False, False, 12, 12),
    "bias": (lambda n, m: None, True, False, 12, 12),
    "weights": (lambda n, m: None, False, True, 12, 12),
    "cross": (lambda n, m: None, False, False, 6, 12),
    "bad_padding": (lambda n, m: masks.padding([m + 5, m]), False, False, 12, 12),
}


def _build(name: str, n: int, d: int, **override):
    cls = mechanisms()[name]
    torch.manual_seed(0)
    return cls(**{**cls.test_settings(n, d), **override}).double().eval()


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("request_kind", list(REQUESTS))
@pytest.mark.parametrize("name", MECHS)
def test_mechanism_supports_agrees_with_forward(name, request_kind):
    make_mask, with_bias, weights, N, M = REQUESTS[request_kind]
    q, k, v = rand_qkv(2, 2, N, 8, M=M, seed=1)
    mask = make_mask(N, M)
    bias = torch.randn(1, 2, N, M, dtype=q.dtype) if with_bias else None
    mech = _build(name, M, 8)
    why = mech.supports(q, k, v, mask, bias=bias, return_weights=weights)
    if why is None:
        with torch.no_grad():
            out = mech(q, k, v, mask, bias=bias, return_weights=weights)
        assert _first(out).shape == (2, 2, N, 8)
        if weights:
            assert isinstance(out, tuple) and out[1].shape == (2, 2, N, M)
    else:
        assert isinstance(why, str) and why
        with pytest.raises(ValueError):
            mech(q, k, v, mask, bias=bias, return_weights=weights)


@pytest.mark.parametrize("name", MECHS)
def test_mechanism_does_not_leak_the_future_under_causal(name):
    N = 16
    q, k, v = rand_qkv(1, 2, N, 8, seed=2)
    mech = _build(name, N, 8)
    why = mech.supports(q, k, v, masks.causal())
    if why is not None:
        pytest.skip(f"{name} is not causal-capable: {why}")
    with torch.no_grad():
        base = _first(mech(q, k, v, masks.causal()))
        for t in (0, N // 3, N - 2):
            g = torch.Generator().manual_seed(t + 1)
            k2, v2 = k.clone(), v.clone()
            k2[:, :, t + 1:] = 3 * torch.randn(k2[:, :, t + 1:].shape, generator=g, dtype=k.dtype)
            v2[:, :, t + 1:] = 3 * torch.randn(v2[:, :, t + 1:].shape, generator=g, dtype=v.dtype)
            out = _first(mech(q, k2, v2, masks.causal()))
            torch.testing.assert_close(out[:, :, : t + 1], base[:, :, : t + 1], **tol(torch.float64, loose=True))


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
@pytest.mark.parametrize("name", MECHS)
def test_mechanism_exactness_limit_equals_exact_attention(name, mask_kind):
    N = 13
    settings = mechanisms()[name].exact_settings(N)
    if settings is None:
        pytest.skip(f"{name} has no setting that makes it exact")
    q, k, v = rand_qkv(2, 2, N, 8, seed=3, scale=0.5)
    mask = MASKS[mask_kind](N, N)
    mech = _build(name, N, 8, **settings)
    why = mech.supports(q, k, v, mask)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    with torch.no_grad():
        got = _first(mech(q, k, v, mask))
    ref = attention(q, k, v, mask=mask, backend="reference")
    torch.testing.assert_close(got, ref, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("name", MECHS)
def test_mechanism_gradcheck_float64(name):
    N = 6
    q, k, v = rand_qkv(1, 2, N, 4, seed=4, scale=0.5)
    mech = _build(name, N, 4)
    if mech.supports(q, k, v) is not None:
        pytest.skip(f"{name}: {mech.supports(q, k, v)}")
    assert torch.autograd.gradcheck(lambda a, b, c: _first(mech(a, b, c)),
                                    tuple(t.requires_grad_() for t in (q, k, v)))


@pytest.mark.parametrize("name", MECHS)
def test_mechanism_padded_batch_equals_rows_alone(name):
    N, lengths = 16, [16, 11]
    q, k, v = rand_qkv(2, 2, N, 8, seed=5)
    mech = _build(name, N, 8)
    why = mech.supports(q, k, v, masks.padding(lengths))
    if why is not None:
        pytest.skip(f"{name}: {why}")
    if mech.padding_variant is not None:
        pytest.skip(f"{name}: {mech.padding_variant}")
    with torch.no_grad():
        out = _first(mech(q, k, v, masks.padding(lengths)))
        for b, n in enumerate(lengths):
            alone = _first(mech(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n]))
            torch.testing.assert_close(out[b : b + 1, :, :n], alone, **tol(torch.float64, loose=True))


@pytest.mark.parametrize("name", MECHS)
def test_mechanism_memory_per_doubling_follows_its_cost(name):
    n, d, h = 512, 16, 2  # an N x N score matrix (2 -> 8 MiB) stands far above the slack
    mech = _build(name, 2 * n, d).float()  # the same settings at both lengths: only N doubles
    peaks = []
    for length in (n, 2 * n):
        q, k, v = rand_qkv(1, h, length, d, dtype=torch.float32, seed=6)
        if mech.supports(q, k, v) is not None:
            pytest.skip(f"{name}: {mech.supports(q, k, v)}")
        with torch.no_grad():
            peaks.append(tensor_peak_bytes(lambda q=q, k=k, v=v: mech(q, k, v)))
    predicted = mech.cost(2 * n, 2 * n, d, h).bytes / mech.cost(n, n, d, h).bytes
    slack = 1 << 20  # small buffers (hash rotations, index tables) that do not scale with N
    assert peaks[1] <= 1.5 * predicted * peaks[0] + slack, (
        f"{name}: peak {peaks[0] / 2**20:.1f} -> {peaks[1] / 2**20:.1f} MiB per doubling of N, "
        f"its cost() predicts x{predicted:.2f}")


# -- models -----------------------------------------------------------------------------------------

#: small values for the size fields a model config may have (fields it lacks are ignored)
TINY_SIZES = {"dim": 16, "heads": 2, "layers": 1, "ff_dim": 32, "vocab_size": 40, "max_len": 32,
              "src_vocab_size": 40, "tgt_vocab_size": 41, "decoder_layers": 1, "num_classes": 3, "image_size": 8,
              "patch_size": 4, "channels": 2, "kv_heads": None, "in_channels": 12, "hidden": 4,
              "frames": 3, "n_dims": 3}


def _fields(config_class) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class)}


def _tiny_config(cls):
    fields = _fields(cls.config_class)
    return cls.config_class(**{k: v for k, v in TINY_SIZES.items() if k in fields})


def _inputs(cfg) -> tuple:
    """Example inputs read off the config's fields: token ids, (source, target) ids, images, or a graph."""
    g = torch.Generator().manual_seed(0)
    if hasattr(cfg, "in_channels"):  # node features and an edge list (isolated nodes, duplicates, self-loops)
        return (torch.randn(15, cfg.in_channels, generator=g), random_edges(15, seed=0))
    if hasattr(cfg, "src_vocab_size"):
        return (torch.randint(0, cfg.src_vocab_size, (2, 7), generator=g),
                torch.randint(0, cfg.tgt_vocab_size, (2, 5), generator=g))
    if hasattr(cfg, "n_dims"):  # in-context regression: prompts of (x, y) pairs
        return (torch.randn(2, 5, cfg.n_dims, generator=g), torch.randn(2, 5, generator=g))
    if hasattr(cfg, "frames"):
        return (torch.randn(2, cfg.frames, cfg.channels, cfg.image_size, cfg.image_size, generator=g),)
    if hasattr(cfg, "image_size"):
        return (torch.randn(2, cfg.channels, cfg.image_size, cfg.image_size, generator=g),)
    return (torch.randint(0, cfg.vocab_size, (2, 7), generator=g),)


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    if dataclasses.is_dataclass(out):
        return [t for f in dataclasses.fields(out) for t in _tensors(getattr(out, f.name))]
    return []


MODELS = list(model_types())


@pytest.mark.parametrize("name", MODELS)
def test_model_config_json_round_trip(name):
    cfg = _tiny_config(model_types()[name])
    assert type(cfg).from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("name", MODELS)
def test_model_save_load_and_eval_determinism(name, tmp_path):
    cls = model_types()[name]
    torch.manual_seed(0)
    model = cls(_tiny_config(cls)).eval()
    inputs = _inputs(model.config)
    with torch.no_grad():
        first, second = _tensors(model(*inputs)), _tensors(model(*inputs))
    assert first and all(torch.equal(a, b) for a, b in zip(first, second))  # eval is deterministic
    model.save_pretrained(tmp_path / "m")
    loaded = cls.from_pretrained(tmp_path / "m").eval()
    assert loaded.config == model.config
    with torch.no_grad():
        again = _tensors(loaded(*inputs))
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # bit for bit


# -- tasks ------------------------------------------------------------------------------------------

#: small values for the options a task may have (options it lacks are ignored)
TINY_OPTIONS = {"val_size": 16, "train_size": 48, "test_size": 16, "length": 12, "pairs": 2, "keys": 4, "values": 4,
                "queries": 2, "min_length": 8, "max_length": 16, "max_depth": 3, "max_args": 3, "context": 16,
                "vocab_size": 120, "eval_sentences": 4, "max_tokens": 16}
#: per task, where the common small values do not fit it (cluttered digits: a glimpse model learns nothing in 24
#: steps on a cluttered 32 x 32 canvas; passkey's needle and question need 120
#: characters; translation's tokenizer learns from the first 300 pairs only, with words whole enough to fit)
TINY_OVERRIDES = {"passkey": {"length": 160}, "cluttered-digits": {"canvas": 12, "clutter": 0, "glimpses": 2},
                  "translation": {"train_limit": 300, "vocab_size": 400, "max_tokens": 48, "beams": 1}}
#: per task, model fields for the tiny run (cluttered digits: the default convolutional what pathway needs more
#: than 24 steps to move the loss; the linear one is Mnih et al.'s)
TINY_MODEL = {"cluttered-digits": {"what": "linear", "scales": 2}}
TASKS = list(tasks())


def _tiny_task(name: str, seed: int):
    opts = {k: v for k, v in TINY_OPTIONS.items() if k in tasks()[name].option_defaults}
    opts.update(TINY_OVERRIDES.get(name, {}))
    task = create_task(name, seed=seed, **opts)
    try:
        task.ensure_setup()
    except MissingDataError as e:
        pytest.skip(f"{name}: {str(e).splitlines()[0]}")
    return task, opts


def _strided(t: torch.Tensor) -> torch.Tensor:
    return t if t.layout == torch.strided else t.to_dense()  # sparse features (the graph tasks)


@pytest.mark.parametrize("name", TASKS)
def test_task_batches_are_deterministic_per_seed(name):
    a, _ = _tiny_task(name, 3)
    b, _ = _tiny_task(name, 3)
    for step in (0, 1):
        ba, bb = a.train_batch(step, 4), b.train_batch(step, 4)
        assert ba.keys() == bb.keys()
        assert all(torch.equal(_strided(ba[key]), _strided(bb[key])) for key in ba)


#: translation's final evaluation translates its whole test split (1,000 sentences, 50 s): slow here, and
#: tests/tasks trains it on small pairs of its own in the default run
@pytest.mark.parametrize("name", [pytest.param(t, marks=pytest.mark.slow) if t == "translation" else t for t in TASKS])
def test_task_trains_a_few_steps_and_its_loss_falls(name, tmp_path):
    from attnlab.train import RunSpec, train

    _, opts = _tiny_task(name, 0)
    config = model_types()[tasks()[name].model_type].config_class
    sizes = {"dim": 16, "heads": 2, "layers": 1, "ff_dim": 32, **TINY_MODEL.get(name, {})}
    run = RunSpec(task=name, task_options=opts, model={k: v for k, v in sizes.items() if k in _fields(config)},
                  train={"steps": 24, "batch_size": 8, "seed": 0, "progress": False, "eval_every": 0, "lr": 3e-3,
                         "warmup": 2, "log_every": 1, "eval_batches": 1, "eval_batch_size": 4, "save_every": 0,
                         "keep_checkpoints": 1, "threads": 1})
    res = train(run, str(tmp_path / "run"), quiet=True)
    assert int(res.step) == 24
    losses = [res.losses[s] for s in sorted(res.losses)]
    assert all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first, f"{name}: the training loss did not fall ({first:.4f} -> {last:.4f})"
    evals = [m["loss"] for m in res.metrics.values() if isinstance(m, dict) and "loss" in m]
    assert evals and all(math.isfinite(x) for x in evals)


# -- bench suites -----------------------------------------------------------------------------------


def _suites() -> list[str]:
    from attnlab.bench.suites import suites

    return list(suites())


@pytest.mark.parametrize("name", _suites())
def test_bench_suite_tiny_run_matches_the_schema(name, tmp_path):
    from attnlab.bench import RunOptions, run, validate
    from attnlab.bench.suites import get_suite
    from attnlab.data import MissingDataError

    fields = get_suite(name).tiny_options()
    if fields is None:
        pytest.skip(f"suite {name} has no tiny run")
    opts = RunOptions(**{"repeats": 1, "budget_s": 0.05, "isolate": False, "progress": False, "echo": False,
                         "ceiling_size": 64, "copy_mb": 1, "out_dir": str(tmp_path), **fields})
    try:
        res = run([name], opts)
    except MissingDataError as e:  # a suite that reads a public data set this machine has not fetched
        pytest.skip(str(e))
    assert validate(res) == []
    assert res["cases"] and {c["suite"] for c in res["cases"]} == {name}
    for c in res["cases"]:  # a tiny run is chosen to run: every case is ok, or says why it cannot be
        if c["status"] != "ok":
            assert c["status"] in ("unsupported", "skipped") and c["reason"], c
    assert any(c["status"] == "ok" for c in res["cases"])
    assert (tmp_path / "results.json").is_file() and (tmp_path / "report.md").is_file()
