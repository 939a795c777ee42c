"""Progress displays: a bar, a line of text beside it, and the time left.

:class:`ProgressBar` is the one implementation, shared by training (:class:`Progress`:
step, loss, lr, speed) and the benchmark (``attnlab.bench.progress.BenchProgress``: the case
running, cases done). On a terminal tqdm redraws it in place and prints messages above
it; into a file or pipe it writes whole lines (the same text, with an ASCII bar) only
when the caller asks, so logs stay readable; disabled (``--quiet``, ranks other than 0)
it shows nothing. Time and memory O(1) per update.

Time left is the steps still to do at the mean pace of the steps that did work in this
process (steps a resumed run skipped, or benchmark cases read back from a journal, took
no time and would make it look too short), or the rest of the time budget if sooner.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

__all__ = ["Progress", "ProgressBar", "format_duration"]

#: what is drawn, on a terminal and in logs alike: `` 40%|######          | <text>``
BAR_FORMAT = "{percentage:3.0f}%|{bar:16}| {desc}"


def format_duration(seconds: float) -> str:
    """``3725 -> '1:02:05'``, ``65 -> '1:05'``."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressBar:
    """Progress from ``start`` to ``total`` steps, shown as a bar and a caller's line of text.

    Args:
        total: the last step (exclusive).
        start: steps already done when this process began (a resumed run).
        enabled: False shows nothing (:meth:`message` still prints).
        stream: where to write (default stderr); a terminal gets the redrawn bar.
        time_budget: seconds after which the work stops whatever the step count (None: no
            limit); the ETA is then the sooner of the two ends.
        min_interval: on a terminal, redraw at most this often (seconds) unless forced.
    """

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, stream: TextIO | None = None,
                 time_budget: float | None = None, min_interval: float = 0.1):
        self.total, self.start, self.enabled = total, start, enabled
        self.time_budget, self.min_interval = time_budget, min_interval
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.done = start
        self.ran, self.ran_s = 0, 0.0  # steps that did work, and the seconds they took
        self._drawn = float("-inf")
        self._bar = None
        if enabled and self.tty:
            self._bar = tqdm(total=total, initial=start, file=self.stream, bar_format=BAR_FORMAT,
                             dynamic_ncols=True, leave=True)

    def elapsed(self) -> float:
        """Seconds since this display was made."""
        return time.perf_counter() - self.t0

    def eta(self) -> float | None:
        """Seconds left (None: unknown, no step has done work yet and there is no time budget)."""
        left = max(0, self.total - self.done)
        by_steps = left * self.ran_s / self.ran if self.ran else (None if left else 0.0)
        if self.time_budget is None:
            return by_steps
        rest = max(0.0, self.time_budget - self.elapsed())
        return rest if by_steps is None else min(by_steps, rest)

    def advance(self, seconds: float | None = None) -> None:
        """One step done; ``seconds`` it took (None: it did no work, e.g. a resumed case)."""
        self.done += 1
        if seconds is not None:
            self.ran += 1
            self.ran_s += seconds

    def show(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` beside the bar at :attr:`done`.

        On a terminal the bar is redrawn in place (at most every ``min_interval`` seconds
        unless ``force``); elsewhere one whole line is written per call.
        """
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.n = self.done
            self._bar.set_description_str(text, refresh=False)
            now = time.perf_counter()
            if force or now - self._drawn >= self.min_interval:
                self._bar.refresh()
                self._drawn = now
        else:
            line = tqdm.format_meter(self.done, self.total, self.elapsed(), ascii=True, bar_format=BAR_FORMAT,
                                     prefix=text)
            self.stream.write(line + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """Print ``text`` on its own line above the bar, even when disabled."""
        tqdm.write(text, file=self.stream)
        self.stream.flush()

    def close(self) -> None:
        """Leave the bar as last drawn and end its line (a no-op off a terminal or when closed)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Progress(ProgressBar):
    """Progress of a training run: step, loss, learning rate, speed and time left.

    Args:
        total: the last step (exclusive).
        start: the first step of this process (a resumed run starts mid-way).
        enabled: False makes every call but :meth:`message` a no-op (ranks other than 0, ``--quiet``).
        stream: where to write (default stderr).
        every: on a non-terminal, print one line per ``every`` steps.
        unit: what ``items`` counts in the speed display (``tok``, ``seq``, ``img``).
        time_budget: seconds after which the run stops whatever the step count (None: no
            limit); the ETA is then the sooner of the two ends.
    """

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, stream: TextIO | None = None,
                 every: int = 50, unit: str = "tok", time_budget: float | None = None):
        super().__init__(total, start, enabled=enabled, stream=stream, time_budget=time_budget)
        self.every, self.unit = max(1, every), unit
        self.items = 0

    def line(self, step: int, loss: float, lr: float | None = None) -> str:
        """The text shown after finishing step ``step`` (0-based), which it records as done."""
        elapsed = self.elapsed()
        self.done = step + 1
        self.ran, self.ran_s = self.done - self.start, elapsed  # every step of this process did work
        rate = self.ran / elapsed if elapsed > 0 else 0.0
        eta = self.eta()
        parts = [f"step {step + 1}/{self.total}", f"loss {loss:.4f}"]
        if lr is not None:
            parts.append(f"lr {lr:.2e}")
        parts.append(f"{rate:.2f} it/s")
        if self.items and elapsed > 0:
            parts.append(f"{self.items / elapsed:,.0f} {self.unit}/s")
        parts.append(f"elapsed {format_duration(elapsed)} eta {format_duration(eta or 0.0)}")
        return " | ".join(parts)

    def update(self, step: int, loss: float, lr: float | None = None, items: int = 0) -> None:
        """Record a finished step (``items`` tokens/examples it processed) and redraw; the last step closes the bar."""
        self.items += items
        if not self.enabled:
            return
        last = step + 1 == self.total
        if self.tty or (step + 1) % self.every == 0 or last:
            self.show(self.line(step, loss, lr), force=last)
        if last:
            self.close()
