"""Adaptive span's pictures: the spans read back from a run's records, both panels drawn, a clear error without spans."""

from __future__ import annotations

import pytest

from attnlab.viz import plot_spans, span_history

pytest.importorskip("matplotlib")

RECORDS = [{"step": 0, "split": "phase", "phase": 0},
           {"step": 50, "split": "train", "loss": 3.0, "spans": [[0.0, 4.0, 10.0], [2.0, 0.0, 30.0]]},
           {"step": 60, "split": "val", "loss": 2.9},
           {"step": 100, "split": "train", "loss": 2.5, "spans": [[1.0, 8.0, 20.5], [0.0, 0.0, 64.0]]}]


def test_span_history_reads_the_training_records(tmp_path):
    steps, spans = span_history(RECORDS)
    assert steps.tolist() == [50, 100] and spans.shape == (2, 2, 3) and spans[1, 1, 2] == 64.0
    import json
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert span_history(tmp_path)[1].tolist() == spans.tolist()


def test_plot_spans_writes_a_png(tmp_path):
    out = plot_spans(RECORDS, context=128, path=tmp_path / "spans.png")
    assert out == tmp_path / "spans.png" and out.stat().st_size > 1000
    fig = plot_spans(RECORDS)
    assert len(fig.axes) == 2 and "mean final span 15.6" in fig.texts[0].get_text()


def test_a_run_without_spans_says_so():
    with pytest.raises(ValueError, match="adaptive-span"):
        span_history([{"step": 1, "split": "train", "loss": 1.0}])
