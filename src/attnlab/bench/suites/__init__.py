"""The bench suites, one module each. Importing this package registers every one of them.

A new suite is a module here with a :class:`~attnlab.bench.suite.Suite` subclass decorated
with :func:`~attnlab.bench.suite.register_suite`, added to the import list below. Nothing
outside this package imports a suite module: the runner, the worker, the CLI, the schema
and the reports reach the suites through the registry (:func:`attnlab.bench.suite.suites`).
"""

from . import deploy, distributed, generate, kernels, mechanisms, tasks  # noqa: F401  (each registers its suite)
