"""The Planetoid citation graphs (Cora, CiteSeer) in their standard split, read without trusting pickle.

The files are the authors' ``ind.{name}.{x,tx,allx,y,ty,ally,graph,test.index}`` (Yang,
Cohen, Salakhutdinov, ICML 2016), the split GCN and GAT report on. Seven of them are Python 2
pickles; :class:`SafeUnpickler` admits only the globals they hold (NumPy arrays and dtypes,
a scipy.sparse CSR matrix, ``collections.defaultdict`` of ``list``) and refuses anything else
with a ValueError naming the file and the global. The CSR matrix is rebuilt as an inert
record of its arrays (:class:`CSRRecord`), so neither scipy nor its constructors run. When the
folder's ``SOURCE`` file lists a file's SHA-256, the file must match it.

Assembly follows PyTorch Geometric's ``read_planetoid_data`` (and the GCN authors' code):
features ``allx`` then ``tx`` with the test rows put at the ids of ``test.index``; CiteSeer's
test ids span 1,015 positions for 1,000 rows, so the 15 papers without a row get zero features
and no label (``y = -1``, in no split). Edges: every citation in both directions, self-loops
and duplicates dropped, sorted by (target, source). Train = the first labelled nodes (140 Cora,
120 CiteSeer), val = the next 500, test = ``test.index`` (1,000).

Time and memory O(N F + E) (features kept dense: 2,708 x 1,433 for Cora).
Shape legend: ``N`` nodes, ``F`` features, ``E`` directed edges, ``C`` classes.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["CSRRecord", "NAMES", "PlanetoidGraph", "SafeUnpickler", "load_planetoid", "planetoid_dir"]

#: the data sets this loader reads, by their file prefix
NAMES = ("cora", "citeseer")
_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph")


class CSRRecord:
    """What a pickled ``scipy.sparse.csr_matrix`` holds (shape, data, indices, indptr), and nothing it could run."""

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"a csr_matrix's state must be a dict, got {type(state).__name__}")
        self.state = state

    def to_dense(self) -> np.ndarray:
        """The ``(rows, cols)`` float32 array, checked: indices in range, indptr monotone."""
        st = self.state
        shape = tuple(int(s) for s in st.get("_shape", ()))
        data, indices, indptr = (np.asarray(st.get(k)) for k in ("data", "indices", "indptr"))
        if len(shape) != 2 or indptr.shape != (shape[0] + 1,) or indices.shape != data.shape \
                or int(indptr[-1]) != data.shape[0] or np.any(np.diff(indptr) < 0) \
                or (indices.size and (int(indices.min()) < 0 or int(indices.max()) >= shape[1])):
            raise pickle.UnpicklingError(f"malformed csr_matrix (shape {shape}, {data.shape[0]} values)")
        out = np.zeros(shape, dtype=np.float32)
        rows = np.repeat(np.arange(shape[0]), np.diff(indptr))
        out[rows, indices] = data
        return out


def _reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct as rec  # NumPy 2
    except ImportError:  # pragma: no cover - NumPy 1
        from numpy.core.multiarray import _reconstruct as rec
    return rec


#: (module, name) -> what it loads as: exactly the globals the Planetoid pickles reference
_ALLOWED = {
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("scipy.sparse.csr", "csr_matrix"): lambda: CSRRecord,
    ("scipy.sparse._csr", "csr_matrix"): lambda: CSRRecord,
    ("collections", "defaultdict"): lambda: collections.defaultdict,
    ("__builtin__", "list"): lambda: list,
    ("builtins", "list"): lambda: list,
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that loads only the globals of :data:`_ALLOWED` (NumPy arrays, a CSR record, a dict of lists)."""

    def __init__(self, file, *, source: str = "the file"):
        super().__init__(file, encoding="latin1")  # written by Python 2
        self.source = source

    def find_class(self, module: str, name: str):
        make = _ALLOWED.get((module, name))
        if make is None:
            allowed = ", ".join(f"{m}.{n}" for m, n in _ALLOWED)
            raise ValueError(f"{self.source}: refused to unpickle {module}.{name}: a Planetoid file holds only NumPy "
                             f"arrays, a scipy.sparse CSR matrix and a dict of lists (allowed: {allowed}); it may have "
                             f"been tampered with")
        return make()


def _hashes(folder: Path) -> dict[str, str]:
    """``file name -> sha256`` listed in the folder's SOURCE file (``<hex>  <name>`` lines), if any."""
    src = folder / "SOURCE"
    if not src.is_file():
        return {}
    out = {}
    for line in src.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64 and all(c in "0123456789abcdef" for c in parts[0]):
            out[parts[1]] = parts[0]
    return out


def _read(folder: Path, fname: str, hashes: dict[str, str]):
    path = folder / fname
    if not path.is_file():
        raise FileNotFoundError(f"Planetoid file {str(path)!r} is missing (the folder needs ind.NAME.x, tx, allx, y, "
                                f"ty, ally, graph and test.index)")
    raw = path.read_bytes()
    want = hashes.get(fname)
    if want is not None and hashlib.sha256(raw).hexdigest() != want:
        raise ValueError(f"{path}: its SHA-256 differs from the one listed in {folder / 'SOURCE'}; the file was "
                         f"changed, refusing to read it")
    if fname.endswith(".test.index"):
        return np.array([int(t) for t in raw.decode("ascii").split()], dtype=np.int64)
    try:
        return SafeUnpickler(io.BytesIO(raw), source=str(path)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, IndexError) as e:
        raise ValueError(f"{path}: not a readable Planetoid pickle ({type(e).__name__}: {e})") from None


@dataclass
class PlanetoidGraph:
    """One Planetoid data set.

    Attributes:
        name: ``cora`` or ``citeseer``.
        x: ``(N, F)`` float32 bag-of-words features as published (0/1; zeros for papers without a row).
        y: ``(N,)`` int64 class, ``-1`` for papers without a label.
        edge_index: ``(2, E)`` int64, source -> target, both directions of every citation.
        train_mask, val_mask, test_mask: ``(N,)`` bool splits.
        num_classes: ``C``.
    """

    name: str
    x: Tensor
    y: Tensor
    edge_index: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def _dense(obj, what: str) -> np.ndarray:
    if isinstance(obj, CSRRecord):
        return obj.to_dense()
    if isinstance(obj, np.ndarray) and obj.ndim == 2:
        return obj.astype(np.float32)
    raise ValueError(f"{what} must hold a matrix, got {type(obj).__name__}")


def load_planetoid(root: str | Path, name: str) -> PlanetoidGraph:
    """Read ``ind.{name}.*`` from the folder ``root`` (see the module docstring for what is checked and how).

    Raises:
        ValueError: for an unknown ``name``, a file that is missing, changed (SHA-256), holds a
            global other than the allowed ones, or does not fit the others.
    """
    name = str(name).lower()
    if name not in NAMES:
        raise ValueError(f"name must be one of {list(NAMES)}, got {name!r}")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"Planetoid folder {str(folder)!r} does not exist")
    hashes = _hashes(folder)
    parts = {p: _read(folder, f"ind.{name}.{p}", hashes) for p in _PARTS}
    test_index = _read(folder, f"ind.{name}.test.index", hashes)
    tx, allx = _dense(parts["tx"], "tx"), _dense(parts["allx"], "allx")
    ty, ally = np.asarray(parts["ty"]), np.asarray(parts["ally"])
    n_train = int(np.asarray(parts["y"]).shape[0])
    graph = parts["graph"]
    if not isinstance(graph, dict):
        raise ValueError(f"ind.{name}.graph must hold a dict of neighbour lists, got {type(graph).__name__}")
    sorted_test = np.sort(test_index)
    lo, hi = int(sorted_test[0]), int(sorted_test[-1])
    if len(sorted_test) != tx.shape[0] or ty.shape[0] != tx.shape[0]:
        raise ValueError(f"ind.{name}: test.index lists {len(sorted_test)} ids but tx/ty hold {tx.shape[0]}/"
                         f"{ty.shape[0]} rows")
    span = hi - lo + 1  # CiteSeer: 1,015 positions for 1,000 test rows (15 papers have none)
    tx_ext = np.zeros((span, tx.shape[1]), dtype=np.float32)
    ty_ext = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
    tx_ext[sorted_test - lo], ty_ext[sorted_test - lo] = tx, ty
    x = np.concatenate([allx, tx_ext])
    y1 = np.concatenate([ally, ty_ext])
    if x.shape[0] != lo + span:
        raise ValueError(f"ind.{name}: allx holds {allx.shape[0]} rows but the test ids start at {lo}")
    x[test_index] = x[sorted_test]  # the test rows come in sorted order; put each at its id
    y1[test_index] = y1[sorted_test]
    y = np.where(y1.sum(1) > 0, y1.argmax(1), -1)
    n = x.shape[0]
    src = [int(s) for s, nbrs in graph.items() for _ in nbrs]
    dst = [int(t) for nbrs in graph.values() for t in nbrs]
    e = np.array([src + dst, dst + src], dtype=np.int64)  # every citation in both directions
    e = e[:, e[0] != e[1]]
    if e.size and (e.min() < 0 or e.max() >= n):
        raise ValueError(f"ind.{name}.graph holds node ids outside [0, {n})")
    codes = np.unique(e[1] * n + e[0])  # sorted by (target, source), duplicates dropped
    edge_index = torch.from_numpy(np.stack([codes % n, codes // n]))
    masks = {k: torch.zeros(n, dtype=torch.bool) for k in ("train", "val", "test")}
    masks["train"][:n_train] = True
    masks["val"][n_train:n_train + 500] = True
    masks["test"][torch.from_numpy(test_index)] = True
    return PlanetoidGraph(name=name, x=torch.from_numpy(x), y=torch.from_numpy(y), edge_index=edge_index,
                          train_mask=masks["train"], val_mask=masks["val"], test_mask=masks["test"],
                          num_classes=int(ally.shape[1]))


def planetoid_dir(data: str | None) -> Path | None:
    """The Planetoid folder: ``data`` (or its ``planetoid`` subfolder), else ``$ATTNLAB_DATA/planetoid``,
    else ``../shared/data/planetoid`` or ``shared/data/planetoid`` from the working directory or from the
    source checkout's root; None when none exists."""
    if data is not None:
        p = Path(data).expanduser()
        return p / "planetoid" if (p / "planetoid").is_dir() and not any(p.glob("ind.*")) else p
    env = os.environ.get("ATTNLAB_DATA")
    checkout = Path(__file__).resolve().parents[3]  # src/attnlab/tasks/planetoid.py -> the repository
    rel = [Path("../shared/data/planetoid"), Path("shared/data/planetoid")]
    for cand in ([Path(env) / "planetoid"] if env else []) + rel + [checkout / p for p in rel]:
        if cand.is_dir():
            return cand.resolve()
    return None
