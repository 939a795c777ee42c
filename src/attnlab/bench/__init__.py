"""``attnlab.bench``: which attention to pick on this machine, measured.

``run(suites, profile, device, dtype, lengths, out_dir, ...)`` measures the machine's
ceilings (matmul GFLOP/s, copy GB/s), then every case of the chosen suites in its own
process (time, peak memory, FLOPs, error against a float64 oracle), and writes
``results.json`` (schema in :mod:`attnlab.bench.schema`), ``report.md``,
``report.html`` and plots. ``compare(a, b)`` gives the ratios between two runs.

Suites: ``kernels`` (exact backends x masks x N, plus ``auto`` and the layer
comparison) and ``mechanisms`` (every registered mechanism x N, with error against
exact attention and the mechanism's own cost estimate) and ``generate`` (a small
CausalLM generating with and without the KV cache: tokens/s and the speedup).
"""

from .compare import compare, compare_table, load
from .runner import DEFAULT_SUITES, PROFILES, SUITES, run
from .schema import SCHEMA, validate

__all__ = ["DEFAULT_SUITES", "PROFILES", "SCHEMA", "SUITES", "compare", "compare_table", "load", "run", "validate"]
