"""What a benchmark suite is: an object that owns its cases, their measurement, rows, plots and verdicts.

:func:`attnlab.bench.run` knows no suite by name. It asks each selected :class:`Suite`
for its case specs (:meth:`Suite.cases`, given the run's :class:`RunOptions`), runs every
spec in its own process (:meth:`Suite.run_case`, dispatched by ``spec["suite"]``),
lets the suite post-process the records (:meth:`Suite.finish`: derived figures,
pairing), collects its verdicts and extra top-level results, and builds the reports
from each suite's tables, report sections and plots. ``results.json``'s schema is the
common part in :mod:`.schema` plus each suite's fragment (:attr:`Suite.case_properties`
and friends).

Adding a suite is one file: write ``src/attnlab/bench/NAME.py`` with a ``Suite``
subclass and ``register_suite(NameSuite())`` at its bottom. Every module of the
``attnlab.bench`` package is imported when the suites are first listed, so the file
enrolls itself in ``attnlab bench``, the reports, the schema and the conformance grid
(``tests/test_conformance.py`` runs every suite's :meth:`Suite.tiny_options` case).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry

#: fields every case record has, besides the suite's own (see :mod:`.schema`)
BASE_RESULT_KEYS = ("time_s", "times_s", "peak_bytes", "peak_method", "flops", "error", "error_oracle", "note",
                    "wall_s", "isolated")


@dataclass(frozen=True)
class RunOptions:
    """The validated options of one ``attnlab bench`` run that suites build their cases from.

    Attributes:
        profile: ``quick``, ``standard`` or ``full``.
        device, dtype: where and in what precision cases run.
        lengths: the sequence lengths the user asked for (None: each suite's profile default).
        mask_kinds: mask kinds to measure (kernels).
        names: only these backends / mechanisms / contenders (None: all).
        layer_n: N of the layer comparison (None: skip it).
        repeats, budget_s: most timed calls per case, and the seconds after which to stop adding them.
        timeout_s: the per-case limit of the profile (or the user's).
        user_timeout: the limit the user gave (None: a suite may use its own default).
        max_error: relative-error threshold of the approximation verdicts.
        generate_sizes: overrides of the generate suite's sizes (unvalidated).
        task_names, data_dir, threads, activations: options of the tasks and mechanisms suites.
        suite_options: per suite name, options of suites that have no field here.
    """

    profile: str = "quick"
    device: str = "cpu"
    dtype: str = "float32"
    lengths: list[int] | None = None
    mask_kinds: list[str] = field(default_factory=list)
    names: list[str] | None = None
    layer_n: int | None = None
    repeats: int = 3
    budget_s: float = 1.0
    timeout_s: float = 120.0
    user_timeout: float | None = None
    max_error: float = 0.05
    generate_sizes: dict | None = None
    task_names: list[str] | None = None
    data_dir: str | None = None
    threads: int | None = None
    activations: str | None = None
    suite_options: dict[str, dict] = field(default_factory=dict)

    def options_for(self, suite: str) -> dict:
        """The ``suite_options`` entry of ``suite`` (empty when none was given)."""
        return dict(self.suite_options.get(suite) or {})


class Suite:
    """Base class of benchmark suites. Subclasses set :attr:`name` and implement :meth:`cases` and :meth:`run_case`.

    Everything else has a default that does nothing, so a small suite overrides only what it has.
    """

    #: the suite's name in ``attnlab bench NAME`` and in every record's ``suite``
    name: str = ""
    #: one line for ``attnlab bench --help`` and the docs
    summary: str = ""
    #: whether a plain ``attnlab bench`` runs it (suites that train or take long are asked for by name)
    default: bool = True
    #: where it comes in listings, reports and verdicts (lower first)
    order: int = 100
    #: the ``kind`` and ``mode`` values its records use (the schema's enums are the union over suites)
    kinds: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    #: measurement keys copied into the record besides :data:`BASE_RESULT_KEYS`
    result_keys: tuple[str, ...] = ()
    #: keys every record of this suite has, with the value used when the measurement lacks them
    record_defaults: dict[str, Any] = {}
    #: JSON-schema properties of the case keys this suite adds
    case_properties: dict[str, dict] = {}
    #: JSON-schema properties it adds to ``settings``, to each verdict, and to the top level of results
    settings_properties: dict[str, dict] = {}
    verdict_properties: dict[str, dict] = {}
    results_properties: dict[str, dict] = {}
    #: top-level keys of results.json that must be present (it fills them in :meth:`extra_results`)
    results_required: tuple[str, ...] = ()
    #: its verdicts are headline answers (the report's first section) rather than details
    headline: bool = False

    # -- building and running cases -------------------------------------------------------------

    def check(self, opts: RunOptions) -> None:
        """Raise ValueError naming the option when ``opts`` cannot work for this suite."""

    def cases(self, opts: RunOptions) -> list[dict]:
        """The case specs of a run: dicts with ``suite kind name mask N B H D dtype device mode settings skip``.

        ``skip`` (None, or ``{"status", "reason"}``) records a case without running it; a
        spec may carry ``timeout_s`` (its own limit) and ``notes``.
        """
        raise NotImplementedError

    def run_case(self, spec: dict) -> dict:
        """Measure one case in this process; raise :class:`~.measure.Unsupported` with the reason if it can't."""
        raise NotImplementedError

    def known_names(self) -> set[str]:
        """The names ``--only`` may pick in this suite (backends, mechanisms, contenders)."""
        return set()

    def lengths(self, opts: RunOptions, specs: list[dict]) -> list[int]:
        """The lengths recorded in ``settings.lengths`` for this suite (default: the specs' N)."""
        return sorted({s["N"] for s in specs})

    def settings(self, opts: RunOptions) -> dict:
        """Keys this suite adds to results.json's ``settings``."""
        return {}

    def label(self, spec: dict) -> str:
        """What the progress bar shows while ``spec`` runs."""
        return f"{spec['suite']} {spec['name']} {spec['mask']} N={spec['N']} {spec['mode']}"

    # -- after the cases ran ----------------------------------------------------------------------

    def finish(self, records: list[dict]) -> None:
        """Add figures derived across this suite's records (in place; ``records`` holds every suite's)."""

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        """Plain-words verdicts from the records (``settings``: results.json's)."""
        return []

    def extra_results(self, records: list[dict]) -> dict:
        """Top-level results.json keys this suite fills (see :attr:`results_properties`)."""
        return {}

    def decision_rows(self, records: list[dict]) -> list[list[str]]:
        """Rows ``[situation, use, measured gain, runner-up]`` of the "which attention to use" table."""
        return []

    # -- reports ------------------------------------------------------------------------------------

    def summary_lines(self, results: dict) -> list[str]:
        """What ``attnlab bench`` prints for this suite (its tables), or nothing."""
        return []

    def report_blocks(self, results: dict) -> list[tuple]:
        """Its sections of report.md / report.html as blocks (see :func:`attnlab.bench.report.blocks`)."""
        return []

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt: Any) -> list[str]:
        """Write its PNG plots into ``out_dir`` from the ``ok`` ``cases``; returns the file names."""
        return []

    # -- the conformance grid ---------------------------------------------------------------------

    def tiny_options(self) -> dict | None:
        """``run()`` keyword arguments of a run of this suite that takes seconds (None: no tiny run).

        The conformance grid runs it in-process and checks the results against the schema.
        """
        return None

    def own(self, records: list[dict]) -> list[dict]:
        """The records of this suite among ``records``."""
        return [r for r in records if r.get("suite") == self.name]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


_REGISTRY: Registry[Suite] = Registry("suite")
_discovered = False


def register_suite(suite: Suite) -> Suite:
    """Enroll ``suite`` (an instance) under ``suite.name``; returns it.

    Raises:
        ValueError: when ``suite`` is not a :class:`Suite` instance or has no name.
    """
    if not isinstance(suite, Suite):
        raise ValueError(f"register_suite takes a Suite instance, got {suite!r}")
    return _REGISTRY.register(suite)


def _discover() -> None:
    """Import every module of ``attnlab.bench`` once, so each suite file has registered itself."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    from .. import bench

    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{bench.__name__}.{info.name}")


def registry() -> Registry[Suite]:
    """The registry of suites (every suite file of the package imported)."""
    _discover()
    return _REGISTRY


def suites() -> dict[str, Suite]:
    """Every registered suite by name, in report order (:attr:`Suite.order`, then name)."""
    _discover()
    return dict(sorted(_REGISTRY.entries().items(), key=lambda kv: (kv[1].order, kv[0])))


def suite_names() -> tuple[str, ...]:
    """Names of every registered suite, in report order."""
    return tuple(suites())


def default_suite_names() -> tuple[str, ...]:
    """Names of the suites a plain ``attnlab bench`` runs."""
    return tuple(n for n, s in suites().items() if s.default)


def get_suite(name: str) -> Suite:
    """The suite registered as ``name`` (ValueError listing the known ones otherwise)."""
    _discover()
    return _REGISTRY.get(name)


__all__ = ["BASE_RESULT_KEYS", "RunOptions", "Suite", "default_suite_names", "get_suite", "register_suite",
           "registry", "suite_names", "suites"]
