"""The bench's progress display: suited to its terminal.

On a terminal, one bar redrawn in place (tqdm, through :class:`attnlab.train.progress.ProgressBar`)
with the case running now. Anywhere else (CI, ``nohup``, a log file) whole lines, few of
them: one when a suite starts, one when it ends, and between them at most one a minute,
with the cases done and the time left. A run of hundreds of cases therefore writes a few
dozen lines, not one per case.

The time left counts only cases that did work (cases read back from a journal took none).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from ..train.progress import ProgressBar, format_duration

__all__ = ["BenchProgress"]

#: seconds between two progress lines off a terminal
LOG_EVERY_S = 60.0


class BenchProgress:
    """Progress of a bench run over suites of known case counts.

    Args:
        counts: cases per suite, in the order they run.
        enabled: False shows nothing.
        stream: where to write (default stderr).
    """

    def __init__(self, counts: dict[str, int], enabled: bool = True, stream: TextIO | None = None):
        self.counts = dict(counts)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.bar = ProgressBar(sum(self.counts.values()), enabled=enabled and bool(
            getattr(self.stream, "isatty", lambda: False)()), stream=self.stream)
        self.tty = self.bar.tty
        self.done = {name: 0 for name in self.counts}
        self.started: dict[str, float] = {}
        self._logged = time.perf_counter()
        self._lock = threading.Lock()  # lanes report from several threads

    def _line(self, text: str) -> None:
        if self.enabled and not self.tty:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._logged = time.perf_counter()

    def _eta(self) -> str:
        eta = self.bar.eta()
        return "" if eta is None else f", about {format_duration(eta)} left"

    def start(self, suite: str, label: str) -> None:
        """The case ``label`` of ``suite`` starts."""
        with self._lock:
            self._start(suite, label)

    def _start(self, suite: str, label: str) -> None:
        if suite not in self.started:
            self.started[suite] = time.perf_counter()
            self._line(f"attnlab bench: {suite}: {self.counts.get(suite, 0)} cases")
        if self.tty:
            self.bar.show(f"{self.bar.done}/{self.bar.total} elapsed {format_duration(self.bar.elapsed())}  {label}",
                          force=True)
        elif time.perf_counter() - self._logged >= LOG_EVERY_S:
            self._line(f"attnlab bench: {self.bar.done}/{self.bar.total} cases done, elapsed "
                       f"{format_duration(self.bar.elapsed())}{self._eta()}; now {label}")

    def step(self, suite: str, seconds: float | None = None) -> None:
        """A case of ``suite`` ended; ``seconds`` it took (None: read back from the journal)."""
        with self._lock:
            self._step(suite, seconds)

    def _step(self, suite: str, seconds: float | None) -> None:
        self.bar.advance(seconds)
        self.done[suite] = self.done.get(suite, 0) + 1
        if suite not in self.started:
            self.started[suite] = time.perf_counter()
        if self.done[suite] == self.counts.get(suite):
            took = time.perf_counter() - self.started[suite]
            self._line(f"attnlab bench: {suite}: done in {format_duration(took)} "
                       f"({self.bar.done}/{self.bar.total} cases{self._eta()})")

    def close(self) -> None:
        """End the display."""
        self.bar.close()
