"""The Ray executor (``attnlab bench --executor ray``): options, the missing extra, what travels, the runner's logic.

The quick tests need no Ray: the options, the one-line error without the extra, the archives
that carry a case's folders, one task's body run here, and the runner's logic against a fake
``ray`` module (placement groups per group, a lost worker, Ctrl-C). The slow ones start a real
head on 127.0.0.1 with 2 CPUs: the tiny arena gives the local run's records, a killed worker
loses no finished case and ``--resume`` finishes the rest, and no Ray process outlives the head.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import ClassVar

import pytest

# Ray binds its servers to every interface in cluster mode; off, it listens on 127.0.0.1 only. Ray reads this
# when it is imported, so it is set before anything here imports it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from attnlab.bench import RunOptions, Suite, run
from attnlab.bench import executor_ray as xr
from attnlab.bench.suite import REGISTRY, Job, register_suite
from attnlab.bench.suites import get_suite
from helpers import UnitCase, bench_options


@dataclass(frozen=True)
class _WriterOptions:
    pass


@dataclass(frozen=True)
class _Io(UnitCase):
    """A case that writes a folder (``make``) or reads it (``read``)."""

    suite: ClassVar[str] = "writer"


class _Writer(Suite):
    """Two cases: ``make`` writes a folder it declares as its artifact; ``read`` needs it and reads the file."""

    name = "writer"
    parallel = True
    kinds = ("io",)
    modes = ("io",)

    def cases(self, opts):
        place = {"group": "g", "out_dir": os.path.abspath(opts.out_dir), "threads": 1}
        files = {"d": os.path.join(opts.data_dir, "d.txt")} if opts.data_dir else {}
        return [Job(_Io(name="make", kind="io", mode="io"), id="make", artifacts=("made",), **place),
                Job(_Io(name="read", kind="io", mode="io"), id="read", needs=("make",), data_files=files, **place)]

    def run_case(self, case, ctx):
        if case.name == "make":
            os.makedirs(os.path.join(ctx.out_dir, "made"), exist_ok=True)
            with open(os.path.join(ctx.out_dir, "made", "x.txt"), "w") as f:
                f.write("hello from make")
            return {"time_s": 0.1, "times_s": [0.1], "note": "made"}
        with open(os.path.join(ctx.out_dir, "made", "x.txt")) as f:
            note = f.read()
        for path in ctx.data_files.values():
            with open(path) as f:
                note += " + " + f.read()
        return {"time_s": 0.1, "times_s": [0.1], "note": note}


@pytest.fixture
def writer():
    register_suite(_Writer)
    yield
    REGISTRY.unregister("writer")


# -- options, the missing extra, import hygiene -------------------------------------------------------

@pytest.mark.parametrize("fields,match", [
    ({"executor": "dask"}, "executor must be one of"), ({"ray_address": "h:1"}, "only with executor='ray'"),
    ({"executor": "ray", "ray_address": " "}, "ray_address must be")])
def test_executor_options_are_validated(fields, match):
    with pytest.raises(ValueError, match=match):
        RunOptions(**fields)
    assert RunOptions(executor="ray", ray_address="10.0.0.1:6379").ray_address == "10.0.0.1:6379"


def test_without_ray_the_error_is_one_line_naming_the_extra(writer, tmp_path, monkeypatch, capsys):
    from attnlab.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[ray\]'"):
        xr.RayRunner()
    code = main(["bench", "writer", "--executor", "ray", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install 'attnlab[ray]'" in err


def test_attnlab_and_the_local_executor_never_import_ray():
    code = ("import sys, attnlab, attnlab.bench, attnlab.bench.runner, attnlab.bench.executor_ray, attnlab.cli\n"
            "from attnlab.bench.runner import _make_runner\n"
            "from attnlab.bench import RunOptions\n"
            "_make_runner(RunOptions())\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_the_cli_fills_the_executor_options():
    import argparse

    from attnlab.bench.cli import add_bench_parser, options_from_args

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "tasks", "--executor", "ray", "--address", "head:6379"])
    opts = options_from_args(args)
    assert (opts.executor, opts.ray_address) == ("ray", "head:6379")
    assert options_from_args(parser.parse_args(["bench"])).executor == "local"


# -- what travels -------------------------------------------------------------------------------------

def test_pack_and_unpack_carry_folders_and_refuse_escapes(tmp_path):
    import io
    import tarfile

    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "runs" / "a" / "ck").mkdir(parents=True)
    (src / "runs" / "a" / "ck" / "w.bin").write_bytes(b"\x00\x01")
    (src / "runs" / "a" / "latest").write_text("ck")
    (dst / "runs" / "a").mkdir(parents=True)
    (dst / "runs" / "a" / "stale.txt").write_text("old")
    blob = xr.pack(str(src), ["runs/a", "runs/missing"])
    assert xr.unpack(blob, str(dst)) == ["runs"]
    assert (dst / "runs" / "a" / "ck" / "w.bin").read_bytes() == b"\x00\x01"
    assert not (dst / "runs" / "a" / "stale.txt").exists()  # what was there is replaced, not merged
    bad = io.BytesIO()
    with tarfile.open(fileobj=bad, mode="w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="outside"):
        xr.unpack(bad.getvalue(), str(dst))
    assert not (tmp_path / "evil.txt").exists()


def test_a_task_runs_in_its_own_folder_and_returns_its_artifacts(writer, tmp_path):
    make, read = (j.spec() for j in get_suite("writer").cases(RunOptions(out_dir=str(tmp_path / "home"))))
    res = xr.run_remote(make, isolate=False)
    assert res["status"] == "ok" and res["node"] and not (tmp_path / "home" / "made").exists()  # not written here
    xr.unpack(res["artifacts_blob"], str(tmp_path / "home"))
    got = xr.run_remote(read, inputs=xr.pack(str(tmp_path / "home"), ["made"]), isolate=False)
    assert got["status"] == "ok" and got["note"] == "hello from make" and "artifacts_blob" not in got
    files = xr.run_remote({**read, "data_files": {"d": "/nowhere/f.txt"}}, inputs=xr.pack(str(tmp_path / "home"),
                          ["made"]), files={"d": ("f.txt", b"abc")}, isolate=False)
    assert files["note"] == "hello from make + abc"  # the file's bytes travelled, not its path
    alone = xr.run_remote(read, isolate=False)
    assert alone["status"] == "error" and "No such file" in alone["reason"]  # no inputs: make's folder is absent


# -- the runner's logic against a fake ray ------------------------------------------------------------

class _CancelledError(Exception):
    pass


class _CrashedError(Exception):
    pass


class _Ref:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args


class _FakeRay:
    """Enough of ``ray`` for :class:`RayRunner`: tasks run in the calling lane; ``crash`` names cases whose worker dies."""

    def __init__(self, cpus=(2,), crash=(), block=()):
        self.cpus, self.crash, self.block = cpus, set(crash), set(block)
        self.calls, self.pgs, self.removed, self.cancelled = [], [], [], []
        self.released = threading.Event()
        errors = {n: type(n, (Exception,), {}) for n in ("OutOfMemoryError", "NodeDiedError", "ObjectLostError",
                                                           "LocalRayletDiedError", "RayError")}
        self.exceptions = types.SimpleNamespace(TaskCancelledError=_CancelledError, WorkerCrashedError=_CrashedError, **errors)
        self.util = types.SimpleNamespace(
            placement_group=lambda bundles, strategy, name: self.pgs.append((name, bundles, strategy)) or name,
            remove_placement_group=self.removed.append,
            scheduling_strategies=types.SimpleNamespace(PlacementGroupSchedulingStrategy=lambda **kw: kw))

    def is_initialized(self):
        return True

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": float(c)}} for c in self.cpus]

    def put(self, value):
        return ("ref", value)

    def remote(self, **_):
        def wrap(fn):
            fake = self

            class _Fn:
                def options(self, **options):
                    return types.SimpleNamespace(remote=lambda *args: fake._submit(fn, options, args))

            return _Fn()

        return wrap

    def _submit(self, fn, options, args):
        self.calls.append((args[0].get("name"), options))
        return _Ref(fn, [a[1] if isinstance(a, tuple) and a[:1] == ("ref",) else a for a in args])

    def get(self, ref):
        name = ref.args[0].get("name")
        if name in self.block:
            self.released.wait(30)
            raise _CancelledError()
        if name in self.crash:
            raise _CrashedError("the worker died")
        return ref.fn(*ref.args)

    def cancel(self, ref, force=False):
        self.cancelled.append((ref.args[0].get("name"), force))
        self.released.set()


def test_groups_get_a_placement_group_and_artifacts_reach_the_cases_that_need_them(writer, tmp_path, monkeypatch):
    fake = _FakeRay(cpus=(1, 4))
    monkeypatch.setattr(xr, "require_ray", lambda: fake)
    monkeypatch.setattr(xr, "node_name", lambda: "fake (10.0.0.9)")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.txt").write_text("data")
    res = run("writer", bench_options(tmp_path / "out", executor="ray", isolate=False, lengths=None,
                                      data_dir=str(tmp_path / "data")))
    tmp_path = tmp_path / "out"
    by = {c["name"]: c for c in res["cases"]}
    assert by["make"]["status"] == by["read"]["status"] == "ok" and by["read"]["note"] == "hello from make + data"
    assert (tmp_path / "made" / "x.txt").read_text() == "hello from make"  # the parent wrote the artifact here
    assert by["make"]["node"].endswith("(10.0.0.9)") and res["settings"]["executor"] == "ray"
    assert fake.pgs == [("attnlab g", [{"CPU": 1}, {"CPU": 1}], "STRICT_PACK")] and fake.removed == ["attnlab g"]
    tasks = [(name, opts) for name, opts in fake.calls if name in by]
    assert all(o["num_cpus"] == 1 and o["scheduling_strategy"]["placement_group"] == "attnlab g" for _, o in tasks)


def test_a_lost_worker_is_not_journaled_and_resume_runs_it(writer, tmp_path, monkeypatch):
    monkeypatch.setattr(xr, "require_ray", lambda: _FakeRay(crash={"make"}))
    first = run("writer", bench_options(tmp_path, executor="ray", isolate=False, lengths=None))
    by = {c["name"]: c for c in first["cases"]}
    assert by["make"]["status"] == "error" and by["make"]["reason"].startswith("lost: ")
    assert by["read"]["status"] == "skipped" and any("--resume runs them again" in n for n in first["notes"])
    assert (tmp_path / "cases.jsonl").read_text() == ""  # neither is a result
    monkeypatch.setattr(xr, "require_ray", lambda: _FakeRay())
    again = run("writer", bench_options(tmp_path, executor="ray", isolate=False, lengths=None, resume=True))
    assert [c["status"] for c in again["cases"]] == ["ok", "ok"]


def test_stop_cancels_the_tasks_in_flight_and_starts_no_more(writer, tmp_path, monkeypatch):
    fake = _FakeRay(block={"make"})
    monkeypatch.setattr(xr, "require_ray", lambda: fake)
    runner = xr.RayRunner()
    make, read = (j.spec() for j in get_suite("writer").cases(RunOptions(out_dir=str(tmp_path))))
    runner.plan([make, read])
    out = {}
    lane = threading.Thread(target=lambda: out.update(runner(make)))
    lane.start()
    deadline = time.monotonic() + 10
    while not runner._live and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    lane.join(10)
    assert fake.cancelled == [("make", True)] and "cancelled" in out["reason"]
    with pytest.raises(KeyboardInterrupt):
        runner(read)
    runner.close()
    assert fake.removed == ["attnlab g"]


def test_a_group_no_node_can_hold_says_so(writer, tmp_path, monkeypatch):
    monkeypatch.setattr(xr, "require_ray", lambda: _FakeRay(cpus=(2,)))
    runner = xr.RayRunner()
    make, _ = (j.spec() for j in get_suite("writer").cases(RunOptions(out_dir=str(tmp_path))))
    runner.plan([{**make, "threads": 4}])
    got = runner({**make, "threads": 4})
    assert got["status"] == "error" and "needs 4 CPUs on one node" in got["reason"] and "has 2" in got["reason"]


# -- a real head on 127.0.0.1 (slow) --------------------------------------------------------------------

#: what a Ray process (or a case's process inside a Ray worker) has in its command line
_RAY_MARKS = ("raylet", "gcs_server", "ray::", "ray/_private", "ray/dashboard", "multiprocessing.forkserver")


def _ray_pids() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process that looks like Ray's or a fork server."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\x00", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if any(m in cmd for m in _RAY_MARKS):
            out[int(name)] = (ppid, cmd)
    return out


@pytest.fixture(scope="module")
def ray_head():
    """A local head: 127.0.0.1 only, 2 CPUs, a 200 MB object store; shut down after, with no Ray process left."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the process checks read /proc")
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTER:
        pytest.skip("ray was imported before this module could keep its servers on 127.0.0.1")
    before = set(_ray_pids())
    ray.init(num_cpus=2, object_store_memory=200 * 1024**2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        deadline, left = time.monotonic() + 30, {}
        while time.monotonic() < deadline:
            left = {p: c for p, c in _ray_pids().items() if p not in before and p != os.getpid()
                    and not (c[0] == os.getpid() and "forkserver" in c[1])}  # this process's own local fork server
            if not left:
                break
            time.sleep(0.5)
        assert not left, f"processes left after the head stopped: {left}"


def _tiny(out, **fields):
    return bench_options(out, threads=1, **{**get_suite("tasks").tiny_options(), **fields})


#: figures the seeds fix: equal whichever machine trained the case
_SEEDED = ("status", "score", "accuracy", "eval_loss", "steps", "curve", "score_0", "baseline_score",
           "activation_error", "score_ratio")


@pytest.mark.slow  # a Ray head and two tiny arenas: about 40 s on 2 cores
def test_the_tiny_arena_on_ray_equals_the_local_run(ray_head, tmp_path):
    local = run("tasks", _tiny(tmp_path / "local"))
    remote = run("tasks", _tiny(tmp_path / "ray", executor="ray"))
    assert [(c["name"], c["mode"]) for c in remote["cases"]] == [(c["name"], c["mode"]) for c in local["cases"]]
    for a, b in zip(local["cases"], remote["cases"]):
        assert {k: a.get(k) for k in _SEEDED} == {k: b.get(k) for k in _SEEDED}, (a["name"], a["mode"])
        assert b["status"] == "ok" and b["node"].endswith("(127.0.0.1)") and "node" not in a
    exact = tmp_path / "ray" / "arena-runs" / "mqar-64-exact"
    assert (exact / "checkpoints").is_dir() and (exact / "metrics.jsonl").is_file()  # written here by the parent
    assert remote["settings"]["executor"] == "ray" and any("no result cache" in n for n in remote["notes"])


def _kill_a_running_case(journal, stop: threading.Event, killed: list) -> None:
    """Once a case is journaled, SIGKILL the Ray worker running another (its process title is ray::attnlab_case)."""
    while not stop.is_set():
        if journal.exists() and journal.read_text().count("\n") >= 1:
            for pid, (_, cmd) in _ray_pids().items():
                if cmd.startswith("ray::attnlab_case"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
        time.sleep(0.05)


@pytest.mark.slow  # a Ray head, a tiny arena killed mid-run and resumed: about 40 s on 2 cores
def test_a_killed_worker_loses_no_finished_case_and_resume_finishes_the_rest(ray_head, tmp_path):
    out = tmp_path / "arena"
    names = ("exact", "local", "linear")
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_running_case, args=(out / "cases.jsonl", stop, killed))
    killer.start()
    try:
        first = run("tasks", _tiny(out, executor="ray", names=names))
    finally:
        stop.set()
        killer.join(10)
    assert killed, "no case was running once the first had finished"
    lost = [c for c in first["cases"] if c["status"] != "ok"]
    assert lost and any(c["reason"].startswith("lost: ") for c in lost), [c["reason"] for c in lost]
    journal = [json.loads(line) for line in (out / "cases.jsonl").read_text().splitlines()]
    assert journal and all(row["record"]["status"] == "ok" for row in journal)  # the lost ones are not there
    again = run("tasks", _tiny(out, executor="ray", names=names, resume=True))
    assert all(c["status"] == "ok" for c in again["cases"]) and len(again["cases"]) == len(first["cases"])
    assert any(f"resumed: {len(journal)} finished" in n for n in again["notes"])
    by = {(c["name"], c["mode"]): c for c in again["cases"]}
    for row in journal:  # a finished case is kept as it was, not run again
        rec = row["record"]
        kept = by[(rec["name"], rec["mode"])]
        for key in ("time_s", "peak_bytes", "score", "curve", "activation_error", "tokens_per_s", "wall_s", "node"):
            assert kept[key] == rec[key], key


def test_mixed_machines_get_a_node_column_and_a_note():
    from types import SimpleNamespace

    from attnlab.bench.runner import _executor_notes
    from attnlab.bench.suites.tasks import results

    def case(name, node):
        return {"suite": "tasks", "name": name, "mode": "train", "status": "ok", "N": 64, "score": 0.5,
                "score_name": "accuracy", "steps": 3, "node": node, "notes": [], "reason": None, "peak_bytes": 1,
                "settings": {"kind": "train", "task": "mqar", "positional": "rotary", "swap_steps": 0}}

    one = [case("exact", "a (10.0.0.1)"), case("local", "a (10.0.0.1)")]
    assert "node" not in results.rows(one)[0] and _executor_notes(one, SimpleNamespace(lost=set())) == []
    two = [case("exact", "a (10.0.0.1)"), case("exact", "b (10.0.0.2)")]
    head, rows = results.rows(two)
    assert head[-1] == "node" and [r[-1] for r in rows] == ["a (10.0.0.1)", "b (10.0.0.2)"]
    (note,) = _executor_notes(two, SimpleNamespace(lost=set()))
    assert note.startswith("the cases ran on 2 machines (a (10.0.0.1), b (10.0.0.2)") and "like with like" in note
