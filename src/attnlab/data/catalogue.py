"""The data sets attnlab's tasks read: where each comes from, what each file must hash to, its license.

Each :class:`DataSet` is a manifest: the canonical public URL of every file (the same files
nanoGPT, PyTorch Geometric and the data sets' authors publish), the SHA-256 every file must
have, and the license and citation. The hashes live here, in the code, not in a file beside
the data: whoever can change the data cannot change what it is checked against.

Layout once fetched (under :func:`attnlab.data.data_root`): ``<root>/<folder>/<file>``, for
example ``tinyshakespeare/input.txt`` or ``planetoid/cora.npz`` (the Planetoid pickles are
verified, converted once into an ``.npz`` and not kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DATASETS", "DataSet", "FileSpec", "dataset"]


@dataclass(frozen=True)
class FileSpec:
    """One published file of a data set.

    Attributes:
        name: the file's name as published (and as looked for by ``fetch --from DIR``).
        sha256: its SHA-256, hex.
        urls: where to download it, tried in order.
        archive_member: when set, ``urls`` point at a zip archive and this is the member's path
            in it (the member is what ``sha256`` checks).
    """

    name: str
    sha256: str
    urls: tuple[str, ...]
    archive_member: str | None = None


@dataclass(frozen=True)
class DataSet:
    """A data set's manifest.

    Attributes:
        name: what ``attnlab data fetch NAME`` takes.
        folder: its folder under the data root.
        files: the published files (all verified before anything is kept).
        outputs: what the folder holds once fetched (the published names, or the converted files).
        license: the license, in words.
        citation: whom to cite.
        description: one line on what it is and which task reads it.
        size_bytes: the published files' total size (the archive's members, for one).
        convert: None to keep the published files; ``"planetoid"`` to convert them into one
            ``.npz`` (:mod:`attnlab.data.planetoid`).
    """

    name: str
    folder: str
    files: tuple[FileSpec, ...]
    license: str
    citation: str
    description: str
    size_bytes: int
    outputs: tuple[str, ...] = field(default=())
    convert: str | None = None

    def kept(self) -> tuple[str, ...]:
        """The file names the data set's folder holds once fetched."""
        return self.outputs or tuple(f.name for f in self.files)


_CHAR_RNN = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
_PLANETOID = "https://github.com/kimiyoung/planetoid/raw/master/data/"
_MULTI30K = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
_UCI_ZIP = ("https://archive.ics.uci.edu/static/public/331/sentiment+labelled+sentences.zip",
            "https://archive.ics.uci.edu/ml/machine-learning-databases/00331/sentiment%20labelled%20sentences.zip")


def _planetoid(name: str, hashes: dict[str, str], size: int, description: str) -> DataSet:
    parts = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return DataSet(
        name=name, folder="planetoid",
        files=tuple(FileSpec(f"ind.{name}.{p}", hashes[p], (f"{_PLANETOID}ind.{name}.{p}",)) for p in parts),
        outputs=(f"{name}.npz",), convert="planetoid",
        license="MIT (the Planetoid repository's license)",
        citation="Yang, Cohen, Salakhutdinov, \"Revisiting Semi-Supervised Learning with Graph Embeddings\", ICML 2016",
        description=description, size_bytes=size)


#: every data set, by name
DATASETS: dict[str, DataSet] = {d.name: d for d in (
    DataSet(
        name="tinyshakespeare", folder="tinyshakespeare",
        files=(FileSpec("input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
                        (f"{_CHAR_RNN}input.txt",)),),
        license="public domain (the text); the file as published in karpathy/char-rnn",
        citation="Karpathy, char-rnn (2015)",
        description="40,000 lines of Shakespeare, 65 characters: the chars and passkey tasks, the arena",
        size_bytes=1_115_394),
    _planetoid("cora", {
        "x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
        "tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
        "allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
        "y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
        "ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
        "ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
        "graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
        "test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    }, 572_444, "the Cora citation graph (2,708 papers, 7 classes), Planetoid split: the cora task"),
    _planetoid("citeseer", {
        "x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
        "tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
        "allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
        "y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
        "ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
        "ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
        "graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
        "test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    }, 1_036_188, "the CiteSeer citation graph (3,327 papers, 6 classes), Planetoid split: the citeseer task"),
    DataSet(
        name="multi30k", folder="multi30k",
        files=tuple(FileSpec(n, h, (f"{_MULTI30K}{n}",)) for n, h in (
            ("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
            ("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
            ("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
            ("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
            ("test_2016_flickr.de.gz", "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
            ("test_2016_flickr.en.gz", "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
        )),
        license="non-commercial research and education only (derived from Flickr30K)",
        citation="Elliott, Frank, Sima'an, Specia, \"Multi30K: Multilingual English-German Image Descriptions\", 2016",
        description="29,000 German-English caption pairs (task 1, raw): the translate task",
        size_bytes=1_296_271),
    DataSet(
        name="sentiment", folder="sentiment",
        files=tuple(FileSpec(n, h, _UCI_ZIP, archive_member=f"sentiment labelled sentences/{n}") for n, h in (
            ("amazon_cells_labelled.txt", "47003fc0a0d4840b00e96e715b6189bad09e7443a3da41c4cbe12ffc79f86ae3"),
            ("imdb_labelled.txt", "29cb10b2bfbc60ea33dcbd5abaa8bcf977b142cec7926c627dd76232aaafbfed"),
            ("yelp_labelled.txt", "c76468b7b5c6e56a0804d728345c5f84aa2142ddb214420f61cc9cfd4c00d2ea"),
        )),
        license="CC BY 4.0 (UCI Machine Learning Repository, data set 331)",
        citation="Kotzias, Denil, de Freitas, Smyth, \"From Group to Individual Labels using Deep Features\", KDD 2015",
        description="3,000 labelled review sentences (Amazon, IMDB, Yelp): the sentiment task, the deploy suite",
        size_bytes=204_822),
)}


def dataset(name: str) -> DataSet:
    """The manifest called ``name``; a ValueError listing the names for any other."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown data set {name!r}: expected one of {sorted(DATASETS)}") from None
