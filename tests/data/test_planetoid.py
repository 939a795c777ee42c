"""The Planetoid boundary: the published counts, PyG's reading of the same files, and crafted pickles refused.

The counts are the published ones (nodes, features, classes, directed edges, the 140/120 + 500
+ 1,000 split, CiteSeer's 15 papers without a test row). PyG's ``read_planetoid_data`` is the
oracle, on files this test writes with NumPy and scipy (always) and on the published files when
``ATTNLAB_TEST_SOURCES`` names a folder holding them (CI sets it). Each crafted pickle must end
in a ValueError within a second and well under 200 MB.
"""

from __future__ import annotations

import collections
import os
import pickle
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data import DATASETS, fetch
from attnlab.data.planetoid import PARTS, convert, load_planetoid, parse_pickle, parse_test_index

COUNTS = {  # published: nodes, features, classes, directed edges, train, val, test, papers without a label
    "cora": (2708, 1433, 7, 10556, 140, 500, 1000, 0),
    "citeseer": (3327, 3703, 6, 9104, 120, 500, 1000, 15),
}


@pytest.mark.parametrize("name", list(COUNTS))
def test_the_published_counts(planetoid, name):
    g = planetoid(name)
    n, f, c, e, tr, va, te, unlabelled = COUNTS[name]
    assert (g.num_nodes, g.num_features, g.num_classes, g.num_edges) == (n, f, c, e)
    assert (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum())) == (tr, va, te)
    assert not (g.train_mask & g.val_mask).any() and not ((g.train_mask | g.val_mask) & g.test_mask).any()
    assert int((g.y < 0).sum()) == unlabelled and not (g.y[g.train_mask | g.val_mask | g.test_mask] < 0).any()
    assert set(g.x.unique().tolist()) <= {0.0, 1.0}
    src, dst = g.edge_index
    assert not (src == dst).any()  # no self-loops
    codes = dst * n + src
    assert torch.equal(codes, codes.unique())  # no duplicates, sorted by (target, source)
    assert torch.equal((src * n + dst).sort().values, codes)  # symmetric: every edge both ways
    if unlabelled:
        assert (g.x[g.y < 0] == 0).all()  # CiteSeer's papers without a test row: zero features


def _same_as_pyg(folder: Path, name: str, npz: Path) -> None:
    io = pytest.importorskip("torch_geometric.io")
    ours = load_planetoid(convert(folder, name, npz))
    theirs = io.read_planetoid_data(str(folder), name)
    assert torch.equal(ours.x, theirs.x) and torch.equal(ours.edge_index, theirs.edge_index)
    labelled = ours.y >= 0
    assert torch.equal(ours.y[labelled], theirs.y[labelled])
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(ours, f"{split}_mask"), getattr(theirs, f"{split}_mask"))


def write_planetoid(folder: Path, name: str = "cora", *, seed: int = 0, gap: bool = False) -> Path:
    """A small Planetoid set in the published format, pickled by NumPy and scipy themselves: 520 known
    nodes, 12 test nodes listed out of order (with ``gap``, one id skipped, as in CiteSeer), 9 features."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(seed)
    n_all, n_test, f, c, n_train = 520, 12, 9, 3, 10  # PyG takes the 500 nodes after the labelled ones as val
    ids = np.arange(n_all, n_all + n_test + (1 if gap else 0))
    if gap:
        ids = np.delete(ids, 5)
    ids = rng.permutation(ids)
    onehot = np.eye(c, dtype=np.int64)
    parts = {
        "allx": sp.csr_matrix((rng.random((n_all, f)) < 0.3).astype(np.float32)),
        "tx": sp.csr_matrix((rng.random((n_test, f)) < 0.3).astype(np.float32)),
        "ally": onehot[rng.integers(0, c, n_all)], "ty": onehot[rng.integers(0, c, n_test)],
    }
    parts["x"], parts["y"] = parts["allx"][:n_train], parts["ally"][:n_train]
    n = int(ids.max()) + 1
    graph = collections.defaultdict(list)
    for s, t in rng.integers(0, n, (60, 2)):  # citations listed both ways, a self-loop and a repeat or two
        graph[int(s)].append(int(t))
        graph[int(t)].append(int(s))
    parts["graph"] = graph
    folder.mkdir(parents=True, exist_ok=True)
    for part, obj in parts.items():
        (folder / f"ind.{name}.{part}").write_bytes(pickle.dumps(obj, protocol=3))
    (folder / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in ids))
    return folder


@pytest.mark.parametrize("gap", [False, True])
def test_equals_torch_geometric_on_files_numpy_and_scipy_wrote(tmp_path, gap):
    folder = write_planetoid(tmp_path / "raw", "citeseer" if gap else "cora", gap=gap)
    name = "citeseer" if gap else "cora"
    _same_as_pyg(folder, name, tmp_path / f"{name}.npz")


@pytest.mark.parametrize("name", list(COUNTS))
def test_equals_torch_geometric_on_the_published_files(tmp_path, name):
    src = os.environ.get("ATTNLAB_TEST_SOURCES")
    folder = Path(src) / "planetoid" if src else None
    if folder is None or not (folder / f"ind.{name}.x").is_file():
        pytest.skip("the published Planetoid files are not here (set ATTNLAB_TEST_SOURCES to a folder holding "
                    "planetoid/ind.*, as .ci/run does)")
    _same_as_pyg(folder, name, tmp_path / f"{name}.npz")


def test_fetch_converts_once_and_keeps_only_the_npz(tmp_path, monkeypatch):
    raw = write_planetoid(tmp_path / "raw")
    toy = _toy_manifest(raw)
    for attr in ("load", "loads", "Unpickler"):  # nothing may unpickle, during the import or after it
        monkeypatch.setattr(pickle, attr, _no_unpickling)
    folder = fetch(toy, raw, root=tmp_path / "data", progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["cora.npz"]
    g = load_planetoid(folder / "cora.npz")
    assert g.num_nodes == 532 and g.num_features == 9 and int(g.test_mask.sum()) == 12
    with np.load(folder / "cora.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def _no_unpickling(*args, **kwargs):
    raise AssertionError("pickle was called")


def _toy_manifest(raw: Path, flip: str | None = None):
    import dataclasses
    import hashlib

    cora = DATASETS["cora"]
    files = tuple(dataclasses.replace(f, sha256=hashlib.sha256((raw / f.name).read_bytes()).hexdigest())
                  for f in cora.files)
    if flip is not None:
        files = tuple(dataclasses.replace(f, sha256="0" * 64) if f.name.endswith(flip) else f for f in files)
    return dataclasses.replace(cora, files=files)


def test_a_file_that_is_not_the_published_one_is_refused(tmp_path):
    raw = write_planetoid(tmp_path / "raw")
    with pytest.raises(ValueError, match=r"ind\.cora\.y: its SHA-256 is [0-9a-f]{64}, expected 0{64}; it is not the "
                                         r"published file, nothing was kept"):
        fetch(_toy_manifest(raw, flip=".y"), raw, root=tmp_path / "data", progress=False)
    assert not (tmp_path / "data" / "planetoid").exists() or not any((tmp_path / "data" / "planetoid").iterdir())
    assert not any((tmp_path / "data" / ".partial").iterdir())
    with pytest.raises(ValueError, match=r"ind\.cora\.x: its SHA-256 .* expected 23cfa55d"):  # the catalogue's own hashes
        fetch("cora", raw, root=tmp_path / "data2", progress=False)


# -- crafted pickles: each a clear ValueError, fast, in little memory ---------------------------------


def _array_pickle(descr: bytes, shape: tuple[int, ...], raw: bytes, state_tail: bytes | None = None) -> bytes:
    """A hand-written protocol-2 pickle of a NumPy array, as NumPy 1 on Python 2 writes one."""
    ints = b"".join(b"J" + struct.pack("<i", s) for s in shape)
    dtype_state = state_tail if state_tail is not None else b"(K\x03U\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    return (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
            b"(K\x01(" + ints + b"tcnumpy\ndtype\nU" + bytes([len(descr)]) + descr + b"K\x00K\x01\x87R"
            + dtype_state + b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tb.")


def _memo_bomb(keys: int, per_list: int) -> bytes:
    """``defaultdict(list)`` whose every key shares one list of ``per_list`` ids by memo reference."""
    head = b"\x80\x02ccollections\ndefaultdict\nc__builtin__\nlist\n\x85R"
    shared = b"]q\x01(" + b"K\x01" * per_list + b"e"
    items = b"(K\x00" + shared + b"".join(b"J" + struct.pack("<i", k) + b"h\x01" for k in range(1, keys)) + b"u"
    return head + items + b"."


CRAFTED = {
    "an object dtype": (_array_pickle(b"O8", (2,), b"\x00" * 16), r"dtype 'O8' is not one of"),
    "a structured dtype state": (_array_pickle(b"f4", (1,), b"\x00" * 4,
                                               b"(K\x03U\x01<N(U\x01aNtNJ\x04\x00\x00\x00J\x04\x00\x00\x00K\x00tb"),
                                 r"dtype f4 with a state of fields or flags"),
    "a huge array shape": (_array_pickle(b"f4", (1 << 30, 1 << 30), b"\x00" * 16), r"an array of shape"),
    "a shape that lies about its bytes": (_array_pickle(b"f8", (4096, 4096), b"\x00" * 64),
                                          r"values\) with 64 bytes of data"),
    "a memo bomb": (_memo_bomb(10_000, 10_000),  # 90 KB that would be 10^8 edges
                    r"a graph of more than 4194304 edges"),
    "an unknown global": (pickle.dumps(os.system, protocol=2), r"refused the global (posix|os|nt)\.system"),
    "a global reached by REDUCE": (b"\x80\x02cbuiltins\neval\nU\x041+1\x85R.", r"refused the global builtins\.eval"),
    "an opcode it does not know": (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01a\x94.",
                                   r"the pickle opcode (SHORT_BINUNICODE|MEMOIZE) is not one"),
    "a cut file": (_array_pickle(b"f4", (4,), b"\x00" * 16)[:-20], r"not a readable pickle|without its end"),
}


@pytest.mark.serial  # asserts on seconds
@pytest.mark.parametrize("what", list(CRAFTED))
def test_a_crafted_pickle_fails_fast_in_little_memory(what):
    raw, message = CRAFTED[what]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=message) as info:
            parse_pickle(raw, "ind.cora.x")
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "ind.cora.x" in str(info.value) and "refusing it" in str(info.value)
    assert elapsed < 1.0 and peak < 200e6, (elapsed, peak)


def test_huge_csr_shapes_and_test_ids_are_refused_before_allocation(tmp_path):
    sp = pytest.importorskip("scipy.sparse")
    big = sp.csr_matrix((1, 1), dtype=np.float32)
    big._shape = (1 << 40, 1 << 40)  # a record that claims a terabyte-sized matrix
    rec = parse_pickle(pickle.dumps(big, protocol=3), "ind.cora.allx")
    with pytest.raises(ValueError, match=r"exceeds the cap"):
        rec.parts("ind.cora.allx")
    with pytest.raises(ValueError, match=r"test ids outside \[0, 1048576\)"):
        parse_test_index(b"1\n99999999999\n", "ind.cora.test.index")
    with pytest.raises(ValueError, match=r"not a decimal integer"):
        parse_test_index(b"1\nx\n", "ind.cora.test.index")
    raw = write_planetoid(tmp_path / "raw")
    (raw / "ind.cora.test.index").write_text("520\n521\n1000000\n")  # a span of a million nodes for 3 rows
    with pytest.raises(ValueError, match=r"the parts do not fit"):
        convert(raw, "cora", tmp_path / "x.npz")


def test_a_damaged_npz_is_refused(tmp_path):
    raw = write_planetoid(tmp_path / "raw")
    out = convert(raw, "cora", tmp_path / "cora.npz")
    with np.load(out, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["edge_index"] = arrays["edge_index"] + 10_000  # ids past the nodes
    np.savez(out, **arrays)
    with pytest.raises(ValueError, match=r"do not fit together; fetch it again: attnlab data fetch cora"):
        load_planetoid(out)
    np.savez(out, y=np.zeros(3, dtype=object))
    with pytest.raises(ValueError, match=r"allow_pickle|not a converted Planetoid file"):
        load_planetoid(out)
    with pytest.raises(FileNotFoundError, match=r"run: attnlab data fetch citeseer"):
        load_planetoid(tmp_path, "citeseer")
    with pytest.raises(ValueError, match=r"name must be one of \['cora', 'citeseer'\]"):
        load_planetoid(tmp_path, "pubmed")
    assert set(PARTS) == {f.name.split(".", 2)[2] for f in DATASETS["cora"].files}
