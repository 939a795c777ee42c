"""The bench suites, one module each, and their catalogue: importing this package registers every one.

A new suite is a module here with a :class:`~attnlab.bench.suite.Suite` subclass decorated
with :func:`~attnlab.bench.suite.register_suite`, added to the import list below. Nothing
outside this package imports a suite module: the runner, the worker, the CLI and the reports
reach the suites through the catalogue below (:func:`suites`, :func:`get_suite`, ...), and
the schema of ``results.json`` is the common part plus every registered suite's fragment
(:func:`results_schema`).

This package sits on its own floor of ``attnlab.bench`` (the bench contract in
``pyproject.toml``): the suites import the protocol (:mod:`attnlab.bench.suite`), their
cells and phrases (:mod:`attnlab.bench.format`) and their measurements
(:mod:`attnlab.bench.measure`) from the floors below, never the runner or the report above.
"""

from __future__ import annotations

from ...registry import Registry
from ..schema import build_schema
from ..schema import validate as _validate
from ..suite import REGISTRY, Suite
from . import deploy, distributed, generate, kernels, mechanisms, tasks  # noqa: F401  (each registers its suite)


def registry() -> Registry[Suite]:
    """The registry of suites, every suite of this package in it."""
    return REGISTRY


def suites() -> dict[str, Suite]:
    """Every registered suite by name, in report order (:attr:`Suite.order`, then name)."""
    return dict(sorted(REGISTRY.entries().items(), key=lambda kv: (kv[1].order, kv[0])))


def suite_names() -> tuple[str, ...]:
    """Names of every registered suite, in report order."""
    return tuple(suites())


def default_suite_names() -> tuple[str, ...]:
    """Names of the suites a plain ``attnlab bench`` runs."""
    return tuple(n for n, s in suites().items() if s.default)


def get_suite(name: str) -> Suite:
    """The suite registered as ``name`` (ValueError listing the known ones otherwise)."""
    return REGISTRY.get(name)


#: the schema of the suites registered when it was built, and their (name, id) pairs
_schema: dict[str, object] = {}


def results_schema() -> dict:
    """The schema of ``results.json``: the common part plus every registered suite's fragment
    (:func:`attnlab.bench.schema.build_schema`), built again only when the suites change."""
    regs = suites()
    key = tuple((n, id(s)) for n, s in regs.items())
    if _schema.get("key") != key:
        _schema.update(key=key, schema=build_schema(regs))
    return _schema["schema"]  # type: ignore[return-value]


def validate(instance, schema: dict | None = None, path: str = "$") -> list[str]:
    """Every way ``instance`` violates ``schema`` (default: :func:`results_schema`), as ``"path: problem"``
    lines (:func:`attnlab.bench.schema.validate`); empty when it is valid."""
    return _validate(instance, results_schema() if schema is None else schema, path)


def __getattr__(name: str):
    """``SCHEMA`` and ``CASE`` (a case record's schema) are :func:`results_schema`'s, built on use."""
    if name == "SCHEMA":
        return results_schema()
    if name == "CASE":
        return results_schema()["properties"]["cases"]["items"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# CASE and SCHEMA come from the module __getattr__ above
__all__ = ["CASE", "SCHEMA", "default_suite_names", "get_suite", "registry", "results_schema",
           "suite_names", "suites", "validate"]
