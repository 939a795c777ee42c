"""A one-line progress display: step, loss, speed and time left.

On a terminal the line is redrawn in place (``\\r``); into a file or pipe it prints a
full line every ``every`` steps instead, so logs stay readable. Time and memory O(1)
per update.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``3725 -> '1:02:05'``, ``65 -> '1:05'``."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Progress of a run from ``start`` to ``total`` steps.

    Args:
        total: the last step (exclusive).
        start: the first step of this process (a resumed run starts mid-way).
        enabled: False makes every call a no-op (ranks other than 0, ``--quiet``).
        stream: where to write (default stderr).
        every: on a non-terminal, print one line per ``every`` steps.
        unit: what ``items`` counts in the speed display (``tok``, ``seq``, ``img``).
        time_budget: seconds after which the run stops whatever the step count (None: no
            limit); the ETA is then the sooner of the two ends.
    """

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, stream: TextIO | None = None,
                 every: int = 50, unit: str = "tok", time_budget: float | None = None):
        self.total, self.start, self.enabled = total, start, enabled
        self.time_budget = time_budget
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every, self.unit = max(1, every), unit
        self.t0 = time.perf_counter()
        self.items = 0
        self._last_len = 0

    def line(self, step: int, loss: float, lr: float | None = None) -> str:
        """The text shown after finishing step ``step`` (0-based)."""
        done = step + 1 - self.start
        elapsed = time.perf_counter() - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step - 1) / rate if rate > 0 else 0.0
        if self.time_budget is not None:
            eta = min(eta, max(0.0, self.time_budget - elapsed))
        parts = [f"step {step + 1}/{self.total}", f"loss {loss:.4f}"]
        if lr is not None:
            parts.append(f"lr {lr:.2e}")
        parts.append(f"{rate:.2f} it/s")
        if self.items and elapsed > 0:
            parts.append(f"{self.items / elapsed:,.0f} {self.unit}/s")
        parts.append(f"elapsed {format_duration(elapsed)} eta {format_duration(eta)}")
        return " | ".join(parts)

    def update(self, step: int, loss: float, lr: float | None = None, items: int = 0) -> None:
        """Record a finished step (``items`` tokens/examples it processed) and redraw."""
        self.items += items
        if not self.enabled:
            return
        last = step + 1 == self.total
        if self.tty:
            text = self.line(step, loss, lr)
            self.stream.write("\r" + text + " " * max(0, self._last_len - len(text)))
            self._last_len = len(text)
            if last:
                self.stream.write("\n")
            self.stream.flush()
        elif (step + 1) % self.every == 0 or last:
            self.stream.write(self.line(step, loss, lr) + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """Print a message on its own line (clearing a redrawn progress line first), even when disabled."""
        if self.tty and self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
            self._last_len = 0
        self.stream.write(text + "\n")
        self.stream.flush()
