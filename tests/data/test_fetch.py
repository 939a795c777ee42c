"""Fetching data sets: downloads from a local HTTP server, the checksum refusal, cut and killed downloads,
imports from a folder, finding the data, the catalogue, and ``attnlab data``.

The server is ``http.server`` on 127.0.0.1 in a thread of this process, serving files the
test writes; it answers a bounded number of requests and is shut down after each test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data import DATASETS, DataSet, FileSpec, MissingDataError, fetch, locate, present, status

BODY = b"To be, or not to be, that is the question.\n" * 200


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files[path]``; ``/cut/...`` sends half and closes, ``/stall/...`` sends half and waits."""

    def do_GET(self):
        self.server.hits += 1
        mode, _, name = self.path.strip("/").partition("/")
        body = self.server.files.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "ok":
            self.wfile.write(body)
            return
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        if mode == "stall":
            self.server.stalled.wait(20)  # until the test has killed the client (bounded)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.files, srv.hits, srv.stalled = {}, 0, threading.Event()
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield srv
    finally:
        srv.stalled.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)
    assert srv.hits < 50  # bounded: no retry loop hammered it


def _toy(url: str, body: bytes = BODY, name: str = "play.txt", member: str | None = None) -> DataSet:
    spec = FileSpec(name, hashlib.sha256(body).hexdigest(), (url,), archive_member=member)
    return DataSet(name="toy", folder="toy", files=(spec,), license="public domain", citation="-",
                   description="a test file", size_bytes=len(body))


def test_a_download_is_verified_and_kept(server, tmp_path):
    server.files["play.txt"] = BODY
    ds = _toy(f"{server.url}/ok/play.txt")
    folder = fetch(ds, root=tmp_path, progress=True)
    assert (folder / "play.txt").read_bytes() == BODY and present(ds, tmp_path)
    assert folder == tmp_path / "toy"
    hits = server.hits
    assert fetch(ds, root=tmp_path) == folder and server.hits == hits  # already here: nothing downloaded
    fetch(ds, root=tmp_path, force=True)
    assert server.hits == hits + 1
    assert not any((tmp_path / ".partial").iterdir())


def test_a_download_with_another_checksum_is_refused(server, tmp_path):
    server.files["play.txt"] = BODY.replace(b"question", b"answer!!")
    ds = _toy(f"{server.url}/ok/play.txt")
    with pytest.raises(ValueError, match=re.escape(f"{server.url}/ok/play.txt") + r": its SHA-256 is [0-9a-f]{64}, "
                                         r"expected [0-9a-f]{64}; it is not the published file, nothing was kept"):
        fetch(ds, root=tmp_path, progress=False)
    assert not (tmp_path / "toy" / "play.txt").exists() and not any((tmp_path / ".partial").iterdir())


def test_a_cut_download_leaves_nothing(server, tmp_path):
    server.files["play.txt"] = BODY
    ds = _toy(f"{server.url}/cut/play.txt")
    with pytest.raises(OSError, match=r"could not download .*/cut/play\.txt .*offline\? .*attnlab data fetch toy "
                                      r"--from DIR"):
        fetch(ds, root=tmp_path, progress=False)
    assert not (tmp_path / "toy" / "play.txt").exists() and not any((tmp_path / ".partial").iterdir())


def test_offline_names_the_url_and_from(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ds = _toy(f"http://127.0.0.1:{port}/ok/play.txt")
    with pytest.raises(OSError, match=rf"could not download http://127\.0\.0\.1:{port}/ok/play\.txt .*--from DIR"):
        fetch(ds, root=tmp_path, progress=False)


_CHILD = """
import sys
from attnlab.data import DataSet, FileSpec, fetch
spec = FileSpec("play.txt", sys.argv[2], (sys.argv[1],))
fetch(DataSet("toy", "toy", (spec,), "-", "-", "-", 1), root=sys.argv[3], progress=False)
"""


def test_a_killed_download_leaves_nothing_and_the_next_fetch_cleans_up(server, tmp_path):
    server.files["play.txt"] = BODY
    sha = hashlib.sha256(BODY).hexdigest()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, f"{server.url}/stall/play.txt", sha, str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until half the file is on disk, then kill the process
            parts = [p for p in (tmp_path / ".partial").glob("*/*") if p.stat().st_size >= len(BODY) // 2]
            if parts:
                break
            time.sleep(0.05)
        assert parts, "the child never started downloading"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert not (tmp_path / "toy").exists()  # nothing under the data set's name
    assert any((tmp_path / ".partial").iterdir())  # a killed process cannot clean up after itself
    fetch(_toy(f"{server.url}/ok/play.txt"), root=tmp_path, progress=False)
    assert (tmp_path / "toy" / "play.txt").read_bytes() == BODY
    assert not any((tmp_path / ".partial").iterdir())  # the dead fetch's leftovers were swept


def test_a_zip_member_is_extracted_and_verified(server, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("set/play.txt", BODY)
        z.writestr("set/other.txt", b"x")
    server.files["set.zip"] = buf.getvalue()
    ds = _toy(f"{server.url}/ok/set.zip", member="set/play.txt")
    assert (fetch(ds, root=tmp_path, progress=False) / "play.txt").read_bytes() == BODY
    bad = dataclasses.replace(ds, files=(dataclasses.replace(ds.files[0], archive_member="set/other.txt"),))
    with pytest.raises(ValueError, match=r"set\.zip \(set/other\.txt\): its SHA-256"):
        fetch(bad, root=tmp_path / "b", progress=False)
    missing = dataclasses.replace(ds, files=(dataclasses.replace(ds.files[0], archive_member="nope.txt"),))
    with pytest.raises(ValueError, match=r"not the published archive"):
        fetch(missing, root=tmp_path / "c", progress=False)


def test_import_from_a_folder(tmp_path):
    src = tmp_path / "copy"
    (src / "toy").mkdir(parents=True)
    (src / "toy" / "play.txt").write_bytes(BODY)  # in a subfolder named after the data set's folder
    ds = _toy("https://example.invalid/play.txt")
    assert (fetch(ds, src, root=tmp_path / "data") / "play.txt").read_bytes() == BODY
    (src / "toy" / "play.txt").write_bytes(BODY + b"!")
    with pytest.raises(ValueError, match=r"copy/toy/play\.txt: its SHA-256"):
        fetch(ds, src, root=tmp_path / "data2")
    with pytest.raises(MissingDataError, match=r"play\.txt is not in .*nor in"):
        fetch(ds, tmp_path, root=tmp_path / "data3")
    with pytest.raises(MissingDataError, match=r"--from .*nowhere: no such folder"):
        fetch(ds, tmp_path / "nowhere", root=tmp_path / "data4")


def test_locate_looks_in_the_given_folder_then_attnlab_data_then_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "env"))
    with pytest.raises(MissingDataError, match=r"data set 'tinyshakespeare' is not here \(looked in .*env/"
                                               r"tinyshakespeare and .*home/\.cache/attnlab/data/tinyshakespeare\); "
                                               r"run: attnlab data fetch tinyshakespeare"):
        locate("tinyshakespeare")
    cache = tmp_path / "home" / ".cache" / "attnlab" / "data" / "tinyshakespeare"
    cache.mkdir(parents=True)
    (cache / "input.txt").write_text("x")
    assert locate("tinyshakespeare") == cache
    env = tmp_path / "env" / "tinyshakespeare"
    env.mkdir(parents=True)
    (env / "input.txt").write_text("y")
    assert locate("tinyshakespeare") == env  # $ATTNLAB_DATA first
    assert locate("tinyshakespeare", tmp_path / "env") == env and locate("tinyshakespeare", env) == env
    with pytest.raises(MissingDataError, match=r"not in .*home"):
        locate("tinyshakespeare", tmp_path / "home")
    with pytest.raises(ValueError, match=r"unknown data set 'shakespeare': expected one of"):
        locate("shakespeare")


def test_a_task_without_data_names_the_fetch_command(tmp_path, monkeypatch):
    from attnlab.tasks import create_task

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "none"))
    for task, name in (("chars", "tinyshakespeare"), ("passkey", "tinyshakespeare"), ("sentiment", "sentiment"),
                       ("translation", "multi30k"), ("cora", "cora")):
        with pytest.raises(MissingDataError, match=rf"run: attnlab data fetch {name} "):
            create_task(task).ensure_setup()


def test_the_catalogue():
    assert set(DATASETS) == {"tinyshakespeare", "cora", "citeseer", "multi30k", "sentiment"}
    for ds in DATASETS.values():
        assert ds.license and ds.citation and ds.description and ds.size_bytes > 0
        for f in ds.files:
            assert re.fullmatch(r"[0-9a-f]{64}", f.sha256) and f.urls
            assert all(u.startswith("https://") for u in f.urls)
    src = os.environ.get("ATTNLAB_TEST_SOURCES")
    if src:  # the published copies: every hash and size in the catalogue is theirs
        for ds in DATASETS.values():
            paths = [Path(src) / ds.folder / f.name for f in ds.files]
            assert sum(p.stat().st_size for p in paths) == ds.size_bytes, ds.name
            for f, p in zip(ds.files, paths):
                assert hashlib.sha256(p.read_bytes()).hexdigest() == f.sha256, p


def test_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))  # no cache either
    assert main(["data", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(DATASETS) and not any(r["present"] for r in rows)
    assert all(r["path"].startswith(str(tmp_path / "data")) for r in rows)
    assert main(["data", "list"]) == 0
    assert "attnlab data fetch NAME" in capsys.readouterr().out
    src = tmp_path / "copy" / "tinyshakespeare"
    src.mkdir(parents=True)
    (src / "input.txt").write_bytes(b"not shakespeare")
    assert main(["data", "fetch", "tinyshakespeare", "--from", str(tmp_path / "copy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab data: ") and "its SHA-256 is" in err and len(err.strip().splitlines()) == 1
    assert main(["data", "fetch", "nonsense"]) == 2
    assert "unknown data set(s) ['nonsense']" in capsys.readouterr().err
    assert [r["present"] for r in status()] == [False] * len(DATASETS)
