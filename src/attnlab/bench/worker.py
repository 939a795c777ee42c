"""What an isolated child runs: dispatch one case spec to its suite.

Imported by the fork server before any case, so children start with torch and
attnlab already loaded.
"""

from __future__ import annotations

from . import generate, kernels, mechanisms, tasks
from .measure import ceilings

_SUITES = {kernels.SUITE: kernels.run_case, mechanisms.SUITE: mechanisms.run_case, generate.SUITE: generate.run_case,
           tasks.SUITE: tasks.run_case}


def run_case(spec: dict) -> dict:
    """Measure the case ``spec`` in this process; raises on failure (see :mod:`.isolate`)."""
    if spec["suite"] == "ceilings":
        return {"ceilings": ceilings(spec["device"], spec["dtypes"], size=spec.get("size", 2048),
                                     copy_mb=spec.get("copy_mb", 256), budget_s=spec.get("budget_s", 1.0))}
    try:
        fn = _SUITES[spec["suite"]]
    except KeyError:
        raise ValueError(f"suite must be one of {sorted(_SUITES)}, got {spec['suite']!r}") from None
    return fn(spec)
