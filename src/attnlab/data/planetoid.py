"""The Planetoid citation graphs (Cora, CiteSeer): the published pickles parsed as data, converted once into ``.npz``.

The authors' files (Yang, Cohen, Salakhutdinov, ICML 2016) are ``ind.{name}.{x,tx,allx,y,ty,
ally,graph,test.index}``; seven are Python 2 pickles. Nothing here unpickles them. Their
opcodes are walked with :func:`pickletools.genops` by a small stack machine,
:func:`parse_pickle`, that knows the handful of opcodes and globals these files use and
builds only inert records: :class:`ArrayRecord` (a shape, a dtype name from a short list
of plain numeric ones, the raw bytes), :class:`CSRRecord` (a scipy CSR matrix's arrays),
plain dicts, lists, tuples, ints and strings. Any other opcode or global, an object or
structured dtype, or a size past the caps (:data:`MAX_NODES`, :data:`MAX_EDGES`,
:data:`MAX_CELLS`) is a ValueError raised before anything that size is allocated.

The files are only parsed after :mod:`attnlab.data.fetch` checked each one's SHA-256 against
the catalogue (the parser is the second wall, not the first). :func:`convert` assembles the
graph as PyTorch Geometric's ``read_planetoid_data`` and the GCN authors' code do, and
writes one ``.npz``; :func:`load_planetoid` reads that file with ``allow_pickle=False``.

Assembly: features ``allx`` then ``tx`` with the test rows put at the ids of ``test.index``;
CiteSeer's test ids span 1,015 positions for 1,000 rows, so its 15 papers without a row get
zero features and no label (``y = -1``, in no split). Edges: every citation in both
directions, self-loops and duplicates dropped, sorted by (target, source). Train = the first
labelled nodes (140 Cora, 120 CiteSeer), val = the next 500, test = ``test.index`` (1,000).

Time and memory O(N F + E) (features dense once loaded: 2,708 x 1,433 for Cora).
Shape legend: ``N`` nodes, ``F`` features, ``E`` directed edges, ``C`` classes.
"""

from __future__ import annotations

import os
import pickletools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["MAX_CELLS", "MAX_EDGES", "MAX_NODES", "NAMES", "PARTS", "ArrayRecord", "CSRRecord", "PlanetoidGraph",
           "assemble", "convert", "load_planetoid", "parse_pickle", "parse_test_index"]

#: the data sets this module reads, by their file prefix
NAMES = ("cora", "citeseer")
#: the published files of one data set: ``ind.{name}.{part}``
PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
#: caps, checked before any allocation of that size: nodes (rows), directed edges, dense cells (rows x columns)
MAX_NODES = 1 << 20
MAX_EDGES = 1 << 22
MAX_CELLS = 1 << 25
#: dtypes an array may have: plain little-endian numbers (never objects, records or sub-arrays)
_DTYPES = {"f4", "f8", "i4", "i8", "u1", "i1", "b1"}
#: what a global may name: (module, name) -> the inert token that stands for it
_GLOBALS = {
    ("numpy", "ndarray"): "ndarray", ("numpy", "dtype"): "dtype",
    ("numpy.core.multiarray", "_reconstruct"): "reconstruct", ("numpy._core.multiarray", "_reconstruct"): "reconstruct",
    ("scipy.sparse.csr", "csr_matrix"): "csr", ("scipy.sparse._csr", "csr_matrix"): "csr",
    ("collections", "defaultdict"): "defaultdict", ("__builtin__", "list"): "list", ("builtins", "list"): "list",
}
_VALUES = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_PUSH_ARG = {"BININT", "BININT1", "BININT2", "INT", "LONG1", "SHORT_BINSTRING", "BINSTRING", "BINUNICODE",
             "SHORT_BINUNICODE", "BINBYTES", "SHORT_BINBYTES"}


@dataclass
class _Token:
    """A global the parser admitted, by what it stands for (``ndarray``, ``dtype``, ``csr``, ...)."""

    kind: str


@dataclass
class _DType:
    """A dtype by name; only :data:`_DTYPES`, little-endian or byte-order free."""

    name: str
    order: str = "<"

    def numpy(self) -> np.dtype:
        return np.dtype(self.name).newbyteorder("<")


@dataclass
class ArrayRecord:
    """What a pickled NumPy array holds: its shape, dtype name and bytes (built on demand, bounded by the file)."""

    shape: tuple[int, ...] = ()
    dtype: _DType | None = None
    fortran: bool = False
    raw: bytes = b""
    built: bool = False

    def array(self, what: str) -> np.ndarray:
        """The array, a view of the bytes (its size is the file's, never more)."""
        if not self.built or self.dtype is None:
            raise ValueError(f"{what}: an array record that was never filled")
        return np.frombuffer(self.raw, dtype=self.dtype.numpy()).reshape(self.shape, order="F" if self.fortran else "C")


@dataclass
class CSRRecord:
    """What a pickled ``scipy.sparse.csr_matrix`` holds, as a dict of its fields (shape, data, indices, indptr)."""

    state: dict | None = None

    def parts(self, what: str, max_rows: int = MAX_NODES) -> tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray]:
        """``(shape, data, indices, indptr)`` checked: indptr monotone from 0, indices in range, sizes consistent."""
        st = self.state if isinstance(self.state, dict) else {}
        shape = st.get("_shape")
        if not (isinstance(shape, tuple) and len(shape) == 2 and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise ValueError(f"{what}: a CSR matrix needs a (rows, cols) shape of ints, got {shape!r}")
        if shape[0] > max_rows or shape[1] > MAX_NODES:
            raise ValueError(f"{what}: a CSR matrix of shape {shape} exceeds the cap ({max_rows} rows, {MAX_NODES} cols)")
        arrays = []
        for key in ("data", "indices", "indptr"):
            rec = st.get(key)
            if not isinstance(rec, ArrayRecord):
                raise ValueError(f"{what}: a CSR matrix's {key} must be an array, got {type(rec).__name__}")
            arrays.append(rec.array(f"{what} ({key})"))
        data, indices, indptr = arrays
        if indices.dtype.kind not in "iu" or indptr.dtype.kind not in "iu" or data.ndim != 1 or indices.ndim != 1:
            raise ValueError(f"{what}: a CSR matrix needs integer indices and 1-d arrays")
        if indptr.shape != (shape[0] + 1,) or indices.shape != data.shape or int(indptr[0]) != 0 \
                or int(indptr[-1]) != data.shape[0] or bool(np.any(np.diff(indptr) < 0)) \
                or (indices.size and (int(indices.min()) < 0 or int(indices.max()) >= shape[1])):
            raise ValueError(f"{what}: a malformed CSR matrix (shape {shape}, {data.shape[0]} values)")
        return shape, data, indices.astype(np.int64), indptr.astype(np.int64)


class _Graph(dict):
    """A ``defaultdict(list)`` as a plain dict of int -> list of ints, its total length counted as it grows."""

    edges = 0


def _fail(source: str, msg: str) -> ValueError:
    return ValueError(f"{source}: {msg}; not a published Planetoid file (refusing it)")


def _reduce(fn, args, source: str):
    if not isinstance(fn, _Token) or not isinstance(args, tuple):
        raise _fail(source, f"a call of {fn!r} is not one a Planetoid file makes")
    if fn.kind == "reconstruct":  # numpy's _reconstruct(ndarray, (0,), b'b'): an empty array, filled by BUILD
        if len(args) != 3 or not (isinstance(args[0], _Token) and args[0].kind == "ndarray"):
            raise _fail(source, "numpy _reconstruct called with other arguments than (ndarray, (0,), 'b')")
        return ArrayRecord()
    if fn.kind == "dtype":  # dtype('f8', 0, 1)
        if len(args) != 3 or not isinstance(args[0], str) or args[0] not in _DTYPES:
            raise _fail(source, f"dtype {args[0] if args else None!r} is not one of {sorted(_DTYPES)}")
        return _DType(args[0])
    if fn.kind == "defaultdict":
        if args != (_Token("list"),):
            raise _fail(source, "a defaultdict of anything but list")
        return _Graph()
    raise _fail(source, f"{fn.kind} cannot be called")


def _build(obj, state, source: str) -> None:
    if isinstance(obj, _DType):  # (3, '<', None, None, None, -1, -1, 0): no sub-array, fields or names
        ok = isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[1] in ("<", "|") \
            and state[2:5] == (None, None, None) and state[5:7] == (-1, -1) and state[7] == 0
        if not ok:
            raise _fail(source, f"dtype {obj.name} with a state of fields or flags ({state!r:.80})")
        obj.order = state[1]
    elif isinstance(obj, ArrayRecord) and not obj.built:  # (1, shape, dtype, fortran, raw)
        if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], tuple)
                and isinstance(state[2], _DType) and isinstance(state[3], bool) and isinstance(state[4], (bytes, str))):
            raise _fail(source, "an array whose state is not (version, shape, dtype, fortran, bytes)")
        shape = state[1]
        if not all(isinstance(s, int) and 0 <= s <= MAX_CELLS for s in shape) or len(shape) > 2:
            raise _fail(source, f"an array of shape {shape!r:.80}")
        count = int(np.prod(shape, dtype=np.float64)) if shape else 1
        raw = state[4].encode("latin-1") if isinstance(state[4], str) else state[4]
        if count > MAX_CELLS or count * state[2].numpy().itemsize != len(raw):
            raise _fail(source, f"an array of shape {shape} ({count} values) with {len(raw)} bytes of data")
        obj.shape, obj.dtype, obj.fortran, obj.raw, obj.built = shape, state[2], state[3], raw, True
    elif isinstance(obj, CSRRecord) and obj.state is None and isinstance(state, dict):
        obj.state = state
    else:
        raise _fail(source, f"a state set on {type(obj).__name__}")


def _set_items(target, pairs: list, source: str) -> None:
    if not isinstance(target, dict) or len(pairs) % 2:
        raise _fail(source, "items set on something other than a dict")
    for key, value in zip(pairs[::2], pairs[1::2]):
        if isinstance(target, _Graph):
            if not (isinstance(key, int) and 0 <= key < MAX_NODES and isinstance(value, list)):
                raise _fail(source, "a graph entry that is not node id -> list of node ids")
            target.edges += len(value)
            if target.edges > MAX_EDGES:
                raise _fail(source, f"a graph of more than {MAX_EDGES} edges")
        elif not isinstance(key, str):
            raise _fail(source, f"a dict key of type {type(key).__name__}")
        target[key] = value


def _append(target, items: list, source: str) -> None:
    if not isinstance(target, list) or not all(isinstance(i, int) and 0 <= i < MAX_NODES for i in items):
        raise _fail(source, "a list of anything but node ids")
    if len(target) + len(items) > MAX_EDGES:
        raise _fail(source, f"a list of more than {MAX_EDGES} node ids")
    target.extend(items)


def _pop_mark(stack: list, marks: list, source: str) -> list:
    if not marks:
        raise _fail(source, "an opcode that needs a mark without one")
    at = marks.pop()
    items = stack[at:]
    del stack[at:]
    return items


def _step(name: str, arg, stack: list, marks: list, memo: dict, source: str) -> None:
    if name in _PUSH_ARG:
        stack.append(arg)
    elif name in _VALUES:
        stack.append(_VALUES[name])
    elif name == "GLOBAL":
        module, _, attr = str(arg).partition(" ")
        token = _GLOBALS.get((module, attr))
        if token is None:
            raise _fail(source, f"refused the global {module}.{attr} (a Planetoid file names only NumPy arrays and "
                                f"dtypes, a scipy.sparse CSR matrix and a dict of lists)")
        stack.append(_Token(token))
    elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
        memo[arg] = stack[-1]
    elif name in ("BINGET", "LONG_BINGET", "GET"):
        if arg not in memo:
            raise _fail(source, f"a memo reference {arg} to nothing")
        stack.append(memo[arg])
    elif name == "MARK":
        marks.append(len(stack))
    elif name == "TUPLE":
        stack.append(tuple(_pop_mark(stack, marks, source)))
    elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(name[-1])
        items = tuple(stack[-n:])
        del stack[-n:]
        stack.append(items)
    elif name == "EMPTY_LIST":
        stack.append([])
    elif name == "EMPTY_DICT":
        stack.append({})
    elif name == "APPEND":
        value = stack.pop()
        _append(stack[-1], [value], source)
    elif name == "APPENDS":
        items = _pop_mark(stack, marks, source)
        _append(stack[-1], items, source)
    elif name == "SETITEM":
        value, key = stack.pop(), stack.pop()
        _set_items(stack[-1], [key, value], source)
    elif name == "SETITEMS":
        items = _pop_mark(stack, marks, source)
        _set_items(stack[-1], items, source)
    elif name == "NEWOBJ":
        args, cls = stack.pop(), stack.pop()
        if not (isinstance(cls, _Token) and cls.kind == "csr" and args == ()):
            raise _fail(source, f"a new object of {cls!r}")
        stack.append(CSRRecord())
    elif name == "REDUCE":
        args, fn = stack.pop(), stack.pop()
        stack.append(_reduce(fn, args, source))
    elif name == "BUILD":
        state = stack.pop()
        _build(stack[-1], state, source)
    else:
        raise _fail(source, f"the pickle opcode {name} is not one a Planetoid file uses")


def parse_pickle(raw: bytes, source: str = "the file"):
    """The value a Planetoid pickle describes, built from inert records only (see the module docstring).

    Args:
        raw: the file's bytes.
        source: the file's name, for messages.

    Returns:
        an :class:`ArrayRecord`, a :class:`CSRRecord` or a dict of int -> list of ints.

    Raises:
        ValueError: for any opcode, global, dtype or size a Planetoid file does not have,
            naming ``source``; raised before anything past the caps is allocated.
    """
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    try:
        for op, arg, _pos in pickletools.genops(raw):
            if op.name == "STOP":
                if len(stack) != 1 or marks:
                    raise _fail(source, "a pickle that does not end with one value")
                return stack[0]
            if op.name in ("PROTO", "FRAME"):
                continue
            _step(op.name, arg, stack, marks, memo, source)
    except IndexError:
        raise _fail(source, "an opcode with too few values on the stack") from None
    except ValueError as e:
        if "not a published Planetoid file" in str(e):
            raise
        raise _fail(source, f"not a readable pickle ({e})") from None
    raise _fail(source, "a pickle without its end (STOP)")


def parse_test_index(raw: bytes, source: str = "the file") -> np.ndarray:
    """The test node ids of ``ind.NAME.test.index`` (one decimal id a line), each in ``[0, MAX_NODES)``."""
    words = raw.split()
    if len(words) > MAX_NODES:
        raise _fail(source, f"more than {MAX_NODES} test ids")
    try:
        ids = np.array([int(w) for w in words], dtype=np.int64)
    except ValueError:
        raise _fail(source, "a test id that is not a decimal integer") from None
    if ids.size == 0 or int(ids.min()) < 0 or int(ids.max()) >= MAX_NODES:
        raise _fail(source, f"test ids outside [0, {MAX_NODES}) or none at all")
    return ids


def _dense_labels(obj, what: str) -> np.ndarray:
    if not isinstance(obj, ArrayRecord):
        raise ValueError(f"{what}: the labels must be an array, got {type(obj).__name__}")
    y = obj.array(what)
    if y.ndim != 2 or y.dtype.kind not in "iufb" or y.shape[0] > MAX_NODES or y.shape[1] > 1024:
        raise ValueError(f"{what}: labels must be a (rows, classes) one-hot array, got {y.dtype} {y.shape}")
    return y


def _features(obj, what: str) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    """``(shape, (2, nnz) row/column coordinates, nnz values)`` of a feature matrix."""
    if not isinstance(obj, CSRRecord):
        raise ValueError(f"{what}: the features must be a CSR matrix, got {type(obj).__name__}")
    shape, data, indices, indptr = obj.parts(what)
    rows = np.repeat(np.arange(shape[0], dtype=np.int64), np.diff(indptr))
    return shape, np.stack([rows, indices]), data.astype(np.float32)


def _edges(graph, n: int, what: str) -> np.ndarray:
    if not isinstance(graph, dict):
        raise ValueError(f"{what}: the graph must be a dict of neighbour lists, got {type(graph).__name__}")
    total = sum(len(v) for v in graph.values())  # again: lists may have grown after they were set
    if total > MAX_EDGES:
        raise ValueError(f"{what}: a graph of {total} edges exceeds the cap of {MAX_EDGES}")
    src = np.fromiter((s for s, nbrs in graph.items() for _ in nbrs), dtype=np.int64, count=total)
    dst = np.fromiter((t for nbrs in graph.values() for t in nbrs), dtype=np.int64, count=total)
    e = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])  # every citation in both directions
    e = e[:, e[0] != e[1]]
    if e.size and int(e.max()) >= n:
        raise ValueError(f"{what}: node ids outside [0, {n})")
    codes = np.unique(e[1] * n + e[0])  # sorted by (target, source), duplicates dropped
    return np.stack([codes % n, codes // n])


def assemble(parts: dict[str, object], name: str) -> dict[str, np.ndarray]:
    """The graph's arrays (the ``.npz``'s contents) from the parsed parts; ValueErrors name what does not fit.

    Row ``r`` of ``allx``/``ally`` is node ``r``; row ``r`` of ``tx``/``ty`` is node ``test.index[r]``
    (what PyG's sorted-then-reordered assembly amounts to). Nodes between the first and last
    test id without a row keep zero features and no label.
    """
    (rtx, ftx), ctx, vtx = _features(parts["tx"], f"ind.{name}.tx")
    (rall, fall), call, vall = _features(parts["allx"], f"ind.{name}.allx")
    ty, ally = _dense_labels(parts["ty"], f"ind.{name}.ty"), _dense_labels(parts["ally"], f"ind.{name}.ally")
    n_train = _dense_labels(parts["y"], f"ind.{name}.y").shape[0]
    test = parts["test.index"]
    lo, hi = int(test.min()), int(test.max())
    if ftx != fall or ty.shape[1] != ally.shape[1] or ty.shape[0] != rtx or rtx != len(test) \
            or rall != ally.shape[0] or lo != rall or n_train > rall:
        raise ValueError(f"ind.{name}: the parts do not fit (allx {rall} rows, ally {ally.shape[0]}, tx {rtx}, "
                         f"ty {ty.shape[0]}, {len(test)} test ids from {lo}, {n_train} labelled)")
    n = hi + 1  # CiteSeer: 1,015 positions for 1,000 test rows (15 papers have none)
    if n * fall > MAX_CELLS or len(np.unique(test)) != len(test):
        raise ValueError(f"ind.{name}: {n} nodes x {fall} features exceeds the cap of {MAX_CELLS}, or test ids repeat")
    coo = np.stack([np.concatenate([call[0], test[ctx[0]]]), np.concatenate([call[1], ctx[1]])])  # (2, nnz)
    values = np.concatenate([vall, vtx])
    order = np.lexsort((coo[1], coo[0]))  # by row, then column: CSR order
    coo, values = coo[:, order], values[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(coo[0], minlength=n))]).astype(np.int64)
    y1 = np.zeros((n, ally.shape[1]), dtype=np.int64)  # (N, C) one-hot
    y1[:rall], y1[test] = ally, ty
    y = np.where(y1.sum(1) > 0, y1.argmax(1), -1)
    masks = np.zeros((3, n), dtype=bool)  # train, val, test
    masks[0, :n_train] = True
    masks[1, n_train:n_train + 500] = True
    masks[2, test] = True
    return {"x_indptr": indptr, "x_indices": coo[1], "x_data": values, "x_shape": np.array([n, fall], dtype=np.int64),
            "y": y.astype(np.int64), "edge_index": _edges(parts["graph"], n, f"ind.{name}.graph"), "masks": masks,
            "num_classes": np.array(ally.shape[1], dtype=np.int64)}


def convert(folder: str | Path, name: str, out: str | Path) -> Path:
    """Parse the verified ``ind.{name}.*`` files of ``folder`` and write the graph to ``out`` (``.npz``, atomically).

    The caller has checked every file's SHA-256 (:func:`attnlab.data.fetch`); this only parses.
    """
    name = _check_name(name)
    folder = Path(folder)
    parts: dict[str, object] = {}
    for part in PARTS:
        path = folder / f"ind.{name}.{part}"
        raw = path.read_bytes()
        parts[part] = parse_test_index(raw, str(path)) if part == "test.index" else parse_pickle(raw, str(path))
    arrays = assemble(parts, name)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _check_name(name: str) -> str:
    name = str(name).lower()
    if name not in NAMES:
        raise ValueError(f"name must be one of {list(NAMES)}, got {name!r}")
    return name


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


def load_planetoid(path: str | Path, name: str | None = None) -> PlanetoidGraph:
    """The graph in the ``.npz`` at ``path`` (as :func:`convert` writes it), read with ``allow_pickle=False``.

    Args:
        path: the ``.npz`` file, or a folder holding ``{name}.npz``.
        name: ``cora`` or ``citeseer`` (default: the file's stem).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown name, or arrays that do not fit together.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        if name is None:
            raise ValueError(f"name is needed when path is a folder ({p})")
        p = p / f"{_check_name(name)}.npz"
    name = _check_name(name if name is not None else p.stem)
    if not p.is_file():
        raise FileNotFoundError(f"no Planetoid file at {str(p)!r}; run: attnlab data fetch {name}")
    with np.load(p, allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    try:
        n, f = (int(s) for s in a["x_shape"])
        indptr, indices, data = a["x_indptr"], a["x_indices"], a["x_data"]
        ok = 0 < n <= MAX_NODES and 0 < f and n * f <= MAX_CELLS and indptr.shape == (n + 1,) \
            and indices.shape == data.shape and int(indptr[0]) == 0 and int(indptr[-1]) == data.size \
            and bool(np.all(np.diff(indptr) >= 0)) and a["y"].shape == (n,) \
            and a["masks"].shape == (3, n) and a["edge_index"].ndim == 2 and a["edge_index"].shape[0] == 2 \
            and (not indices.size or 0 <= int(indices.min()) and int(indices.max()) < f) \
            and (not a["edge_index"].size or 0 <= int(a["edge_index"].min()) and int(a["edge_index"].max()) < n)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{p}: not a converted Planetoid file ({e}); fetch it again: attnlab data fetch {name}") from None
    if not ok:
        raise ValueError(f"{p}: its arrays do not fit together; fetch it again: attnlab data fetch {name}")
    x = np.zeros((n, f), dtype=np.float32)  # (N, F)
    x[np.repeat(np.arange(n), np.diff(indptr)), indices] = data
    masks = torch.from_numpy(a["masks"].copy())
    return PlanetoidGraph(name=name, x=torch.from_numpy(x), y=torch.from_numpy(a["y"].copy()),
                          edge_index=torch.from_numpy(a["edge_index"].copy()), train_mask=masks[0],
                          val_mask=masks[1], test_mask=masks[2], num_classes=int(a["num_classes"]))
