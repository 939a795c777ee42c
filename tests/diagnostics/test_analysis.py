"""Per-head analysis: pattern labels on maps whose pattern is known by construction."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.diagnostics.analysis import (
    PATTERNS,
    analyze_heads,
    format_head_table,
    head_similarity,
    pattern_scores,
    redundant_heads,
    special_positions,
)
from attnlab.diagnostics.stream import statistics_from_weights


def _shifted(n: int, m: int, shift: int) -> torch.Tensor:
    """Each query (at key position i + m - n) puts all its weight on key pos + shift (clamped)."""
    w = torch.zeros(n, m, dtype=torch.float64)
    for i in range(n):
        j = min(max(i + (m - n) + shift, 0), m - 1)
        w[i, j] = 1.0
    return w


def _band(n: int, width: int) -> torch.Tensor:
    i = torch.arange(n).view(-1, 1)
    j = torch.arange(n).view(1, -1)
    w = ((i - j).abs() <= width).double()
    return w / w.sum(-1, keepdim=True)


def _columns(n: int, cols: list[int], rest: float = 0.0) -> torch.Tensor:
    w = torch.full((n, n), rest / n, dtype=torch.float64)
    w[:, cols] += (1.0 - rest) / len(cols)
    return w


def _label(w: torch.Tensor, tokens=None, **kw):
    (s,) = analyze_heads(w, tokens, **kw)
    return s


@pytest.mark.parametrize("n", [9, 97])
def test_pure_diagonal_is_self(n):
    s = _label(torch.eye(n, dtype=torch.float64))
    assert s.label == "self"
    torch.testing.assert_close(s.score, 1.0)
    torch.testing.assert_close(s.mean_distance, 0.0)
    torch.testing.assert_close(s.entropy, 0.0)


def test_previous_and_next_token():
    n = 23
    prev = _label(_shifted(n, n, -1))
    nxt = _label(_shifted(n, n, +1))
    assert prev.label == "previous" and nxt.label == "next"
    # all rows but the clamped first (last) one hit exactly one position away
    torch.testing.assert_close(prev.score, (n - 1) / n)
    torch.testing.assert_close(prev.mean_distance, (n - 1) / n)


def test_diagonal_with_fewer_queries_than_keys_uses_bottom_right_alignment():
    # 5 queries are the last 5 of 12 positions: query i attends to key i + 7
    s = _label(_shifted(5, 12, 0))
    assert s.label == "self"
    torch.testing.assert_close(s.score, 1.0)


def test_local_band():
    s = _label(_band(40, 2))
    assert s.label == "local"
    torch.testing.assert_close(s.scores["local"], 1.0)
    assert s.scores["self"] < 0.5


def test_first_token_sink_is_abnormal():
    w = _columns(30, [0], rest=0.1)
    s = _label(w)
    assert s.label == "sink" and s.abnormal
    torch.testing.assert_close(s.sink_mass, 0.9 + 0.1 / 30)


def test_separator_sink_found_from_tokens():
    tokens = ["[CLS]", "a", "b", "c", "[SEP]", "d", "e", "[SEP]"]
    assert special_positions(tokens, 8) == [0, 4, 7]
    w = _columns(8, [4, 7])
    s = _label(w, tokens)
    assert s.label == "sink" and s.abnormal
    # without the tokens the separators are ordinary positions: a global pattern
    s2 = _label(w, None, global_fraction=0.25)
    assert s2.label == "global" and not s2.abnormal


def test_global_stripes_on_ordinary_tokens():
    s = _label(_columns(60, [17, 41], rest=0.05))
    assert s.label == "global"
    assert not s.abnormal
    assert s.score > 0.9


def test_uniform_is_broad():
    n = 50
    s = _label(torch.full((n, n), 1.0 / n, dtype=torch.float64))
    assert s.label == "broad"
    torch.testing.assert_close(s.score, 1.0)
    torch.testing.assert_close(s.entropy, math.log(n))
    # mean |i - j| of the uniform distribution over 0..n-1, averaged over i
    i = torch.arange(n).double()
    expect = (i.view(-1, 1) - i.view(1, -1)).abs().mean()
    torch.testing.assert_close(s.mean_distance, float(expect))


def test_random_peaky_map_is_mixed():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(3.0 * torch.randn(40, 40, generator=g, dtype=torch.float64), -1)
    s = _label(w, sink_threshold=1.0)
    assert s.label == "mixed"
    assert set(s.scores) == set(PATTERNS)


def test_fully_masked_rows_are_skipped():
    w = torch.eye(11, dtype=torch.float64)
    w[3] = 0.0  # a query that saw no key
    s = _label(w)
    assert s.label == "self"
    torch.testing.assert_close(s.score, 1.0)
    scores, ent, dist = pattern_scores(torch.zeros(4, 4))
    assert ent == 0.0 and dist == 0.0 and max(scores.values()) == 0.0


def test_layers_batches_and_order():
    n = 13
    layer0 = torch.stack([torch.eye(n), _shifted(n, n, -1).float(), _band(n, 2).float()]).unsqueeze(0)  # (1, 3, N, N)
    layer1 = layer0.flip(1).repeat(2, 1, 1, 1)  # (2, 3, N, N): batch of two
    stats = analyze_heads([layer0, layer1])
    assert [(s.layer, s.head) for s in stats] == [(layer, h) for layer in range(2) for h in range(3)]
    assert [s.label for s in stats] == ["self", "previous", "local", "local", "previous", "self"]


def test_entropy_and_distance_agree_with_the_statistics_module():
    g = torch.Generator().manual_seed(1)
    w = torch.softmax(torch.randn(2, 3, 17, 17, generator=g, dtype=torch.float64), -1)
    stats = analyze_heads(w)
    ref = statistics_from_weights(w)
    for s in stats:
        torch.testing.assert_close(s.entropy, float(ref.entropy[:, s.head].mean()))
        torch.testing.assert_close(s.mean_distance, float(ref.mean_distance[:, s.head].mean()))


def test_head_similarity_js_and_cosine():
    n = 10
    eye, prev = torch.eye(n, dtype=torch.float64), _shifted(n, n, -1)
    prev[0] = 0.0
    prev[0, n - 1] = 1.0  # disjoint from the diagonal in every row
    layer = torch.stack([eye, prev, eye.clone()]).unsqueeze(0)  # (1, 3, N, N)
    for metric in ("js", "cosine"):
        sim = head_similarity([layer, layer], metric=metric)
        assert sim.shape == (6, 6)
        torch.testing.assert_close(sim, sim.T)
        torch.testing.assert_close(sim.diagonal(), torch.ones(6, dtype=torch.float64))
        torch.testing.assert_close(sim[0, 2], torch.tensor(1.0, dtype=torch.float64))
        torch.testing.assert_close(sim[0, 1], torch.tensor(0.0, dtype=torch.float64))
    pairs = redundant_heads(head_similarity([layer]), 3, threshold=0.99)
    assert [(a, b) for a, b, _ in pairs] == [((0, 0), (0, 2))]


def test_head_similarity_partial_overlap_is_between_zero_and_one():
    n = 8
    a = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    b = torch.eye(n, dtype=torch.float64)
    sim = head_similarity(torch.stack([a, b]).unsqueeze(0), block=1)
    # JS(uniform, one-hot) = log 2 - (1/2)(1 + 1/n) log(1 + n) ... checked against the definition
    m = 0.5 * (a + b)
    js = (-(m * m.clamp_min(1e-300).log()).sum(-1) - 0.5 * math.log(n)).mean()
    torch.testing.assert_close(sim[0, 1], 1.0 - js / math.log(2.0))


def test_format_table_and_bad_arguments():
    stats = analyze_heads(torch.stack([torch.eye(6), _columns(6, [0]).float()]))
    table = format_head_table(stats)
    assert "self" in table and "sink" in table and "ABNORMAL" in table
    assert len(table.splitlines()) == 3
    with pytest.raises(ValueError, match="sink_threshold"):
        analyze_heads(torch.eye(4), sink_threshold=2.0)
    with pytest.raises(ValueError, match="band"):
        analyze_heads(torch.eye(4), band=-1)
    with pytest.raises(ValueError, match="weights"):
        analyze_heads(torch.zeros(1, 1, 1, 4, 4))
    with pytest.raises(ValueError, match="metric"):
        head_similarity(torch.eye(4), metric="l2")
    with pytest.raises(ValueError, match="share"):
        head_similarity([torch.eye(4), torch.eye(5)])
