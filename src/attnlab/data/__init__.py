"""The public data sets attnlab's tasks read: a catalogue with each file's URL and SHA-256, fetched and verified.

``attnlab data list`` shows them; ``attnlab data fetch NAME`` downloads one into
``~/.cache/attnlab/data`` (or ``$ATTNLAB_DATA``), checking every file against the SHA-256
in :mod:`attnlab.data.catalogue`; ``attnlab data fetch NAME --from DIR`` imports a local
copy the same way. Tasks find their data with :func:`locate`. The Planetoid graphs are
parsed without unpickling and kept as ``.npz`` (:mod:`attnlab.data.planetoid`).

This package imports nothing from attnlab: every layer may use it.
"""

from .catalogue import DATASETS, DataSet, FileSpec, dataset
from .fetch import MissingDataError, data_root, fetch, locate, present, roots, status

__all__ = ["DATASETS", "DataSet", "FileSpec", "MissingDataError", "data_root", "dataset", "fetch", "locate",
           "present", "roots", "status"]
