"""What a benchmark suite is, its typed cases, and the options of a run.

A suite is one module under ``attnlab/bench/suites/``: a :class:`Suite` subclass decorated
with :func:`register_suite`, listed in ``bench/suites/__init__.py`` (the catalogue:
:func:`attnlab.bench.suites.suites` and the other look-ups that need every suite imported). It owns everything about
its cases: its options (:attr:`Suite.Options`, a frozen dataclass, and the CLI flags that
fill it), its typed case (a :class:`Case` subclass: a frozen dataclass with the suite's named
fields), the measurement of one case (run in its own process), the figures derived across its
records, its verdicts, its rows of the "which attention to use" table, its report sections,
plots and schema fragment. The runner, the worker, the schema and the report name no suite:
they ask the catalogue. This module is the protocol only and imports no suite, so a suite
imports it without a circle.

A case travels from the suite to its record so:

* :meth:`Suite.cases` makes typed :class:`Case` objects, each alone or inside a :class:`Job`
  (its id, needs, skip, priority, limit, and where it runs);
* the runner turns each job into its spec (:meth:`Job.spec`: a dict its executors, the
  journal and the result cache read, holding the case under ``case``) and runs it;
* the worker hands :meth:`Suite.run_case` the typed case and a :class:`Context` (repeats, time
  budget, the records it needed, its folder and files);
* the record starts with what the case says of itself (:meth:`Case.record`: :data:`RECORD_KEYS`),
  the measurement's figures after them.

:class:`RunOptions` holds what every suite shares (profile, device, dtype, lengths, names,
timing, isolation, lanes, where the data and the output are); ``suite_options`` maps a
suite's name to its own options (an instance of its ``Options`` or a dict of its fields),
read with :meth:`RunOptions.of`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..data import MissingDataError, locate
from ..registry import Registry
from ..utils import positive_int, positive_number
from .format import text_table

#: fields every case record has, besides the suite's own (see :mod:`.schema`)
BASE_RESULT_KEYS = ("time_s", "times_s", "peak_bytes", "peak_method", "flops", "error", "error_oracle", "note",
                    "wall_s", "isolated", "node")

#: where the cases of a run may run: this machine, or a Ray cluster (:mod:`attnlab.bench.executor_ray`)
EXECUTORS = ("local", "ray")

#: the profiles a run may ask for
PROFILE_NAMES = ("quick", "standard", "full")


def split_names(value: str | Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    """``"a,b"`` or ``["a", "b"]`` as a tuple of non-empty names (None passes through)."""
    if value is None:
        return None
    items = value.replace(" ", "").split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(x, str) for x in items):
        raise ValueError(f"{what} must be names like a,b, got {value!r}")
    return tuple(x for x in items if x)


def parse_lengths(value: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``"512,1024"`` or ``[512, 1024]`` as a tuple of positive ints (None passes through)."""
    if value is None:
        return None
    items = [x for x in value.replace(" ", "").split(",") if x] if isinstance(value, str) else list(value)
    try:
        out = tuple(int(x) for x in items)
    except (TypeError, ValueError):
        raise ValueError(f"lengths must be positive integers like 512,1024, got {value!r}") from None
    if not out or any(n < 1 for n in out) or any(isinstance(x, (bool, float)) for x in items):
        raise ValueError(f"lengths must be positive integers like 512,1024, got {value!r}")
    return out


#: the fields every case record starts with; a :class:`Case` says them (:meth:`Case.record`) and the journal and
#: the result cache key on them (:func:`attnlab.bench.runner.case_key`)
RECORD_KEYS = ("suite", "kind", "name", "mask", "N", "B", "H", "D", "dtype", "device", "mode", "settings")

#: what a :class:`Case` says besides its dtype, device and settings (:meth:`Case.header`)
HEADER_KEYS = ("kind", "name", "mask", "N", "B", "H", "D", "mode")

#: the fields of :class:`Case` itself (every suite's case has them); the rest are the suite's own
_BASE_CASE_FIELDS = ("dtype", "device")


def _jsonable(value: Any) -> Any:
    """Tuples as lists, all the way down (what JSON gives back)."""
    if isinstance(value, (tuple, list)):
        return [_jsonable(x) for x in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _tuples(value: Any) -> Any:
    """Lists as tuples, all the way down (a tuple field read back from JSON)."""
    return tuple(_tuples(x) for x in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True, kw_only=True)
class Case:
    """Base of every suite's typed case: one frozen dataclass per suite, with the suite's own named fields.

    A case holds everything its child process needs to measure it and nothing about where the run is
    kept or how it is scheduled (that is its :class:`Job`), so the journal and the result cache key on
    what it says. A subclass sets :attr:`suite` and has the record's common fields, :data:`HEADER_KEYS`
    (``N`` queries, ``B`` batch, ``H`` heads, ``D`` head dim), as fields, class constants or properties;
    the record's ``settings`` are its other fields (:meth:`settings`, which it may override).

    Attributes:
        dtype, device: where and in what precision the case runs.
    """

    #: the suite whose :meth:`Suite.run_case` measures it
    suite: ClassVar[str] = ""

    dtype: str = "float32"
    device: str = "cpu"

    def header(self) -> dict[str, Any]:
        """The record's :data:`HEADER_KEYS`, read from the attributes of those names."""
        return {k: getattr(self, k) for k in HEADER_KEYS}

    def settings(self) -> dict[str, Any]:
        """The record's ``settings``: the fields besides dtype, device and the header's, JSON-ready."""
        return {k: v for k, v in self.to_dict().items() if k not in (*_BASE_CASE_FIELDS, *HEADER_KEYS)}

    def record(self) -> dict[str, Any]:
        """The fields a record of this case starts with (:data:`RECORD_KEYS`)."""
        return {"suite": self.suite, **self.header(), "dtype": self.dtype, "device": self.device,
                "settings": self.settings()}

    def label(self) -> str:
        """What the progress display shows while the case runs."""
        h = self.header()
        return f"{self.suite} {h['name']} {h['mask']} N={h['N']} {h['mode']}"

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tuples as lists); :meth:`from_dict` reads it back."""
        return _jsonable({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        """The case :meth:`to_dict` gave (lists back into the tuple fields; ValueError naming unknown keys)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{cls.__name__} fields must be among {sorted(fields)}, got unknown {unknown}")
        return cls(**{k: _tuples(v) if str(fields[k].type).startswith("tuple") else v for k, v in data.items()
                      if fields[k].init})


@dataclass(frozen=True)
class Job:
    """A case as the runner schedules it: its id, what it waits for, and where it runs.

    Attributes:
        case: the suite's typed case.
        id: unique in the run (the ``needs`` of other jobs name it).
        skip: ``{"status", "reason"}``: record the case without running it.
        needs: ids of jobs that must finish first; their records reach :meth:`Suite.run_case` as
            :attr:`Context.needed` (a need that did not end ``ok`` skips this job, with the reason).
        same_as: ``{"id", "result"}``: the case runs the very kernel of job ``id`` (which it also needs):
            its record is that job's measurement with ``result``'s fields, and it is not run again.
        priority: among the jobs of parallel suites that may start, the higher first (the longest).
        timeout_s: its own limit (None: the run's).
        notes: copied into its record.
        out_dir, artifacts, data_files, threads, group: for a run on a cluster, where no folder is shared
            (:mod:`attnlab.bench.executor_ray`): the run's folder (the paths a case reads and writes are
            relative to it), folders under it the case produces (which the jobs needing it read), name ->
            path of files it reads, its CPUs, and jobs to run on one machine (as their ratios compare them).
    """

    case: Case
    id: str | None = None
    skip: Mapping[str, Any] | None = None
    needs: tuple[str, ...] = ()
    same_as: Mapping[str, Any] | None = None
    priority: float = 0.0
    timeout_s: float | None = None
    notes: tuple[str, ...] = ()
    out_dir: str | None = None
    artifacts: tuple[str, ...] = ()
    data_files: Mapping[str, str] | None = None
    threads: int | None = None
    group: str | None = None

    def spec(self) -> dict[str, Any]:
        """The runner's spec of this job: what its executor and journal read, the typed case under ``case``.

        Keys with nothing to say are left out, so the journal's key of a case is what it was before jobs
        were typed (:func:`attnlab.bench.runner.case_key`).
        """
        out: dict[str, Any] = {**self.case.record(), "case": self.case, "skip": dict(self.skip) if self.skip else None}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in ("case", "skip") and value not in (None, (), 0.0):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class Context:
    """What the runner hands :meth:`Suite.run_case` besides the case: the run's timing and the job's place.

    Attributes:
        repeats, budget_s: most timed calls, and the seconds after which to stop adding them.
        needed: the records of the jobs this one needs, by id.
        out_dir, data_files, threads: the job's (see :class:`Job`).
    """

    repeats: int = 3
    budget_s: float = 1.0
    needed: Mapping[str, dict] = field(default_factory=dict)
    out_dir: str | None = None
    data_files: Mapping[str, str] = field(default_factory=dict)
    threads: int | None = None
    timeout_s: float | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Context:
        """The context of a runner's spec (:meth:`Job.spec` and what the runner added)."""
        return cls(repeats=spec.get("repeats") or 3, budget_s=spec.get("budget_s") or 1.0,
                   needed=spec.get("needed") or {}, out_dir=spec.get("out_dir"),
                   data_files=spec.get("data_files") or {}, threads=spec.get("threads"),
                   timeout_s=spec.get("timeout_s"))


def as_job(item: Case | Job) -> Job:
    """``item`` as a :class:`Job` (a bare case is a job with nothing to say about scheduling)."""
    if isinstance(item, Job):
        return item
    if isinstance(item, Case):
        return Job(item)
    raise ValueError(f"a suite's cases must be Case or Job objects, got {type(item).__name__}")


@dataclass(frozen=True)
class RunOptions:
    """The options of one ``attnlab bench`` run that every suite shares (validated when built).

    Attributes:
        profile: ``quick``, ``standard`` or ``full`` (each suite reads its own sizes for it).
        device, dtype: where and in what precision cases run.
        lengths: sequence lengths to run (None: each suite's profile default).
        names: only these backends / mechanisms / contenders (None: all).
        repeats, budget_s: most timed calls per case, and the seconds after which to stop adding them
            (None: the profile's, :data:`attnlab.bench.runner.PROFILE_TIMING`).
        timeout_s: the limit of one case in seconds (None: the profile's; a suite may allow its cases longer).
        data_dir: a folder holding the data sets (None: ``$ATTNLAB_DATA``, then the cache; see
            :func:`attnlab.data.locate`).
        threads: torch threads of each case of a suite that trains (None: the suite's default).
        jobs: parallel lanes for the cases of suites that may run side by side (:attr:`Suite.parallel`).
        out_dir: where ``results.json``, the journal, the reports and the plots go.
        isolate: run every case in its own process.
        executor: ``local`` (this machine) or ``ray`` (each case a task on a Ray cluster; the ``ray`` extra).
        ray_address: the Ray cluster's ``HEAD:PORT`` (executor ``ray`` only; None: ``$RAY_ADDRESS``, else a
            cluster started on this machine, else a new local one).
        resume: reuse the finished cases of ``out_dir/cases.jsonl``.
        fresh: measure every case again, reusing nothing from the result cache (new results are
            still stored there; see :mod:`attnlab.bench.cache`).
        cache_dir: the result cache's folder (None: ``$ATTNLAB_CACHE/bench``, else
            ``~/.cache/attnlab/bench``).
        progress, echo: show progress on stderr; print the summary at the end.
        ceiling_size, copy_mb: sizes of the matmul and the copy that measure the machine's ceilings.
        suite_options: per suite name, its own options (an instance of its :attr:`Suite.Options` or a
            dict of that dataclass's fields).
    """

    profile: str = "quick"
    device: str = "cpu"
    dtype: str = "float32"
    lengths: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None
    repeats: int | None = None
    budget_s: float | None = None
    timeout_s: float | None = None
    data_dir: str | None = None
    threads: int | None = None
    jobs: int = 1
    out_dir: str = "bench-out"
    isolate: bool = True
    executor: str = "local"
    ray_address: str | None = None
    resume: bool = False
    fresh: bool = False
    cache_dir: str | None = None
    progress: bool = True
    echo: bool = True
    ceiling_size: int = 2048
    copy_mb: int = 256
    suite_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.profile not in PROFILE_NAMES:
            raise ValueError(f"profile must be one of {list(PROFILE_NAMES)}, got {self.profile!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if not (self.device == "cpu" or (isinstance(self.device, str) and self.device.startswith("cuda"))):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        object.__setattr__(self, "lengths", parse_lengths(self.lengths))
        object.__setattr__(self, "names", split_names(self.names, "names"))
        positive_int(self.repeats, "repeats", allow_none=True)
        positive_number(self.budget_s, "budget_s", allow_none=True)
        positive_number(self.timeout_s, "timeout_s", allow_none=True)
        positive_int(self.threads, "threads", allow_none=True)
        positive_int(self.jobs, "jobs")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {self.executor!r}")
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address.strip()):
            raise ValueError(f"ray_address must be a HEAD:PORT string or None, got {self.ray_address!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError(f"ray_address is read only with executor='ray', got executor={self.executor!r}")
        positive_int(self.ceiling_size, "ceiling_size")
        positive_int(self.copy_mb, "copy_mb")
        if not isinstance(self.suite_options, Mapping):
            raise ValueError(f"suite_options must map suite names to options, got {type(self.suite_options).__name__}")
        object.__setattr__(self, "suite_options", dict(self.suite_options))

    def with_(self, **changes: Any) -> RunOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def of(self, suite: Suite) -> Any:
        """``suite``'s own options: its :attr:`Suite.Options` built from ``suite_options[suite.name]``.

        Raises:
            ValueError: naming the suite and the unknown or invalid field.
        """
        given = self.suite_options.get(suite.name)
        cls = suite.Options
        if isinstance(given, cls):
            return given
        if given is None:
            return cls()
        if not isinstance(given, Mapping):
            raise ValueError(f"suite_options[{suite.name!r}] must be a {cls.__name__} or a dict of its fields, "
                             f"got {type(given).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"options of suite {suite.name!r} must be among {sorted(known)}, got {unknown}")
        return cls(**given)

    def find_data(self, name: str) -> Path | None:
        """The folder of data set ``name`` (:func:`attnlab.data.locate` under :attr:`data_dir`, else the
        usual places); None when it is not fetched (:meth:`missing_data` says how to get it)."""
        try:
            return locate(name, self.data_dir)
        except MissingDataError:
            return None

    def missing_data(self, name: str) -> str:
        """Why data set ``name`` is not found, and the command that fetches it."""
        try:
            locate(name, self.data_dir)
        except MissingDataError as e:
            return str(e)
        return f"data set {name!r} is here"


@dataclass(frozen=True)
class NoOptions:
    """The options of a suite that has none of its own."""


class Suite:
    """Base class of benchmark suites.

    What a new suite must say: its :attr:`name`, its cases (:meth:`cases`: typed :class:`Case` objects,
    or :class:`Job` objects where the runner must know more), how to measure one (:meth:`run_case`),
    its rows (:meth:`rows`: the table its summary and its report section show) and its plots
    (:meth:`plots`). Everything else is an optional hook with a default that does nothing, so a small
    suite overrides only what it has.
    """

    #: the suite's name in ``attnlab bench NAME`` and in every record's ``suite``
    name: ClassVar[str] = ""
    #: one line for ``attnlab bench --help`` and the docs
    summary: ClassVar[str] = ""
    #: the title of its part of the report and of its table in the terminal summary (default: its name)
    title: ClassVar[str] = ""
    #: whether a plain ``attnlab bench`` runs it (suites that take long are asked for by name)
    default: ClassVar[bool] = True
    #: where it comes in listings, reports and verdicts (lower first)
    order: ClassVar[int] = 100
    #: its cases may run side by side in ``--jobs`` lanes (they train models; they do not time kernels)
    parallel: ClassVar[bool] = False
    #: its finished cases are kept in the result cache and reused by later runs of the same code on the same CPU
    #: (cases that take minutes to train; see :mod:`attnlab.bench.cache`)
    cached: ClassVar[bool] = False
    #: its own options: a frozen dataclass whose defaults make a plain run (see :meth:`RunOptions.of`)
    Options: ClassVar[type] = NoOptions
    #: the sequence lengths of each profile, for suites whose cases run at the lengths of ``--lengths``
    #: (read by :meth:`run_lengths`; empty: the suite sizes its cases itself)
    profile_lengths: ClassVar[dict[str, list[int]]] = {}
    #: the ``kind`` and ``mode`` values its records use (the schema's enums are the union over suites)
    kinds: ClassVar[tuple[str, ...]] = ()
    modes: ClassVar[tuple[str, ...]] = ()
    #: measurement keys copied into the record besides :data:`BASE_RESULT_KEYS`
    result_keys: ClassVar[tuple[str, ...]] = ()
    #: keys every record of this suite has, with the value used when the measurement lacks them
    record_defaults: ClassVar[dict[str, Any]] = {}
    #: JSON-schema properties of the case keys this suite adds
    case_properties: ClassVar[dict[str, dict]] = {}
    #: JSON-schema properties it adds to ``settings``, to each verdict, and to the top level of results
    settings_properties: ClassVar[dict[str, dict]] = {}
    verdict_properties: ClassVar[dict[str, dict]] = {}
    results_properties: ClassVar[dict[str, dict]] = {}
    #: top-level keys of results.json that must be present (it fills them in :meth:`extra_results`)
    results_required: ClassVar[tuple[str, ...]] = ()
    #: its verdicts are headline answers (the report's first section) rather than details
    headline: ClassVar[bool] = False

    # -- what every suite says ----------------------------------------------------------------------

    def cases(self, opts: RunOptions) -> list[Case | Job]:
        """The cases of a run: its typed :class:`Case` objects, each alone or in a :class:`Job` (an id,
        what it needs, a skip decided here, its priority, limit and place)."""
        raise NotImplementedError

    def run_case(self, case: Case, ctx: Context) -> dict:
        """Measure ``case`` in this process; raise :class:`~.measure.Unsupported` with the reason if it can't."""
        raise NotImplementedError

    def rows(self, records: list[dict], width: int | None = None) -> tuple[list[str], list[list[str]]] | None:
        """Header and rows of its table from its ``records``, cells clipped to ``width`` (None: no table)."""
        return None

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt: Any) -> list[str]:
        """Write its PNG plots into ``out_dir`` from its ``ok`` ``cases``; returns the file names."""
        return []

    # -- the command line ----------------------------------------------------------------------------

    def add_arguments(self, group) -> None:
        """Add this suite's flags to an ``argparse`` argument group (none by default)."""

    def options_from_args(self, args) -> dict[str, Any]:
        """This suite's :attr:`Options` fields from parsed arguments (only those the user gave)."""
        return {}

    # -- building cases -------------------------------------------------------------------------------

    def check(self, opts: RunOptions) -> None:
        """Raise ValueError naming the option when ``opts`` cannot work for this suite."""
        opts.of(self)

    def known_names(self) -> set[str]:
        """The names ``--only`` may pick in this suite (backends, mechanisms, contenders)."""
        return set()

    def run_lengths(self, opts: RunOptions) -> list[int]:
        """The lengths its cases run at: ``--lengths``, else :attr:`profile_lengths` of the profile."""
        return list(opts.lengths or self.profile_lengths[opts.profile])

    def lengths(self, opts: RunOptions, cases: list[Case]) -> list[int]:
        """The lengths recorded in ``settings.lengths``: :meth:`run_lengths` where the suite has
        :attr:`profile_lengths`, else its cases' ``N``."""
        if self.profile_lengths:
            return self.run_lengths(opts)
        return sorted({c.header()["N"] for c in cases})

    def settings(self, opts: RunOptions) -> dict:
        """Keys this suite adds to results.json's ``settings``."""
        return {}

    # -- after the cases ran ----------------------------------------------------------------------

    def finish(self, records: list[dict]) -> None:
        """Add figures derived across this suite's own ``records`` (in place)."""

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        """Plain-words verdicts from this suite's records (``settings``: results.json's)."""
        return []

    def extra_results(self, records: list[dict]) -> dict:
        """Top-level results.json keys this suite fills (see :attr:`results_properties`)."""
        return {}

    def decision_rows(self, records: list[dict]) -> list[list[str]]:
        """Rows ``[situation, use, measured gain, compared with]`` of the "which attention to use" table."""
        return []

    def headline_tables(self, results: dict) -> list[tuple[str, list[str], list[list[str]]]]:
        """Tables ``(caption, header, rows)`` the report shows right under the decision table (default none)."""
        return []

    # -- reports ------------------------------------------------------------------------------------

    def about(self, records: list[dict]) -> str:
        """The paragraph above its table in the report: what was measured and how (default none)."""
        return ""

    def summary_lines(self, results: dict) -> list[str]:
        """What ``attnlab bench`` prints for this suite (default: its :meth:`rows` under its title)."""
        mine = self.own(results["cases"])
        table = self.rows(mine, width=60) if mine else None
        return ["", f"{self.title or self.name}:", text_table(*table)] if table else []

    def report_sections(self, results: dict) -> list[tuple]:
        """Its sections of report.md / report.html (see :func:`attnlab.bench.report.sections`); a first
        ``("h2", title)`` titles its collapsible part (default: its title, :meth:`about` and :meth:`rows`)."""
        mine = self.own(results["cases"])
        table = self.rows(mine) if mine else None
        if not table:
            return []
        about = self.about(mine)
        return [("h2", self.title or self.name), *([("p", about)] if about else []), ("table", *table)]

    def key_plots(self, files: list[str]) -> list[str]:
        """Which of its plot ``files`` the report shows first, before any table (default none)."""
        return []

    # -- the conformance grid ---------------------------------------------------------------------

    def tiny_options(self) -> dict | None:
        """:class:`RunOptions` fields of a run of this suite that takes seconds (None: no tiny run).

        The conformance grid runs it in-process and checks the results against the schema.
        """
        return None

    def own(self, records: list[dict]) -> list[dict]:
        """The records of this suite among ``records``."""
        return [r for r in records if r.get("suite") == self.name]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


#: every registered suite (the catalogue, :mod:`attnlab.bench.suites`, imports them all)
REGISTRY: Registry[Suite] = Registry("suite", base=Suite, instance=True)

#: class decorator: enroll one instance of a :class:`Suite` subclass under ``cls.name``
#: (:meth:`attnlab.registry.Registry.register`)
register_suite = REGISTRY.register


__all__ = ["BASE_RESULT_KEYS", "EXECUTORS", "PROFILE_NAMES", "RECORD_KEYS", "REGISTRY", "Case", "Context", "Job",
           "NoOptions", "RunOptions", "Suite", "as_job", "parse_lengths", "register_suite", "split_names"]
