"""``attnlab.bench``: which attention to pick on this machine, measured.

``run(suites, profile, device, dtype, lengths, out_dir, ...)`` measures the machine's
ceilings (matmul GFLOP/s, copy GB/s), then every case of the chosen suites in its own
process (time, peak memory, FLOPs, error against a float64 oracle), and writes
``results.json`` (schema in :mod:`attnlab.bench.schema`), ``report.md``,
``report.html`` and plots. ``compare(a, b)`` gives the ratios between two runs.

Suites are objects (:class:`attnlab.bench.suite.Suite`) in a registry, each in its own
file: ``kernels`` (exact backends x masks x N, plus ``auto`` and the layer comparison),
``mechanisms`` (every registered mechanism x N, with error against exact attention and
the mechanism's own cost estimate), ``generate`` (a small CausalLM generating with and
without the KV cache: tokens/s and the speedup) and ``tasks`` (the arena, asked for by
name); :func:`attnlab.bench.suite.suites` lists every registered one.
"""

from .compare import compare, compare_table, load
from .runner import PROFILES, run
from .schema import validate
from .suite import RunOptions, Suite, register_suite


def __getattr__(name: str):
    """``SUITES``, ``DEFAULT_SUITES`` and ``SCHEMA`` are read from the suite registry when asked."""
    if name in ("SUITES", "DEFAULT_SUITES"):
        from . import runner

        return getattr(runner, name)
    if name == "SCHEMA":
        from .schema import results_schema

        return results_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_SUITES", "PROFILES", "SCHEMA", "SUITES", "RunOptions", "Suite", "compare", "compare_table", "load",
           "register_suite", "run", "validate"]
