"""attnlab.exact.native: the C++ kernel beyond the conformance grid.

The grid (``tests/test_conformance.py``) checks the ``native`` backend on every mask kind x
shape against the float64 reference. Here: the kernel is built and verified on a machine
that can build it; its ``lse`` and the one-block entry points (``attend_block``) against the
formula; masks over many tiles (FULL, EMPTY and bit tiles at once); the fallback when the
kernel is turned off, cannot be built or fails its check (the same answers on the fused
path, and ``explain`` names the reason); one and two threads give bit-identical results;
bad input raises errors that name the argument.
"""

from __future__ import annotations

import hashlib
import re

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.exact import explain, make_call, native, native_build, tiles
from attnlab.exact.native_layout import kernel_mask
from helpers import rand_qkv, reference, tol

pytestmark = pytest.mark.skipif(
    native_build.brgemm_signature() is not None or native_build._compiler() is None,
    reason="no C++ compiler or no float32 brgemm in this torch: the kernel cannot be built here")


def _formula(q, k, v, allowed, bias, scale):
    """float64 ``(out, lse)``; q, k, v of the same heads."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.double()
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0)[..., None]) @ v.double(), lse


@pytest.fixture
def reload_kernel(monkeypatch):
    """Forget the loaded kernel's verdict before and after a test that changes how it loads (via monkeypatch)."""
    native_build._load.cache_clear()
    yield
    monkeypatch.undo()
    native_build._load.cache_clear()
    assert native_build.status() is None, native_build.status()


def test_the_kernel_is_built_and_verified_here():
    assert native.status() is None, native.status()
    assert "brgemm" in native_build.library().info()


@pytest.mark.parametrize("causal", [False, True])
def test_attend_block_on_the_kernel_gives_out_lse_and_gradients(causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 3, 70, 24, generator=g), torch.randn(2, 3, 90, 24, generator=g), \
        torch.randn(2, 3, 90, 40, generator=g)  # value dim unlike the query's
    allowed = torch.rand(2, 1, 70, 90, generator=g) > 0.3  # broadcast over heads
    allowed[1, 0, 5] = False  # a row that sees nothing
    bias = torch.randn(1, 3, 70, 90, generator=g)
    assert tiles.block_path(q, v, bias) == ("native", None)
    out, lse = tiles.attend_block(q, k, v, tile_mask=allowed, bias_tile=bias, scale=0.3, is_causal=causal)
    full = allowed & torch.ones(70, 90, dtype=torch.bool).tril() if causal else allowed
    want_o, want_l = _formula(q, k, v, full, bias, 0.3)
    torch.testing.assert_close(out.double(), want_o, **tol(torch.float32))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_l)) and bool(torch.isneginf(lse[1, :, 5]).all())
    fin = torch.isfinite(want_l)
    torch.testing.assert_close(lse.double()[fin], want_l[fin], **tol(torch.float32))
    assert float(out[1, :, 5].abs().max()) == 0.0
    do = torch.randn(out.shape, generator=g)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    want_g = torch.autograd.grad(_formula(qd, kd, vd, full, bias, 0.3)[0], (qd, kd, vd), do.double())
    got_g = tiles.attend_block_backward(do, q, k, v, out, lse, tile_mask=allowed, bias_tile=bias, scale=0.3,
                                         is_causal=causal)
    for got, want in zip(got_g, want_g):
        torch.testing.assert_close(got.double(), torch.nan_to_num(want), **tol(torch.float32, loose=True))
    assert float(got_g[0][1, :, 5].abs().max()) == 0.0  # the empty row's gradient is zero


#: masks over many tiles: intervals only, intervals and bit tiles, bit tiles only, per-head dense
MANY_TILE_MASKS = {
    "causal": lambda n, m: masks.causal(),
    "window": lambda n, m: masks.sliding_window(70, 10),
    "document_causal_padding": lambda n, m: masks.document(torch.arange(m) // 90) & masks.causal()
    & masks.padding([m, m - 100]),
    "global_window": lambda n, m: masks.sliding_window(40, 40) | masks.global_tokens([0, 150, m - 1]),
    "recurring_document": lambda n, m: masks.document(torch.arange(m) % 3) & masks.causal(),
    "dense_per_head": lambda n, m: masks.dense(torch.rand(2, 3, n, m, generator=torch.Generator().manual_seed(1))
                                               > 0.6),
}


@pytest.mark.parametrize("kind", list(MANY_TILE_MASKS))
def test_masks_over_many_tiles_match_the_reference(kind):
    N, M = 200, 333
    mask = MANY_TILE_MASKS[kind](N, M)
    q, k, v = rand_qkv(2, 3, N, 64, M=M, dtype=torch.float32, seed=5, scale=0.7)
    km = kernel_mask(mask, N, M)
    assert (km.tiles is None) == (kind in ("causal", "window", "document_causal_padding")), kind
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=mask, backend="native")
    torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask), **tol(torch.float32))
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(out, (qg, kg, vg), do)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want = torch.autograd.grad(attnlab.attention(q64, k64, v64, mask=mask, backend="math"), (q64, k64, v64),
                               do.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))


WIDE_MASKS = {
    "none": lambda n, m: None,
    "causal": lambda n, m: masks.causal(),
    "window_padding": lambda n, m: masks.sliding_window(70, 10) & masks.padding([m, m - 100]),
}


@pytest.mark.parametrize("rows", [128, 256])
@pytest.mark.parametrize("kind", list(WIDE_MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wider_query_tiles_of_the_raw_ops_match_the_float64_formula(rows, kind, dtype):
    """The kernel's ops take the query block as an argument (scripts/native_tiles.py times 64, 128 and 256
    rows): at 128 and 256 rows they give float64's outputs and gradients too, for masks without a tile table
    (row intervals), row counts that are not a multiple of the tile, GQA and a bias tensor."""
    if dtype == torch.bfloat16 and native.bf16_status() is not None:
        pytest.skip(native.bf16_status())
    ops = native_build.library()
    N, M = 300, 333
    mask = WIDE_MASKS[kind](N, M)
    km = kernel_mask(mask, N, M) if mask is not None else native.KernelMask()
    assert km.tiles is None
    q, k, v = rand_qkv(2, 4, N, 64, M=M, Hkv=2, dtype=dtype, seed=5, scale=0.7)
    bias = torch.randn(1, 4, N, M, generator=torch.Generator().manual_seed(3)) if kind == "causal" else None
    do = torch.randn(2, 4, N, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    scale = 64 ** -0.5
    bias_in = None if bias is None else bias.expand(2, 4, N, M)
    out, lse = ops.forward(q, k, v, km.lo, km.hi, None, None, None, bias_in, None, scale, rows, 64)
    dq, dk, dv, _ = ops.backward(do, q, k, v, out, lse, km.lo, km.hi, None, None, None, bias_in, None, False, scale,
                                 rows, 64)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want_out = attnlab.attention(q64, k64, v64, mask=mask, bias=None if bias is None else bias.double(), backend="math")
    want = torch.autograd.grad(want_out, (q64, k64, v64), do.double())
    torch.testing.assert_close(out.double(), want_out, **tol(dtype, loose=True))
    for a, b in zip((dq, dk, dv), want):
        torch.testing.assert_close(a.double(), b, **tol(dtype, loose=True))


def _fallback_cases() -> list[tuple[str, object]]:
    return [("causal", masks.causal()), ("global_window", masks.sliding_window(3, 1) | masks.global_tokens([0])),
            ("padding", masks.padding([33, 9]))]


def _check_on_the_fallback(reason_words: str) -> None:
    """chunked serves on the fused path, with the answers of the reference; explain names the reason."""
    q, k, v = rand_qkv(2, 4, 33, 16, Hkv=2, dtype=torch.float32, seed=9)
    for name, mask in _fallback_cases():
        verdicts = {x.backend: x for x in explain(q, k, v, mask=mask)}
        assert reason_words in verdicts["native"].reason, (name, verdicts["native"].reason)
        assert "\n" not in verdicts["native"].reason
        assert verdicts["chunked"].note.startswith("fused per-block path"), verdicts["chunked"].note
        assert reason_words not in verdicts["chunked"].note  # the reason is said once, by the native backend
        assert tiles.block_path(q, v)[0] == "fused"
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        out = attnlab.attention(qg, kg, vg, mask=mask, backend="chunked")
        torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask), **tol(torch.float32))
        grads = torch.autograd.grad(out.sum(), (qg, kg, vg))
        q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
        want = torch.autograd.grad(attnlab.attention(q64, k64, v64, mask=mask, backend="math").sum(), (q64, k64, v64))
        for a, b in zip(grads, want):
            torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))
        with pytest.raises(ValueError, match=re.escape(reason_words)):
            attnlab.attention(q, k, v, mask=mask, backend="native")


def test_fallback_when_turned_off(no_native_kernel):
    _check_on_the_fallback("turned off")


def test_fallback_when_the_self_check_fails(monkeypatch, reload_kernel):
    from attnlab.exact import native_check

    monkeypatch.setitem(native_build._CHECKED, "float32", "self_check_of_this_test")  # a library never checked before
    monkeypatch.setattr(native_check, "self_check", lambda ops: "the native kernel's dq differs from the formula by 1e-2")
    assert native.status() == "the native kernel's dq differs from the formula by 1e-2"
    lib, _ = native_build.build()
    assert not (lib.parent / "self_check_of_this_test").exists()  # a failure is not recorded
    _check_on_the_fallback("differs from the formula")


def test_a_passed_self_check_is_recorded_and_not_repeated(monkeypatch, reload_kernel):
    from attnlab.exact import native_check

    monkeypatch.setitem(native_build._CHECKED, "float32", "self_check_of_this_test")
    lib, _ = native_build.build()
    record = lib.parent / "self_check_of_this_test"
    monkeypatch.setattr(native_build, "_loaded", None)  # this process loaded it already: load it as a new one
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)
    calls = []
    real = native_check.self_check
    monkeypatch.setattr(native_check, "self_check", lambda ops: calls.append(1) or real(ops))
    try:
        assert native_build.status() is None and len(calls) == 1
        assert record.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
        native_build._load.cache_clear()
        assert native_build.status() is None and len(calls) == 1  # the record stands for the check
        record.write_text("0" * 64 + "\n")  # another library's pass: checked again
        native_build._load.cache_clear()
        assert native_build.status() is None and len(calls) == 2
    finally:
        record.unlink(missing_ok=True)


def test_fallback_when_there_is_no_compiler(monkeypatch, tmp_path, reload_kernel):
    monkeypatch.setenv("ATTNLAB_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native_build, "_compiler", lambda: None)
    _check_on_the_fallback("no C++ compiler")


def test_fallback_when_the_build_is_forced_off(monkeypatch, reload_kernel):
    monkeypatch.setenv("ATTNLAB_NATIVE", "0")
    _check_on_the_fallback("ATTNLAB_NATIVE=0")


def test_a_failed_compile_is_one_line_with_the_log(monkeypatch, tmp_path):
    bad = tmp_path / "native_attn.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setenv("ATTNLAB_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native_build, "SOURCE", bad)
    lib, why = native_build.build()
    assert lib is None and why.startswith("compiling native_attn.cpp failed") and "\n" not in why
    assert "build.log" in why


@pytest.mark.parametrize("kind", ["causal", "global_window", "dense_per_head"])
def test_one_and_two_threads_give_bit_identical_results(kind):
    """Every sum runs in an order fixed by the shapes (work items own their rows or keys), so the
    thread count cannot change a bit, forward or backward."""
    mask = MANY_TILE_MASKS[kind](200, 333)
    q, k, v = rand_qkv(2, 3, 200, 40, M=333, dtype=torch.float32, seed=4)
    do = torch.randn(2, 3, 200, 40, generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            out = attnlab.attention(qg, kg, vg, mask=mask, backend="native")
            results.append((out, *torch.autograd.grad(out, (qg, kg, vg), do)))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_single_key_head_backward_splits_keys_and_stays_exact():
    """B * Hkv = 1: the backward splits the keys into chunks (so both cores work) and sums their dq."""
    q, k, v = rand_qkv(1, 4, 300, 32, M=300, Hkv=1, dtype=torch.float32, seed=8)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = attnlab.attention(qg, kg, vg, mask=masks.causal(), backend="native")
    got = torch.autograd.grad(out.sum(), (qg, kg, vg))
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want = torch.autograd.grad(attnlab.attention(q64, k64, v64, mask=masks.causal(), backend="math").sum(),
                               (q64, k64, v64))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))


def test_strided_inputs_are_read_in_place_and_others_copied():
    x = torch.randn(2, 130, 4, 3, 32)  # (B, N, H, [q k v], D): the layout a fused projection leaves
    q, k, v = (x[:, :, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, D), rows strided
    assert not q.is_contiguous() and q.stride(-1) == 1
    got = attnlab.attention(q, k, v, mask=masks.causal(), backend="native")
    want = attnlab.attention(q.contiguous(), k.contiguous(), v.contiguous(), mask=masks.causal(), backend="native")
    assert torch.equal(got, want)
    qt = q.contiguous().transpose(-1, -2).contiguous().transpose(-1, -2)  # last dimension strided: copied first
    assert qt.stride(-1) != 1
    assert torch.equal(attnlab.attention(qt, k, v, mask=masks.causal(), backend="native"), want)
    kx = k[:, :1].expand(2, 4, 130, 32)  # a broadcast (stride-0) head dimension
    torch.testing.assert_close(attnlab.attention(q, kx, v, backend="native").double(),
                               reference(q, kx.contiguous(), v), **tol(torch.float32))


def test_bad_input_raises_errors_that_name_the_argument():
    q, k, v = rand_qkv(1, 2, 16, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="q must be float32"):
        native.native_forward(q.double(), k, v, scale=1.0)
    with pytest.raises(ValueError, match="v must be float32"):
        native.native_forward(q, k, v.double(), scale=1.0)
    with pytest.raises(ValueError, match="k must be 4-D"):
        native.native_forward(q, k[0], v, scale=1.0)
    with pytest.raises(ValueError, match="H a multiple of Hkv"):
        native.native_forward(q, k[:, :, :5], v, scale=1.0)
    with pytest.raises(ValueError, match="share a dtype"):
        attnlab.attention(q, k.double(), v, backend="native")
    with pytest.raises(ValueError, match="padding: lengths"):
        attnlab.attention(q, k, v, mask=masks.padding([17]), backend="native")
    with pytest.raises(ValueError, match="document ids cover 15 positions"):
        attnlab.attention(q, k, v, mask=masks.document(torch.zeros(15, dtype=torch.long)), backend="native")
    with pytest.raises(ValueError, match="dense mask of shape"):
        attnlab.attention(q, k, v, mask=masks.dense(torch.ones(16, 17, dtype=torch.bool)), backend="native")


def test_the_raw_op_refuses_inconsistent_mask_inputs_instead_of_reading_out_of_bounds():
    ops = native_build.library()
    q, k, v = rand_qkv(1, 1, 70, 8, dtype=torch.float32)
    lo = torch.zeros(1, 70, dtype=torch.int32)
    tiles = torch.full((1, 1, 2, 2), 5, dtype=torch.int32)  # points past the one bit tile
    bits = torch.zeros(1, 64, 8, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="tiles holds a value outside"):
        ops.forward(q, k, v, None, None, tiles, bits, None, None, None, 1.0, 64, 64)
    with pytest.raises(RuntimeError, match="lo/hi must be"):
        ops.forward(q, k, v, lo[:, :60], lo[:, :60], None, None, None, None, None, 1.0, 64, 64)
    with pytest.raises(RuntimeError, match="bits must be"):
        ops.forward(q, k, v, None, None, tiles.clamp(max=0), bits[:, :32], None, None, None, 1.0, 64, 64)
    with pytest.raises(RuntimeError, match="dense must be"):
        ops.forward(q, k, v, None, None, None, None, torch.ones(1, 1, 70, 69, dtype=torch.uint8), None, None, 1.0,
                    64, 64)
    with pytest.raises(RuntimeError, match="rel must be"):
        ops.forward(q, k, v, None, None, None, None, None, None, torch.zeros(1, 138), 1.0, 64, 64)


def test_calls_the_kernel_does_not_serve_say_why():
    q, k, v = rand_qkv(1, 2, 16, 8, dtype=torch.float32)
    reasons = {
        "float64": native.call_reason(make_call(q.double(), k.double(), v.double())),
        "dropout": native.call_reason(make_call(q, k, v, dropout_p=0.1)),
        "bias function": native.call_reason(make_call(q, k, v, bias=lambda b, h, i, j: (i - j).float())),
        "needs gradients": native.call_reason(make_call(q, k, v, bias=torch.zeros(1, 2, 16, 16, requires_grad=True))),
    }
    for words, why in reasons.items():
        assert why is not None and words in why, (words, why)
    assert native.call_reason(make_call(q, k, v, bias=torch.randn(1, 2, 16, 16))) is None  # a plain bias tensor


def test_auto_costs_the_native_kernel_against_sdpa():
    from attnlab.exact import choose_backend

    q, k, v = rand_qkv(1, 8, 4096, 64, dtype=torch.float32)
    for mask in (None, masks.causal(), masks.sliding_window(256)):
        assert choose_backend(q, k, v, mask=mask) == "chunked", mask  # chunked runs the kernel on these calls
    small = rand_qkv(1, 2, 64, 16, dtype=torch.float32)
    assert choose_backend(*small) == "sdpa"  # a tiny call: the kernel's fixed cost (the mask's layout) dominates
    verdicts = {x.backend: x for x in explain(q, k, v, mask=masks.causal())}
    assert verdicts["chunked"].note.startswith("native kernel") and not verdicts["native"].chosen


@pytest.mark.parametrize("kind", ["alibi_causal", "alibi_symmetric", "t5_bidirectional", "t5_causal"])
def test_relative_bias_functions_run_on_the_kernel_with_their_gradients(kind):
    """ALiBi and T5 declare themselves relative: one table per call, read along the tiles' diagonals; the
    gradient of T5's bucket table (and of q, k, v) equals float64 autograd through the math backend."""
    from attnlab.positional import ALiBi, T5RelativeBias

    N, M = 150, 230  # queries are the last N positions: bottom-right alignment
    torch.manual_seed(0)
    pos = {"alibi_causal": ALiBi(4), "alibi_symmetric": ALiBi(4, symmetric=True),
           "t5_bidirectional": T5RelativeBias(4), "t5_causal": T5RelativeBias(4, bidirectional=False)}[kind]
    mask = masks.causal() if kind.endswith("causal") else masks.padding([M, 170])
    q, k, v = rand_qkv(2, 4, N, 32, M=M, Hkv=2, dtype=torch.float32, seed=12, requires_grad=True)
    fn = pos.bias_fn(N, M)
    assert native.call_reason(make_call(q, k, v, mask=mask, bias=fn)) is None
    leaves = [p for p in pos.parameters()]
    out = attnlab.attention(q, k, v, mask=mask, bias=fn, backend="native")
    got = torch.autograd.grad(out.sum(), (q, k, v, *leaves))
    ref_pos = type(pos)(4, **({"symmetric": True} if kind == "alibi_symmetric" else {})).double()
    if kind == "t5_causal":
        ref_pos = T5RelativeBias(4, bidirectional=False).double()
    ref_pos.load_state_dict(pos.state_dict())
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = attnlab.attention(q64, k64, v64, mask=mask, bias=ref_pos.bias_fn(N, M), backend="math")
    want = torch.autograd.grad(ref.sum(), (q64, k64, v64, *ref_pos.parameters()))
    torch.testing.assert_close(out.double(), ref, **tol(torch.float32))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol(torch.float32, loose=True))
    assert len(leaves) == (1 if kind.startswith("t5") else 0)


def test_a_bias_function_that_is_not_relative_stays_on_the_fused_path():
    q, k, v = rand_qkv(1, 2, 40, 8, dtype=torch.float32)
    verdicts = {x.backend: x for x in explain(q, k, v, bias=lambda b, h, i, j: (i * j % 3).float())}
    assert "does not declare itself relative" in verdicts["native"].reason
    assert verdicts["chunked"].note.startswith("fused per-block path")


@pytest.mark.parametrize("M", [1, 40, 333])
def test_a_few_queries_read_the_keys_in_place(M):
    """N <= 16 (decoding with a KV cache) computes K Q^T from the keys as they are: the same answers."""
    q, k, v = rand_qkv(2, 4, min(M, 5), 24, M=M, Hkv=2, dtype=torch.float32, seed=M)
    for mask in (None, masks.causal(), masks.sliding_window(20) | masks.global_tokens([0])):
        out = attnlab.attention(q, k, v, mask=mask, backend="native")
        torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask), **tol(torch.float32))


@pytest.mark.slow
def test_a_second_build_in_one_process_reuses_the_loaded_kernel(monkeypatch, tmp_path, reload_kernel):
    """A source changed while a process runs builds another library; loading it would register the op
    namespace twice (an abort), so the process keeps the kernel it loaded (one compile: tens of seconds)."""
    assert native_build.status() is None  # this process has loaded one
    changed = tmp_path / "native_attn.cpp"
    changed.write_text(native_build.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setenv("ATTNLAB_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native_build, "SOURCE", changed)
    native_build._load.cache_clear()
    assert native_build.status() is None
    q, k, v = rand_qkv(1, 2, 30, 8, dtype=torch.float32)
    torch.testing.assert_close(attnlab.attention(q, k, v, backend="native").double(), reference(q, k, v),
                               **tol(torch.float32))


def test_a_failed_build_is_recorded_and_not_retried(monkeypatch, tmp_path):
    """Spawned workers, DDP ranks and bench children read the record instead of compiling again."""
    bad = tmp_path / "native_attn.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setenv("ATTNLAB_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native_build, "SOURCE", bad)
    lib, first = native_build.build()
    assert lib is None and first.startswith("compiling native_attn.cpp failed")
    monkeypatch.setattr(native_build, "_compile", lambda *a: pytest.fail("a recorded failure was compiled again"))
    lib, again = native_build.build()
    assert lib is None and again.startswith(first) and "build_failed" in again and "delete it to retry" in again
    bad.write_text("still not C++ // another input\n")  # a changed input: another folder, another try
    monkeypatch.setattr(native_build, "_compile", lambda *a: "compiled again")
    assert native_build.build() == (None, "compiled again")


def test_a_library_with_another_openmp_runtime_is_refused(monkeypatch):
    runtimes = {"libtorch_cpu.so": {"libgomp.so.1": "/torch/lib/libgomp.so.1"}}
    monkeypatch.setattr(native_build, "_omp_runtimes",
                        lambda path: runtimes.get(path.name, {"libgomp.so.1": "/usr/lib/libgomp.so.1"}))
    why = native_build.openmp_mismatch(native_build.build()[0] or native_build.cache_dir() / "x.so")
    assert why is not None and "/usr/lib/libgomp.so.1" in why and "/torch/lib/libgomp.so.1" in why
    monkeypatch.setattr(native_build, "_omp_runtimes", lambda path: {"libgomp.so.1": "/torch/lib/libgomp.so.1"})
    assert native_build.openmp_mismatch(native_build.cache_dir() / "x.so") is None


def test_the_built_kernel_links_torchs_openmp_runtime():
    lib, why = native_build.build()
    assert why is None and native_build.openmp_mismatch(lib) is None


def test_the_isa_variable_picks_the_flags(monkeypatch):
    monkeypatch.setenv("ATTNLAB_NATIVE_ISA", "avx2")
    flags = native_build._cpu_flags().split()
    avx2 = native_build._command("c++", native_build.cache_dir() / "x.so")
    assert "-mno-avx512f" in avx2
    assert ("-DCPU_CAPABILITY_AVX2" in avx2) == ({"avx2", "fma", "f16c"} <= set(flags))  # at::vec's AVX2 code
    avx2_key = native_build._key("c++")
    monkeypatch.setenv("ATTNLAB_NATIVE_ISA", "native")
    native = native_build._command("c++", native_build.cache_dir() / "x.so")
    assert "-mno-avx512f" not in native and native_build._key("c++") != avx2_key  # flags are in the cache key
    if "avx512f" in flags:  # the default build on an AVX-512 CPU: its intrinsics, no at::vec capability
        assert not any(f.startswith("-DCPU_CAPABILITY") for f in native)
    monkeypatch.setenv("ATTNLAB_NATIVE_ISA", "sse9")
    with pytest.raises(ValueError, match="ATTNLAB_NATIVE_ISA must be"):
        native_build.isa_request()


@pytest.mark.slow
def test_the_avx2_variant_builds_and_passes_its_check():
    """ATTNLAB_NATIVE_ISA=avx2 in a fresh process (one op namespace per process): built, checked against the
    float64 formula at load (the self-check); the softmax tests (every span length, NaN, inf, masked keys of a
    NaN row), the inputs' NaN/inf tests and the many-tile masks pass on it (one compile: ~30 s)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = {**os.environ, "ATTNLAB_NATIVE_ISA": "avx2"}
    code = (
        "from attnlab.exact import native_build as b; assert b.status() is None, b.status(); print(b.library().info())"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    if {"avx2", "fma", "f16c"} <= set(native_build._cpu_flags().split()):
        assert "softmax avx2 (at::vec)" in done.stdout, done.stdout
    tests = [
        str(here / "test_native_softmax.py"),
        f"{here / 'test_native_inputs.py'}::test_nan_and_inf_propagate_as_in_math",
        f"{here / 'test_native.py'}::test_masks_over_many_tiles_match_the_reference",
    ]
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]  # ends "N passed"
    done = subprocess.run(pytest_cmd, env=env, capture_output=True, text=True, timeout=900, cwd=here.parent.parent)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-1000:]
