"""attnlab.masks against brute-force definitions.

Every mask's ``dense()`` is compared with a Python double loop of its definition,
``tile()`` with the slice of ``dense()``, ``row_interval()`` (where a mask has one) with
``dense()``, ``block_kinds()`` with the tiles of the dense
matrix (EMPTY/FULL always exact, and for the analytic masks PARTIAL exactly where a
tile is mixed), the seeds' "1 = blocked" conventions with ``from_blocked``, and bad
arguments with ValueErrors that name the argument.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import masks

Pred = Callable[[int, int, int, int], bool]  # (b, h, i, j) -> may query i see key j
BLOCK_SIZES = [(1, 1), (4, 4), (7, 13), (13, 7), (16, 64)]


# -- brute-force definitions -------------------------------------------------------------
def brute(pred: Pred, B: int, H: int, N: int, M_: int) -> torch.Tensor:
    """``(B, H, N, M)`` bool tensor from a per-element predicate (a plain double loop)."""
    out = torch.zeros(B, H, N, M_, dtype=torch.bool)
    for b, h, i, j in itertools.product(range(B), range(H), range(N), range(M_)):
        out[b, h, i, j] = bool(pred(b, h, i, j))
    return out


def pos(i: int, N: int, M_: int) -> int:
    """Key-sequence position of query i (bottom-right alignment)."""
    return i + M_ - N


def p_causal(N, M_):
    return lambda b, h, i, j: j <= pos(i, N, M_)


def p_window(left, right, N, M_):
    return lambda b, h, i, j: pos(i, N, M_) - left <= j <= pos(i, N, M_) + right


def p_padding(lengths):
    return lambda b, h, i, j: j < lengths[b]


def p_global(indices, N, M_):
    return lambda b, h, i, j: pos(i, N, M_) in indices or j in indices


def p_document(ids, N, M_):
    # ids: list of per-batch lists of length M
    return lambda b, h, i, j: ids[b][pos(i, N, M_)] == ids[b][j]


def p_prefix(n, N, M_):
    return lambda b, h, i, j: j < n or j <= pos(i, N, M_)


def p_table(table):
    """Predicate reading a (B'|1, H'|1, N|1, M|1) nested list with broadcasting."""
    t = np.asarray(table)

    def f(b, h, i, j):
        idx = tuple(x if s != 1 else 0 for x, s in zip((b, h, i, j), t.shape))
        return bool(t[idx])

    return f


def full(mask: masks.Mask, B: int, H: int, N: int, M_: int) -> torch.Tensor:
    """``mask.dense`` broadcast to ``(B, H, N, M)``."""
    return mask.dense(N, M_, batch=B, heads=H).expand(B, H, N, M_)


def reference_kinds(allowed: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """Exact tile kinds of a ``(B, H, N, M)`` bool tensor, by slicing each tile."""
    B, H, N, M_ = allowed.shape
    nqb, nkb = -(-N // bq), -(-M_ // bk)
    out = torch.empty(B, H, nqb, nkb, dtype=torch.int8)
    for a, b in itertools.product(range(nqb), range(nkb)):
        t = allowed[:, :, a * bq : (a + 1) * bq, b * bk : (b + 1) * bk]
        all_, any_ = t.all(-1).all(-1), t.any(-1).any(-1)
        out[:, :, a, b] = torch.where(all_, masks.FULL, torch.where(any_, masks.PARTIAL, masks.EMPTY))
    return out


def kinds_of(mask: masks.Mask, B: int, H: int, N: int, M_: int, bq: int, bk: int) -> torch.Tensor:
    k = mask.block_kinds(N, M_, bq, bk)
    assert k.dtype == torch.int8 and k.ndim == 4
    return k.expand(B, H, -(-N // bq), -(-M_ // bk))


# -- the leaf masks, each with its definition --------------------------------------------
def leaf_cases(B: int, N: int, M_: int, g: torch.Generator):
    """(name, mask, predicate, analytic) for every mask kind at these sizes."""
    lengths = torch.randint(0, M_ + 1, (B,), generator=g).tolist()
    lengths[0] = 0  # a batch row with no key at all
    keep = torch.rand(B, M_, generator=g) > 0.4
    gidx = sorted({0, M_ // 2, M_ - 1})
    ids = torch.randint(0, 3, (B, M_), generator=g).sort(dim=1).values
    dense_t = torch.rand(B, 2, N, M_, generator=g) > 0.5
    dense_t[0, 0, 0] = False  # a fully masked row
    tokens = torch.randint(0, 4, (B, M_), generator=g)
    cases = [
        ("causal", masks.causal(), p_causal(N, M_), True),
        ("window_2_0", masks.sliding_window(2), p_window(2, 0, N, M_), True),
        ("window_1_3", masks.sliding_window(1, 3), p_window(1, 3, N, M_), True),
        ("window_0_0", masks.sliding_window(0, 0), p_window(0, 0, N, M_), True),
        ("padding", masks.padding(lengths), p_padding(lengths), True),
        ("global", masks.global_tokens(gidx), p_global(gidx, N, M_), True),
        ("prefix_lm", masks.prefix_lm(3), p_prefix(3, N, M_), True),
        ("key_mask", masks.key_mask(keep), lambda b, h, i, j: bool(keep[b, j]), True),
        ("dense4", masks.dense(dense_t), p_table(dense_t.tolist()), True),
        ("dense2", masks.dense(dense_t[0, 0]), p_table(dense_t[:1, :1].tolist()), True),
        ("dense3", masks.dense(dense_t[:, 0]), p_table(dense_t[:, :1].tolist()), True),
        ("padding_from_tokens", masks.padding_from_tokens(tokens, pad_id=1), lambda b, h, i, j: int(tokens[b, j]) != 1, True),
        ("from_blocked", masks.from_blocked(dense_t[:, :1].int()), p_table((~dense_t[:, :1]).tolist()), True),
    ]
    if N <= M_:  # document masks take the ids of the last N key positions
        cases.append(("document2d", masks.document(ids), p_document(ids.tolist(), N, M_), False))
        cases.append(("document1d", masks.document(ids[0]), p_document([ids[0].tolist()] * B, N, M_), False))
    return cases


SIZES = [(1, 1), (1, 9), (9, 1), (6, 6), (5, 17), (17, 5), (20, 20)]


@pytest.mark.parametrize("N,M_", SIZES)
def test_dense_tile_and_block_kinds_of_every_leaf(N, M_):
    g = torch.Generator().manual_seed(N * 100 + M_)
    B, H = 2, 2
    for name, mask, pred, analytic in leaf_cases(B, N, M_, g):
        want = brute(pred, B, H, N, M_)
        got = full(mask, B, H, N, M_)
        assert torch.equal(got, want), f"{name}: dense() differs from the definition at N={N}, M={M_}"
        # tile() is the slice of dense()
        for q0, q1, k0, k1 in [(0, N, 0, M_), (N // 3, N, M_ // 2, M_), (0, max(1, N // 2), 1 % M_, M_)]:
            t = mask.tile(q0, q1, k0, k1, N, M_)
            assert torch.equal(t.expand(B, H, q1 - q0, k1 - k0), want[:, :, q0:q1, k0:k1]), f"{name}: tile({q0},{q1},{k0},{k1})"
        for bq, bk in BLOCK_SIZES:
            got_k = kinds_of(mask, B, H, N, M_, bq, bk)
            ref_k = reference_kinds(want, bq, bk)
            # EMPTY / FULL are always exact claims
            assert not ((got_k == masks.EMPTY) & (ref_k != masks.EMPTY)).any(), f"{name}: EMPTY tile holds a True ({bq}x{bk})"
            assert not ((got_k == masks.FULL) & (ref_k != masks.FULL)).any(), f"{name}: FULL tile holds a False ({bq}x{bk})"
            if analytic:
                assert torch.equal(got_k, ref_k), f"{name}: block_kinds not exact at N={N}, M={M_}, blocks {bq}x{bk}"


def interval_dense(mask, B: int, H: int, N: int, M_: int) -> torch.Tensor | None:
    """``(B, H, N, M)`` of ``mask.row_interval`` (None when the mask has none)."""
    iv = mask.row_interval(N, M_)
    if iv is None:
        return None
    lo, hi = iv
    assert lo.dtype == hi.dtype == torch.int64 and lo.shape == hi.shape and lo.shape[1] == N and lo.shape[0] in (1, B)
    keys = torch.arange(M_)
    return ((keys >= lo[..., None]) & (keys < hi[..., None]))[:, None].expand(B, H, N, M_)


#: the leaf kinds whose definition is one key interval per row (document ids in the cases are sorted)
INTERVAL_KINDS = {"causal", "window_2_0", "window_1_3", "window_0_0", "padding", "prefix_lm", "document2d",
                  "document1d"}


@pytest.mark.parametrize("N,M_", SIZES)
def test_row_interval_of_every_leaf_is_its_dense_mask(N, M_):
    g = torch.Generator().manual_seed(N * 10 + M_)
    for name, mask, pred, _ in leaf_cases(2, N, M_, g):
        got = interval_dense(mask, 2, 2, N, M_)
        if name in INTERVAL_KINDS:
            assert got is not None, f"{name}: no row interval"
            assert torch.equal(got, brute(pred, 2, 2, N, M_)), f"{name}: row interval differs at N={N}, M={M_}"
        elif name in ("global", "dense4", "dense2", "dense3", "from_blocked"):
            assert got is None, f"{name}: an interval for a mask that has none"
        elif got is not None:  # key masks: an interval only when every row keeps a prefix
            assert torch.equal(got, brute(pred, 2, 2, N, M_)), name


def test_row_interval_refuses_a_recurring_document_and_a_union_with_a_gap():
    assert masks.document(torch.tensor([0, 0, 1, 1, 0])).row_interval(5, 5) is None
    assert masks.document(torch.tensor([3, 3, 1, 1, 7])).row_interval(5, 5) is not None
    assert (masks.sliding_window(1) | masks.padding([2])).row_interval(9, 9) is None  # [p-1, p] and [0, 2) part
    assert (masks.causal() | masks.padding([4])).row_interval(9, 9) is not None  # both start at 0: one interval


@pytest.mark.parametrize("N,M_", SIZES)
def test_has_empty_rows_matches_dense(N, M_):
    g = torch.Generator().manual_seed(7 + N + M_)
    for name, mask, pred, _ in leaf_cases(2, N, M_, g):
        want = bool((~brute(pred, 2, 2, N, M_).any(-1)).any())
        assert mask.has_empty_rows(N, M_, batch=2) == want, name


def test_causal_alignment_worked_example():
    """The module docstring's picture: N=3 queries, M=5 keys, bottom-right aligned."""
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(masks.causal().dense(3, 5)[0, 0], want)
    # N > M: the first N - M rows see nothing
    d = masks.causal().dense(5, 3)[0, 0]
    assert not d[:2].any() and d[2:].all(-1).tolist() == [False, False, True]
    assert masks.causal().is_causal(4, 4) and not masks.causal().is_causal(3, 5)


def test_padding_length_zero_and_dense_shapes():
    m = masks.padding([0, 3])
    d = m.dense(4, 5)
    assert d.shape == (2, 1, 1, 5)
    assert not d[0].any() and d[1, 0, 0].tolist() == [True, True, True, False, False]
    assert m.has_empty_rows(4, 5)
    assert masks.causal().dense(4, 5).shape == (1, 1, 4, 5)
    k = m.block_kinds(4, 5, 2, 2)
    assert k.shape == (2, 1, 1, 3)
    assert k[0].eq(masks.EMPTY).all()


# -- composition ---------------------------------------------------------------------------
@st.composite
def mask_trees(draw, B: int, H: int, N: int, M_: int, depth: int = 2):
    """(mask, predicate) built from random leaves combined with & | ~."""
    if depth == 0 or draw(st.booleans()):
        kind = draw(st.sampled_from(["causal", "window", "padding", "global", "prefix", "key", "dense", "doc", "tokens"]))
        if kind == "causal":
            return masks.causal(), p_causal(N, M_)
        if kind == "window":
            left, right = draw(st.integers(0, 6)), draw(st.integers(0, 6))
            return masks.sliding_window(left, right), p_window(left, right, N, M_)
        if kind == "padding":
            lengths = draw(st.lists(st.integers(0, M_), min_size=B, max_size=B))
            return masks.padding(lengths), p_padding(lengths)
        if kind == "global":
            idx = draw(st.lists(st.integers(0, M_ - 1), min_size=1, max_size=4))
            return masks.global_tokens(idx), p_global(set(idx), N, M_)
        if kind == "prefix":
            n = draw(st.integers(0, M_ + 1))
            return masks.prefix_lm(n), p_prefix(n, N, M_)
        if kind == "key":
            keep = draw(st.lists(st.lists(st.booleans(), min_size=M_, max_size=M_), min_size=B, max_size=B))
            return masks.key_mask(torch.tensor(keep)), lambda b, h, i, j: keep[b][j]
        if kind == "tokens":
            toks = draw(st.lists(st.lists(st.integers(0, 2), min_size=M_, max_size=M_), min_size=B, max_size=B))
            return masks.padding_from_tokens(torch.tensor(toks)), lambda b, h, i, j: toks[b][j] != 0
        if kind == "doc" and N <= M_:
            ids = draw(st.lists(st.lists(st.integers(0, 2), min_size=M_, max_size=M_), min_size=B, max_size=B))
            return masks.document(torch.tensor(ids)), p_document(ids, N, M_)
        shape = draw(st.sampled_from([(N, M_), (B, H, N, M_), (1, H, N, M_), (B, 1, 1, M_)]))
        t = torch.tensor(draw(st.lists(st.booleans(), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))).view(shape)
        t4 = t.view((1, 1) + shape) if len(shape) == 2 else t
        return masks.dense(t), p_table(t4.tolist())
    op = draw(st.sampled_from(["and", "or", "not"]))
    a, pa = draw(mask_trees(B, H, N, M_, depth - 1))
    if op == "not":
        return ~a, lambda b, h, i, j: not pa(b, h, i, j)
    c, pc = draw(mask_trees(B, H, N, M_, depth - 1))
    if op == "and":
        return a & c, lambda b, h, i, j: pa(b, h, i, j) and pc(b, h, i, j)
    return a | c, lambda b, h, i, j: pa(b, h, i, j) or pc(b, h, i, j)


@st.composite
def sized_trees(draw):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    N, M_ = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    mask, pred = draw(mask_trees(B, H, N, M_, depth=3))
    return B, H, N, M_, mask, pred


@settings(max_examples=30, deadline=None)
@given(case=sized_trees(), bq=st.sampled_from([1, 3, 7, 13, 16]), bk=st.sampled_from([1, 2, 7, 13, 32]))
def test_random_compositions(case, bq, bk):
    B, H, N, M_, mask, pred = case
    want = brute(pred, B, H, N, M_)
    assert torch.equal(full(mask, B, H, N, M_), want), repr(mask)
    q0, k0 = N // 2, M_ // 3
    assert torch.equal(mask.tile(q0, N, k0, M_, N, M_).expand(B, H, N - q0, M_ - k0), want[:, :, q0:, k0:]), repr(mask)
    got_k, ref_k = kinds_of(mask, B, H, N, M_, bq, bk), reference_kinds(want, bq, bk)
    assert not ((got_k == masks.EMPTY) & (ref_k != masks.EMPTY)).any(), f"{mask!r}: EMPTY tile holds a True"
    assert not ((got_k == masks.FULL) & (ref_k != masks.FULL)).any(), f"{mask!r}: FULL tile holds a False"
    if bool((~want.any(-1)).any()):
        assert mask.has_empty_rows(N, M_, batch=B), f"{mask!r}: has_empty_rows misses an empty row"
    iv = interval_dense(mask, B, H, N, M_)
    assert iv is None or torch.equal(iv, want), f"{mask!r}: row_interval differs from the definition"


@settings(max_examples=30, deadline=None)
@given(
    N=st.integers(1, 40),
    M_=st.integers(1, 40),
    left=st.integers(0, 12),
    right=st.integers(0, 12),
    gidx=st.lists(st.integers(0, 45), min_size=1, max_size=5),
    n_prefix=st.integers(0, 42),
    bq=st.integers(1, 17),
    bk=st.integers(1, 17),
)
def test_analytic_block_kinds_exact(N, M_, left, right, gidx, n_prefix, bq, bk):
    """Causal, sliding window, padding, key prefix and global tokens classify tiles exactly."""
    lengths = [0, min(n_prefix, M_), M_]
    gidx = [i % M_ for i in gidx]  # key positions of this call
    cases = [
        (masks.causal(), p_causal(N, M_)),
        (masks.sliding_window(left, right), p_window(left, right, N, M_)),
        (masks.padding(lengths), p_padding(lengths)),
        (masks.global_tokens(gidx), p_global(set(gidx), N, M_)),
        (masks.prefix_lm(n_prefix), p_prefix(n_prefix, N, M_)),
    ]
    for mask, pred in cases:
        want = brute(pred, 3, 1, N, M_)
        assert torch.equal(full(mask, 3, 1, N, M_), want), repr(mask)
        assert torch.equal(kinds_of(mask, 3, 1, N, M_, bq, bk), reference_kinds(want, bq, bk)), (
            f"{mask!r}: block_kinds not exact at N={N}, M={M_}, blocks {bq}x{bk}"
        )


def test_binary_kinds_follow_the_order():
    """& is the minimum, | the maximum and ~ is FULL - kind (the documented algebra)."""
    a, b = masks.causal(), masks.sliding_window(3, 1)
    ka, kb = a.block_kinds(20, 20, 4, 4), b.block_kinds(20, 20, 4, 4)
    assert torch.equal((a & b).block_kinds(20, 20, 4, 4), torch.minimum(ka, kb))
    assert torch.equal((a | b).block_kinds(20, 20, 4, 4), torch.maximum(ka, kb))
    assert torch.equal((~a).block_kinds(20, 20, 4, 4), masks.FULL - ka)


# -- the seeds' conventions -----------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 6, 11])
def test_from_blocked_look_ahead_is_causal(size):
    look_ahead = np.triu(np.ones((size, size)), k=1)  # the seeds' create_look_ahead_mask
    m = masks.from_blocked(torch.from_numpy(look_ahead))
    assert torch.equal(m.dense(size, size).expand(1, 1, size, size), masks.causal().dense(size, size))


def test_from_blocked_padding_matches_padding_from_tokens():
    seqs = np.array([[1, 2, 3, 4, 0, 0], [1, 2, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6]])  # the seeds' batch
    blocked = (seqs == 0).astype(float)[:, np.newaxis, np.newaxis, :]  # create_padding_mask: (3, 1, 1, 6)
    m = masks.from_blocked(torch.from_numpy(blocked))
    want = masks.padding_from_tokens(torch.from_numpy(seqs), pad_id=0).dense(5, 6)
    assert torch.equal(m.dense(5, 6).expand(3, 1, 5, 6), want.expand(3, 1, 5, 6))
    assert torch.equal(want.expand(3, 1, 5, 6), masks.padding([4, 2, 6]).dense(5, 6).expand(3, 1, 5, 6))


# -- errors name the argument ----------------------------------------------------------------
@pytest.mark.parametrize(
    "make,words",
    [
        (lambda: masks.sliding_window(-1), ["left"]),
        (lambda: masks.sliding_window(2, -3), ["right"]),
        (lambda: masks.sliding_window(1.5), ["left"]),
        (lambda: masks.padding([2, -1]), ["lengths", ">= 0"]),
        (lambda: masks.padding([[1, 2]]), ["lengths", "(1, 2)"]),
        (lambda: masks.padding([1.0, 2.0]), ["lengths", "float"]),
        (lambda: masks.key_mask(torch.ones(2, 3)), ["keep", "bool"]),
        (lambda: masks.key_mask(torch.ones(3, dtype=torch.bool)), ["keep", "(3,)"]),
        (lambda: masks.global_tokens([0, -2]), ["indices"]),
        (lambda: masks.document(torch.zeros(2, 3)), ["ids", "float"]),
        (lambda: masks.document(torch.zeros(1, 2, 3, dtype=torch.long)), ["ids", "(1, 2, 3)"]),
        (lambda: masks.prefix_lm(-1), ["n"]),
        (lambda: masks.dense(torch.ones(3, 3)), ["allowed", "bool"]),
        (lambda: masks.dense(torch.ones(1, 1, 1, 3, 3, dtype=torch.bool)), ["allowed", "(1, 1, 1, 3, 3)"]),
        (lambda: masks.padding_from_tokens(torch.zeros(5, dtype=torch.long)), ["tokens", "(5,)"]),
        (lambda: masks.padding([1, 2]) & masks.padding([1, 2, 3]), ["batch sizes", "2", "3"]),
        (lambda: masks.dense(torch.ones(1, 2, 3, 3, dtype=torch.bool)) | masks.dense(torch.ones(1, 4, 3, 3, dtype=torch.bool)), ["head"]),
        (lambda: masks.causal() & torch.ones(3, 3), ["other"]),
        (lambda: masks.as_mask(torch.ones(3, 3)), ["mask", "float"]),
        (lambda: masks.as_mask("causal"), ["mask", "str"]),
        (lambda: masks.dense(torch.ones(3, 4, dtype=torch.bool)).dense(5, 4), ["(1, 1, 3, 4)", "n_q=5"]),
        (lambda: masks.key_mask(torch.ones(1, 4, dtype=torch.bool)).dense(2, 5), ["4", "n_k=5"]),
        (lambda: masks.document(torch.zeros(1, 4, dtype=torch.long)).dense(2, 5), ["4", "n_k=5"]),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make, words):
    with pytest.raises(ValueError) as e:
        make()
    for w in words:
        assert w in str(e.value), f"{w!r} not in {str(e.value)!r}"


@pytest.mark.parametrize("make,n_k,words", [
    (lambda: masks.padding([99]), 16, ["padding", "lengths", "99", "[0, 16]"]),
    (lambda: masks.padding([3, 17, 2]), 16, ["padding", "lengths", "17", "[0, 16]", "[3, 17, 2]"]),
    (lambda: masks.global_tokens([40]), 16, ["global_tokens", "indices", "40", "[0, 15]"]),
    (lambda: masks.global_tokens([0, 16]), 16, ["global_tokens", "indices", "16", "[0, 15]"]),
    (lambda: masks.global_tokens(list(range(0, 200, 2))), 97, ["198", "[0, 96]", "(100 values)"]),
    (lambda: masks.causal() & masks.padding([1, 20]), 16, ["lengths", "20"]),
    (lambda: masks.sliding_window(2, 2) | masks.global_tokens([5, 40]), 16, ["indices", "40"]),
    (lambda: ~masks.global_tokens([40]), 16, ["indices", "40"]),
])
def test_lengths_and_positions_beyond_the_keys_raise(make, n_k, words):
    """A padding length above M or a global position at or past M is an error wherever the mask is used."""
    mask = make()
    uses = {
        "dense": lambda: mask.dense(n_k // 2, n_k, batch=3),
        "block_kinds": lambda: mask.block_kinds(n_k // 2, n_k, 4, 4),
        "tile": lambda: mask.tile(0, 2, 0, 4, n_k // 2, n_k),
        "moved": lambda: mask.to("cpu").dense(1, n_k, batch=3),
    }
    for use, call in uses.items():
        with pytest.raises(ValueError) as e:
            call()
        for w in words:
            assert w in str(e.value), f"{use}: {w!r} not in {str(e.value)!r}"


def test_the_largest_valid_lengths_and_positions_are_accepted():
    n_k = 16
    assert masks.padding([n_k, 0]).dense(3, n_k).shape == (2, 1, 1, n_k)
    assert masks.padding([n_k]).block_kinds(3, n_k, 4, 4).eq(masks.FULL).all()
    d = masks.global_tokens([n_k - 1]).dense(3, n_k)[0, 0]  # queries at positions 13, 14, 15
    assert d[:, n_k - 1].all() and d[2].all() and not d[0, 0]
    with pytest.raises(ValueError, match=r"\[0, 15\]"):  # one more key position is too many
        masks.global_tokens([n_k]).dense(3, n_k)


def test_attention_rejects_out_of_range_masks_on_every_backend():
    from attnlab import attention

    q = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    for backend in ("auto", "math", "chunked", "reference"):
        for mask, word in ((masks.padding([99]), "lengths"), (masks.global_tokens([40]), "indices")):
            with pytest.raises(ValueError, match=word):
                attention(q, q, q, mask=mask, backend=backend)


def test_validating_needs_no_device_copy():
    """The sizes compared with N and M are host ints stored when the mask is built (no GPU sync per call)."""
    pad, glob = masks.padding(torch.tensor([3, 7])), masks.global_tokens(torch.tensor([9, 2, 9]))
    assert (pad.longest, pad.any_empty, glob.end) == (7, False, 10)
    moved = (pad & glob).to("cpu")
    assert (moved.a.longest, moved.b.end) == (7, 10) and moved.b.indices.tolist() == [2, 9]
    assert masks.padding([0, 2]).has_empty_rows(1, 4)


def test_document_rejects_more_queries_than_positions():
    """With N > M the first queries have no position in ``ids``; they must not wrap around."""
    m = masks.document(torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="n_q"):
        m.dense(6, 4)
    with pytest.raises(ValueError, match="n_q"):
        m.block_kinds(6, 4, 2, 2)


def test_to_moves_tensor_masks():
    m = (masks.padding([1, 2]) | masks.global_tokens([0])) & ~masks.document(torch.zeros(2, 3, dtype=torch.long))
    moved = m.to("cpu")
    assert torch.equal(moved.dense(3, 3, batch=2), m.dense(3, 3, batch=2))


def test_document_block_kinds_exact_on_large_ids():
    """Ids above 2**24 must not merge (a float32 round trip would make a mixed tile FULL)."""
    ids = torch.tensor([[2**24, 2**24 + 1, 2**24 + 1]])
    m = masks.document(ids)
    want = reference_kinds(m.dense(3, 3), 2, 2)
    got = m.block_kinds(3, 3, 2, 2)
    assert not ((got == masks.FULL) & (want != masks.FULL)).any()
    assert torch.equal(got, want)


def test_dense_key_padding_mask_depends_only_on_batch_and_keys():
    """A (B, 1, 1, M) dense mask (the seeds' padding mask) is a key mask, not a query mask."""
    m = masks.dense(torch.ones(2, 1, 1, 5, dtype=torch.bool))
    assert m.depends == frozenset({"b", "k"})
    blocked = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]).float()[:, None, None, :]
    fb = masks.from_blocked(blocked)
    assert fb.depends == frozenset({"b", "k"})
    torch.testing.assert_close(fb.dense(3, 5, batch=2), masks.padding([2, 4]).dense(3, 5, batch=2).expand(2, 1, 3, 5))


def test_single_row_masks_broadcast_over_the_batch_when_combined():
    ids = torch.tensor([0, 0, 1, 1, 1])
    m = masks.padding([5, 3]) & masks.document(ids)
    assert m.batch_size == 2
    want = masks.padding([5, 3]).dense(5, 5, batch=2) & masks.document(ids.expand(2, 5)).dense(5, 5)
    torch.testing.assert_close(m.dense(5, 5, batch=2), want)
    kinds = m.block_kinds(5, 5, 2, 2)
    want_kinds = (masks.padding([5, 3]) & masks.document(ids.expand(2, 5))).block_kinds(5, 5, 2, 2)
    torch.testing.assert_close(kinds.expand_as(want_kinds), want_kinds)
    with pytest.raises(ValueError, match="batch sizes 2 and 3"):
        masks.padding([5, 3]) & masks.padding([1, 2, 3])


def test_conjuncts_and_band_are_public_views_of_a_mask():
    c, w, p = masks.causal(), masks.sliding_window(3, 1), masks.padding([5, 3])
    assert masks.conjuncts(c) == [c]
    assert masks.conjuncts(c & (w & p)) == [c, w, p]
    assert masks.conjuncts(c | p) != [c, p] and len(masks.conjuncts(c | p)) == 1  # an | is one part
    both = c & w & p
    want = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    for part in masks.conjuncts(both):
        want &= part.dense(6, 6, batch=2)
    assert torch.equal(want, both.dense(6, 6, batch=2))
    assert c.band() == (None, 0) and w.band() == (3, 1)
    assert p.band() is None and (c & w).band() is None and masks.dense(torch.ones(2, 2, dtype=torch.bool)).band() is None
    kinds = masks.tile_kinds(torch.tensor([True, False, False]), torch.tensor([True, True, False]))
    assert kinds.tolist() == [masks.FULL, masks.PARTIAL, masks.EMPTY] and kinds.dtype == torch.int8
