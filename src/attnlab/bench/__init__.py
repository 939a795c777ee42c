"""``attnlab.bench``: which attention to pick on this machine, measured.

``run(suites, options)`` measures the machine's ceilings (matmul GFLOP/s, copy GB/s), then
every case of the chosen suites in its own process, and writes ``results.json`` (schema in
:mod:`attnlab.bench.schema`), ``report.md``, ``report.html`` and plots. ``compare(a, b)``
gives the ratios between two runs.

Suites are objects (:class:`attnlab.bench.suite.Suite`), one module each under
:mod:`attnlab.bench.suites`: ``kernels`` (exact backends x masks x N, plus ``auto`` and the
layer comparison), ``mechanisms`` (every registered mechanism x N, with error against exact
attention and its own cost estimate), ``generate`` (a CausalLM generating with and without
the KV cache), ``tasks`` (the arena: every mechanism trained on the same tasks, and swapped
into a trained model), ``deploy`` and ``distributed``. :func:`attnlab.bench.suites.suites`
lists every registered one.
"""

from .compare import compare, compare_table, load
from .runner import PROFILE_TIMING, run
from .suite import RunOptions, Suite, register_suite
from .suites import default_suite_names, suite_names, suites, validate

__all__ = ["PROFILE_TIMING", "RunOptions", "Suite", "compare", "compare_table", "default_suite_names", "load",
           "register_suite", "run", "suite_names", "suites", "validate"]
