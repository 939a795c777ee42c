"""What an isolated child runs: dispatch one case spec to its suite.

Imported by the fork server before any case, so children start with torch, attnlab and
every suite (:func:`attnlab.bench.suites.suites`) already loaded.
"""

from __future__ import annotations

from .measure import ceilings
from .suite import Context
from .suites import registry  # imports every suite now, once, in the fork server


def run_case(spec: dict) -> dict:
    """Measure the case of the runner's ``spec`` (its typed ``case`` and the :class:`~.suite.Context` the rest of
    it gives) in this process; raises on failure (see :mod:`.isolate`)."""
    if spec["suite"] == "ceilings":
        return {"ceilings": ceilings(spec["device"], spec["dtypes"], size=spec.get("size", 2048),
                                     copy_mb=spec.get("copy_mb", 256), budget_s=spec.get("budget_s", 1.0))}
    return registry().get(spec["suite"]).run_case(spec["case"], Context.of(spec))
