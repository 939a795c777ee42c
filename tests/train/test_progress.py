"""attnlab.train.progress: the one progress display (training's Progress and the bench's, on ProgressBar).

The bench's lines off a terminal are tested in tests/bench/test_runner.py.

On a terminal tqdm redraws one bar in place with messages above it; into a file one whole
line per call; disabled, nothing but messages. The ETA counts only steps that did work.
"""

from __future__ import annotations

import io

import pytest

from attnlab.bench.progress import BenchProgress
from attnlab.train import progress as progress_mod
from attnlab.train.progress import Progress, ProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch):
    """perf_counter under the test's control: ``clock[0] += s`` lets s seconds pass."""
    now = [100.0]
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: now[0])
    return now


def test_train_log_lines_every_n_steps_and_at_the_end(clock):
    out = io.StringIO()
    p = Progress(7, stream=out, every=3, unit="seq")
    for step in range(7):
        clock[0] += 0.5
        p.update(step, 2.0 / (step + 1), lr=1e-3, items=4)
    lines = out.getvalue().splitlines()
    assert [line.split("| step ")[1].split(" ")[0] for line in lines] == ["3/7", "6/7", "7/7"]
    assert "\r" not in out.getvalue()
    assert lines[0].startswith(" 43%|") and lines[-1].startswith("100%|")
    assert "loss 0.6667 | lr 1.00e-03 | 2.00 it/s | 8 seq/s | elapsed 0:02 eta 0:02" in lines[0]


def test_train_on_a_terminal_redraws_with_messages_above(clock):
    out = Terminal()
    p = Progress(3, stream=out)
    p.message("starting")
    for step in range(3):
        clock[0] += 1.0
        p.update(step, 1.0)
        if step == 0:
            p.message("step 1: val loss 0.5")
    p.message("done")
    text = out.getvalue()
    assert "\r" in text and "step 3/3" in text and text.endswith("\ndone\n")
    assert "starting\n" in text and "step 1: val loss 0.5\n" in text
    assert text.index("step 1/3") < text.index("step 1: val loss") < text.index("step 2/3")
    assert text.count("\n") == 4  # three messages and the closed bar: the bar itself never adds lines


def test_disabled_shows_nothing_but_messages():
    for stream in (io.StringIO(), Terminal()):
        p = Progress(3, enabled=False, stream=stream, every=1)
        for step in range(3):
            p.update(step, 1.0, items=5)
        p.message("hello")
        assert stream.getvalue() == "hello\n" and p.items == 15


def test_resumed_steps_do_not_count_in_speed_or_eta(clock):
    p = Progress(100, start=90, stream=io.StringIO())
    clock[0] += 5.0  # 5 steps of this process in 5 s; the 90 before cost it nothing
    assert p.line(94, 1.0).endswith("1.00 it/s | elapsed 0:05 eta 0:05")


def test_eta_budget_and_unknown(clock):
    bar = ProgressBar(10, stream=io.StringIO(), time_budget=30.0)
    assert bar.eta() == 30.0  # nothing ran yet: only the budget says anything
    assert ProgressBar(10, stream=io.StringIO()).eta() is None
    bar.advance(4.0)
    clock[0] += 40.0
    assert bar.eta() == 0.0


def test_bench_on_a_terminal_and_quiet():
    out = Terminal()
    bar = BenchProgress({"kernels": 2}, stream=out)
    bar.start("kernels", "case a")
    bar.step("kernels", 1.0)
    bar.start("kernels", "case b")
    bar.step("kernels", 1.0)
    bar.close()
    bar.close()
    text = out.getvalue()
    assert "\r" in text and "case a" in text and text.endswith("\n") and text.count("\n") == 1
    quiet = io.StringIO()
    bar = BenchProgress({"kernels": 2}, enabled=False, stream=quiet)
    bar.start("kernels", "case a")
    bar.step("kernels", 1.0)
    bar.close()
    assert quiet.getvalue() == ""
