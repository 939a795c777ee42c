"""Grid, video and tree masks (attnlab.masks.structured) against dense constructions written here.

Every mask is compared with a double loop over grid coordinates (or, for trees, a walk up the
parents and a scan for the enclosing brackets) on odd shapes: H != W, windows that do not
divide the shape. Tile kinds are compared with the tiles of the dense matrix, the ``regroup``
backend's reshape with timm's ``window_partition`` / ``grid_partition`` (restated below), and
bad arguments must raise ValueErrors that name them.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import attnlab
from attnlab import masks
from attnlab.exact import chunked_attention, explain, make_call

# -- dense constructions, independent of attnlab's code ----------------------------------------------


def coords(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Coordinates of every position, in the documented row-major order (last axis fastest)."""
    return list(itertools.product(*(range(s) for s in shape)))


def from_pred(shape, pred) -> torch.Tensor:
    """``(N, N)`` bool: ``pred(coords of i, coords of j)`` for every pair."""
    cs = coords(shape)
    return torch.tensor([[bool(pred(a, b)) for b in cs] for a in cs])


def dense_of(mask, n: int, batch: int = 1) -> torch.Tensor:
    return mask.dense(n, n, batch=batch).expand(batch, 1, n, n)[:, 0]


def p_axial(axis):
    return lambda a, b: all(x == y for d, (x, y) in enumerate(zip(a, b)) if d != axis)


def p_block(size):
    sh, sw = size
    return lambda a, b: a[:-2] == b[:-2] and a[-2] // sh == b[-2] // sh and a[-1] // sw == b[-1] // sw


def p_grid(shape, size):
    rh, rw = math.ceil(shape[-2] / size[0]), math.ceil(shape[-1] / size[1])  # rows / columns apart
    return lambda a, b: a[:-2] == b[:-2] and a[-2] % rh == b[-2] % rh and a[-1] % rw == b[-1] % rw


GRID_CASES = [
    ("axial rows (5, 7)", masks.axial((5, 7), -1), (5, 7), p_axial(1)),
    ("axial columns (5, 7)", masks.axial((5, 7), 0), (5, 7), p_axial(0)),
    ("axial time (3, 4, 6)", masks.axial((3, 4, 6), 0), (3, 4, 6), p_axial(0)),
    ("axial height (3, 4, 6)", masks.axial((3, 4, 6), 1), (3, 4, 6), p_axial(1)),
    ("axial width (3, 4, 6)", masks.axial((3, 4, 6), -1), (3, 4, 6), p_axial(2)),
    ("same_frame (3, 4, 5)", masks.same_frame((3, 4, 5)), (3, 4, 5), lambda a, b: a[0] == b[0]),
    ("same_position (2, 3, 7)", masks.same_position((2, 3, 7)), (2, 3, 7), lambda a, b: a[1:] == b[1:]),
    ("block_2d (5, 7) 2x3", masks.block_2d((5, 7), (2, 3)), (5, 7), p_block((2, 3))),
    ("block_2d (6, 8) 3x4", masks.block_2d((6, 8), (3, 4)), (6, 8), p_block((3, 4))),
    ("block_2d (3, 5, 7) 2x4", masks.block_2d((3, 5, 7), (2, 4)), (3, 5, 7), p_block((2, 4))),
    ("block_2d (4, 9) whole", masks.block_2d((4, 9), (4, 9)), (4, 9), lambda a, b: True),
    ("grid_2d (5, 7) 2x3", masks.grid_2d((5, 7), (2, 3)), (5, 7), p_grid((5, 7), (2, 3))),
    ("grid_2d (6, 8) 2x4", masks.grid_2d((6, 8), (2, 4)), (6, 8), p_grid((6, 8), (2, 4))),
    ("grid_2d (2, 6, 9) 3x3", masks.grid_2d((2, 6, 9), 3), (2, 6, 9), p_grid((6, 9), (3, 3))),
    ("grid_2d (4, 7) 1x1", masks.grid_2d((4, 7), 1), (4, 7), lambda a, b: a == b),
]


@pytest.mark.parametrize("name,mask,shape,pred", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_grid_masks_equal_their_definitions(name, mask, shape, pred):
    n = math.prod(shape)
    want = from_pred(shape, pred)
    torch.testing.assert_close(dense_of(mask, n)[0], want)
    # a tile is the slice of the dense mask
    torch.testing.assert_close(mask.tile(3, n - 1, 2, n, n, n)[0, 0], want[3:n - 1, 2:n])
    assert not mask.has_empty_rows(n, n)


def test_the_grid_definitions_agree_with_timm_partitions_when_sizes_divide():
    """timm's window_partition / grid_partition (restated) group the same cells as block_2d / grid_2d."""
    h, w, p = 6, 8, 2
    x = torch.arange(h * w).view(1, h, w, 1)  # the position of every cell

    def window_partition(x, size):  # timm.layers.window_partition
        b, hh, ww, c = x.shape
        x = x.view(b, hh // size[0], size[0], ww // size[1], size[1], c)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, size[0], size[1], c)

    def grid_partition(x, size):  # timm.layers.grid_partition
        b, hh, ww, c = x.shape
        x = x.view(b, size[0], hh // size[0], size[1], ww // size[1], c)
        return x.permute(0, 2, 4, 1, 3, 5).reshape(-1, size[0], size[1], c)

    for fn, mask in ((window_partition, masks.block_2d((h, w), (p, p))), (grid_partition, masks.grid_2d((h, w), (p, p)))):
        groups = fn(x, (p, p)).reshape(-1, p * p)  # (G, S) positions of each group
        allowed = torch.zeros(h * w, h * w, dtype=torch.bool)
        for g in groups:
            allowed[g[:, None], g[None, :]] = True
        torch.testing.assert_close(dense_of(mask, h * w)[0], allowed)
        # and the regroup backend's split puts exactly those groups in its batch rows
        got = mask.regrouping().split(torch.arange(h * w).view(1, 1, h * w, 1))  # (G, 1, S, 1)
        assert sorted(map(sorted, got.view(-1, p * p).tolist())) == sorted(map(sorted, groups.tolist()))


@pytest.mark.parametrize("name,mask,shape,pred", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_regrouping_splits_and_merges_back(name, mask, shape, pred):
    plan = mask.regrouping()
    divides = all(s % r[1] == 0 for s, r in zip(shape, mask.rules) if r[0] in ("block", "grid"))
    assert (plan is not None) == divides
    if plan is None:
        return
    n = math.prod(shape)
    x = torch.randn(2, 3, n, 4)
    parts = plan.split(x)  # (B * G, H, S, D)
    assert parts.shape == (2 * plan.groups, 3, plan.size, 4)
    torch.testing.assert_close(plan.merge(parts, 2), x)
    # the positions of a batch row are one group of the mask, whole
    pos = plan.split(torch.arange(n).view(1, 1, n, 1).expand(2, 1, n, 1))[:, 0, :, 0]  # (B * G, S)
    allowed = dense_of(mask, n)[0]
    for row in pos:
        assert bool(allowed[row[:, None], row[None, :]].all())
        assert int(allowed[row[0]].sum()) == plan.size


# -- trees ------------------------------------------------------------------------------------------


def brute_brackets(tokens: list[int], opens: set[int], close: int) -> torch.Tensor:
    """Visibility from the bracket rule, found by scanning outward from each token with a depth count."""
    n = len(tokens)

    def span(i: int) -> tuple[int, int]:
        if tokens[i] in opens:
            start = i
        elif tokens[i] == close:  # the opening token it closes: scan left with a depth count
            depth, start = 0, i - 1
            while True:
                depth += 1 if tokens[start] == close else -1 if tokens[start] in opens else 0
                if depth < 0:
                    break
                start -= 1
        else:  # the innermost unmatched opening token to the left
            depth, start = 0, i - 1
            while start >= 0:
                depth += 1 if tokens[start] == close else -1 if tokens[start] in opens else 0
                if depth < 0:
                    break
                start -= 1
            if start < 0:
                return 0, n - 1
        depth, end = 0, start + 1
        while True:  # its closing token: scan right
            depth += 1 if tokens[end] in opens else -1 if tokens[end] == close else 0
            if depth < 0:
                return start, end
            end += 1

    spans = [span(i) for i in range(n)]
    return torch.tensor([[spans[i][0] <= j <= spans[i][1] or spans[j][0] <= i <= spans[j][1] for j in range(n)]
                         for i in range(n)])


def brute_tree(parents: list[int]) -> torch.Tensor:
    """Visibility as ancestry: ``j`` is an ancestor-or-self of ``i`` or ``i`` of ``j``."""
    def ancestors(i):
        out = {i}
        while parents[i] != -1:
            i = parents[i]
            out.add(i)
        return out

    anc = [ancestors(i) for i in range(len(parents))]
    return torch.tensor([[j in anc[i] or i in anc[j] for j in range(len(parents))] for i in range(len(parents))])


def test_brackets_on_a_listops_expression():
    from attnlab.tasks.listops import VOCAB

    ids = {t: i for i, t in enumerate(VOCAB)}
    text = "<cls> [MAX 2 9 [MIN 4 7 ] 0 [SM 1 [MED 3 3 5 ] ] ] <pad>".split()
    tokens = [ids[t] for t in text]
    opens = {ids[o] for o in ("[MIN", "[MAX", "[MED", "[SM")}
    mask = masks.brackets(torch.tensor(tokens), opening=sorted(opens), closing=ids["]"])
    got = dense_of(mask, len(tokens))[0]
    torch.testing.assert_close(got, brute_brackets(tokens, opens, ids["]"]))
    at = {name: text.index(name) for name in ("[MIN", "[SM", "[MED")}
    four, three = text.index("4"), text.index("3")
    assert got[four, at["[MIN"]] and got[four, text.index("2")]  # its own pair, and a token of the enclosing pair
    assert not got[four, at["[SM"]] and not got[four, three]  # never a sibling subtree
    assert got[at["[SM"], three] and got[three, at["[SM"]]  # a subtree nested inside, both ways
    assert bool(got[0].all()) and bool(got[:, 0].all())  # the class token spans the sequence


@pytest.mark.parametrize("seed", range(6))
def test_brackets_and_tree_on_random_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    B, n = 3, 23
    rows, parents = [], []
    for _ in range(B):
        toks, depth = [], 0
        for i in range(n):
            r = float(torch.rand((), generator=g))
            if depth and (n - i == depth or r < 0.3):
                toks.append(2)
                depth -= 1
            elif n - i > depth + 1 and r < 0.65:
                toks.append(1)
                depth += 1
            else:
                toks.append(int(torch.randint(3, 6, (), generator=g)))
        rows.append(toks)
        par, path = [], []
        for i in range(n):
            while path and float(torch.rand((), generator=g)) < 0.35:
                path.pop()
            par.append(path[-1] if path else -1)
            path.append(i)
        parents.append(par)
    got = dense_of(masks.brackets(torch.tensor(rows), opening=1, closing=2), n, B)
    for b in range(B):
        torch.testing.assert_close(got[b], brute_brackets(rows[b], {1}, 2))
    got = dense_of(masks.tree(torch.tensor(parents)), n, B)
    for b in range(B):
        torch.testing.assert_close(got[b], brute_tree(parents[b]))
    # nested() takes the spans as they are: the same mask
    t = masks.tree(torch.tensor(parents))
    again = masks.nested(torch.stack([t.lo, t.hi], dim=-1))
    torch.testing.assert_close(dense_of(again, n, B), got)


# -- tiles ------------------------------------------------------------------------------------------


def reference_kinds(allowed: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """Tile kinds of a ``(B, N, M)`` bool tensor by slicing each tile."""
    B, N, M = allowed.shape
    out = torch.empty(B, -(-N // bq), -(-M // bk), dtype=torch.int8)
    for a, c in itertools.product(range(out.shape[1]), range(out.shape[2])):
        t = allowed[:, a * bq:(a + 1) * bq, c * bk:(c + 1) * bk]
        out[:, a, c] = torch.where(t.flatten(1).all(1), masks.FULL, torch.where(t.flatten(1).any(1), masks.PARTIAL,
                                                                              masks.EMPTY))
    return out


TREE_MASKS = [
    ("brackets", masks.brackets(torch.tensor([1, 0, 1, 0, 0, 2, 1, 1, 0, 2, 0, 2, 0, 2, 0, 1, 0, 2]), 1, 2)),
    ("tree", masks.tree([-1, 0, 1, 1, 0, 4, 5, 5, 4, -1, 9, 10, 10, 10, 9, 14, 14, 14])),
]


@pytest.mark.parametrize("bq,bk", [(1, 1), (2, 3), (4, 4), (5, 2), (7, 11), (64, 64)])
def test_block_kinds_are_exact_for_grids_and_safe_for_trees(bq, bk):
    for name, mask, shape, _ in GRID_CASES:
        n = math.prod(shape)
        ref = reference_kinds(dense_of(mask, n), bq, bk)
        got = mask.block_kinds(n, n, bq, bk)
        torch.testing.assert_close(got[:, 0], ref, msg=name)  # grid masks: every kind exact
    for name, mask in TREE_MASKS:
        n = mask.lo.shape[1]
        ref = reference_kinds(dense_of(mask, n), bq, bk)
        got = mask.block_kinds(n, n, bq, bk)[:, 0]
        assert torch.equal(got == masks.EMPTY, ref == masks.EMPTY), name  # EMPTY exact
        assert bool((ref[got == masks.FULL] == masks.FULL).all()), name  # FULL only when full


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_with_small_tiles_skips_and_equals_math(dtype):
    """With 8 x 8 tiles EMPTY tiles are skipped and FULL ones evaluate no mask: same numbers as math."""
    g = torch.Generator().manual_seed(3)
    for name, mask, shape, _ in GRID_CASES + [(n, m, (m.lo.shape[1],), None) for n, m in TREE_MASKS]:
        n = math.prod(shape)
        q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for _ in range(3))
        call = make_call(q, k, v, mask=mask)
        out = chunked_attention(call, block_q=8, block_k=8)
        want = attnlab.attention(q, k, v, mask=dense_of(mask, n)[:, None], backend="math")
        w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype)
        got = (out, *torch.autograd.grad((out * w).sum(), (q, k, v)))
        ref = (want, *torch.autograd.grad((want * w).sum(), (q, k, v)))
        for a, b in zip(got, ref):
            assert (a - b).abs().max().item() <= 1e-6 * max(1.0, b.abs().max().item()), name


# -- the regroup backend ----------------------------------------------------------------------------


def test_auto_regroups_axial_and_frame_masks_and_says_why_not_elsewhere():
    q = torch.randn(1, 2, 4 * 6 * 8, 16)
    for mask in (masks.axial((4, 6, 8), 0), masks.same_frame((4, 6, 8)), masks.block_2d((4, 6, 8), (3, 4)),
                 masks.grid_2d((4, 6, 8), (2, 2)) & masks.padding([150])):
        verdicts = {v.backend: v for v in explain(q, q, q, mask=mask)}
        assert verdicts["regroup"].chosen and "groups of" in verdicts["regroup"].note
    ragged = {v.backend: v for v in explain(q, q, q, mask=masks.block_2d((4, 6, 8), (4, 3)))}
    assert "not a pure reshape" in ragged["regroup"].reason
    mixed = {v.backend: v for v in explain(q, q, q, mask=masks.axial((4, 6, 8), 0) & masks.causal())}
    assert "neither a grid mask nor a key mask" in mixed["regroup"].reason
    for kwargs, words in (({"bias": torch.zeros(192, 192)}, "bias"), ({"dropout_p": 0.1}, "dropout"),
                          ({"return_weights": True}, "weights")):
        v = {v.backend: v for v in explain(q, q, q, mask=masks.axial((4, 6, 8), 0), **kwargs)}
        assert words in v["regroup"].reason


def test_regroup_hides_what_a_query_may_not_see_and_padded_frames():
    T, H, W = 4, 3, 5
    n = T * H * W
    mask = masks.same_position((T, H, W)) & masks.padding([n, 2 * H * W])  # the second video has 2 real frames
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=g) for _ in range(3))
    out = attnlab.attention(q, k, v, mask=mask, backend="regroup")
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 7], v2[:, :, 7] = 100.0, -100.0  # the position (t=0, h=1, w=2): only its own time line sees it
    k2[1, :, 2 * H * W:], v2[1, :, 2 * H * W:] = 50.0, 50.0  # the padded frames of the second video
    out2 = attnlab.attention(q, k2, v2, mask=mask, backend="regroup")
    sees = torch.tensor([p % (H * W) == 7 for p in range(n)])
    torch.testing.assert_close(out2[0, :, ~sees], out[0, :, ~sees])
    torch.testing.assert_close(out2[1, :, ~sees], out[1, :, ~sees])
    assert not torch.allclose(out2[0, :, sees], out[0, :, sees])


# -- bad input ----------------------------------------------------------------------------------------

BAD = [
    (lambda: masks.axial((4, 5), 2), ["axial", "axis"]),
    (lambda: masks.axial((4, 0), 0), ["axial", "shape"]),
    (lambda: masks.axial("4x5", 0), ["axial", "shape"]),
    (lambda: masks.same_frame((4, 5)), ["same_frame", "shape", "(T, H, W)"]),
    (lambda: masks.same_position((2, 4, 5, 1)), ["same_position", "shape"]),
    (lambda: masks.block_2d((4, 5), 0), ["block_2d", "size", "[1, 4]"]),
    (lambda: masks.block_2d((4, 5), (2, -1)), ["block_2d", "size", "[1, 5]"]),
    (lambda: masks.block_2d((4, 5), (2, 6)), ["block_2d", "size", "[1, 5]", "columns"]),
    (lambda: masks.grid_2d((3, 4, 5), (5, 1)), ["grid_2d", "size", "[1, 4]", "rows"]),
    (lambda: masks.grid_2d((4, 5), 1.5), ["grid_2d", "size"]),
    (lambda: masks.brackets(torch.tensor([1, 0, 2, 2]), 1, 2), ["brackets", "unbalanced", "position 3"]),
    (lambda: masks.brackets(torch.tensor([[1, 2], [1, 0]]), 1, 2), ["brackets", "unbalanced", "row 1", "never closed"]),
    (lambda: masks.brackets(torch.tensor([1, 2]), 1, 1), ["brackets", "differ"]),
    (lambda: masks.brackets(torch.tensor([0.5]), 1, 2), ["brackets", "tokens", "integers"]),
    (lambda: masks.tree([-1, 0, 5]), ["tree", "parents[0][2] = 5", "out of range", "[-1, 2]"]),
    (lambda: masks.tree([-1, -2]), ["tree", "out of range"]),
    (lambda: masks.tree([-1, 1]), ["tree", "own parent"]),
    (lambda: masks.tree([-1, 2, 0]), ["tree", "preorder"]),
    (lambda: masks.tree([-1, 0, -1, 1]), ["tree", "preorder"]),
    (lambda: masks.nested([[0, 1], [2, 2]]), ["nested", "spans[0][1]", "position 1"]),
    (lambda: masks.nested([[0, 0, 0]]), ["nested", "spans", "(N, 2)"]),
]


@pytest.mark.parametrize("make,words", BAD, ids=[" ".join(w[:2]) for _, w in BAD])
def test_bad_arguments_raise_value_errors_naming_them(make, words):
    with pytest.raises(ValueError) as e:
        make()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("mask,n", [(masks.axial((4, 5), 0), 21), (masks.block_2d((3, 4, 5), 2), 59),
                                    (masks.brackets(torch.tensor([1, 0, 2]), 1, 2), 4), (masks.tree([-1, 0]), 3)])
def test_a_call_whose_length_is_not_the_shape_product_is_refused_naming_the_shape(mask, n):
    q = torch.randn(1, 1, n, 4)
    for fn in (lambda: mask.dense(n, n), lambda: mask.block_kinds(n, n, 4, 4)):
        with pytest.raises(ValueError, match="positions"):
            fn()
    for backend in ("math", "chunked", "sdpa") + (("regroup",) if hasattr(mask, "regrouping") else ()):
        with pytest.raises(ValueError, match="shape .* has .* positions|the spans cover"):
            attnlab.attention(q, q, q, mask=mask, backend=backend)
