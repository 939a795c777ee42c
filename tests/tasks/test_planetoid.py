"""The Planetoid loader: the published counts, PyG's reading of the same files, and refused pickles.

The counts are those of the data folder's SOURCE file (nodes, features, classes, directed
edges, the 140/120 + 500 + 1,000 split, CiteSeer's 15 papers without a test row). A pickle
that names any global beyond the NumPy / scipy.sparse / collections ones is refused before
anything is built, as is a file whose SHA-256 differs from the one SOURCE lists.
"""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch

from attnlab.tasks.planetoid import SafeUnpickler, load_planetoid, planetoid_dir

COUNTS = {  # from SOURCE: nodes, features, classes, directed edges, train, val, test, papers without a label
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


@pytest.mark.parametrize("name", list(COUNTS))
def test_equals_torch_geometric_reading_of_the_same_files(planetoid, name):
    io = pytest.importorskip("torch_geometric.io")
    g = planetoid(name)
    theirs = io.read_planetoid_data(str(planetoid_dir(None)), name)
    assert torch.equal(g.x, theirs.x) and torch.equal(g.edge_index, theirs.edge_index)
    labelled = g.y >= 0
    assert torch.equal(g.y[labelled], theirs.y[labelled])
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(g, f"{split}_mask"), getattr(theirs, f"{split}_mask"))


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def _copy(tmp_path, with_source: bool):
    src = planetoid_dir(None)
    if src is None:
        pytest.skip("the Planetoid files are not here")
    for f in src.glob("ind.cora.*"):
        shutil.copy(f, tmp_path / f.name)
    if with_source:
        shutil.copy(src / "SOURCE", tmp_path / "SOURCE")
    return tmp_path


def test_a_tampered_pickle_is_refused(tmp_path):
    folder = _copy(tmp_path, with_source=False)
    (folder / "ind.cora.graph").write_bytes(pickle.dumps(_Evil(), protocol=2))
    with pytest.raises(ValueError, match=r"ind\.cora\.graph: refused to unpickle (posix|os|nt)\.system.*tampered"):
        load_planetoid(folder, "cora")
    (folder / "ind.cora.graph").write_bytes(pickle.dumps({"a": torch.nn.Linear}, protocol=2))
    with pytest.raises(ValueError, match=r"refused to unpickle torch\.nn\.modules\.linear\.Linear"):
        load_planetoid(folder, "cora")


def test_a_file_that_differs_from_source_is_refused(tmp_path):
    folder = _copy(tmp_path, with_source=True)
    raw = bytearray((folder / "ind.cora.y").read_bytes())
    raw[-3] ^= 1  # one flipped bit in the labels
    (folder / "ind.cora.y").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"ind\.cora\.y: its SHA-256 differs from the one listed in .*SOURCE"):
        load_planetoid(folder, "cora")


def test_missing_and_malformed_files_are_named(tmp_path):
    folder = _copy(tmp_path, with_source=False)
    (folder / "ind.cora.tx").unlink()
    with pytest.raises(FileNotFoundError, match=r"ind\.cora\.tx.* is missing"):
        load_planetoid(folder, "cora")
    shutil.copy(folder / "ind.cora.x", folder / "ind.cora.tx")
    (folder / "ind.cora.ty").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"ind\.cora\.ty: not a readable Planetoid pickle"):
        load_planetoid(folder, "cora")
    with pytest.raises(ValueError, match=r"name must be one of \['cora', 'citeseer'\]"):
        load_planetoid(folder, "pubmed")


def test_the_unpickler_admits_only_its_globals():
    import io

    ok = SafeUnpickler(io.BytesIO(pickle.dumps({"a": [1, 2]}, protocol=2))).load()
    assert ok == {"a": [1, 2]}
    with pytest.raises(ValueError, match=r"refused to unpickle (__builtin__|builtins)\.eval"):
        SafeUnpickler(io.BytesIO(pickle.dumps(eval, protocol=2))).load()
