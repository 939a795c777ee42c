"""The result cache: a finished arena case is reused by a later run of the same code on the same CPU, in any
folder and with any lanes, marked as reused; ``fresh`` measures again; a case others need reruns with them."""

from __future__ import annotations

import json

from attnlab.bench import run
from attnlab.bench.cache import ResultCache, fingerprint
from attnlab.bench.runner import case_key, reusable
from helpers import bench_options

SCALE = {"steps": 0.005, "batch": 2, "swap_steps": 1, "eval_every": 2,
         "options": {"mqar": {"pairs": 4, "keys": 8, "val_size": 8}}}


def _arena(out, cache, **kw):
    return run("tasks", bench_options(out, profile="full", lengths=(64,), names=("exact", "local"), isolate=False,
                                      cache_dir=str(cache), suite_options={"tasks": {"tasks": ("mqar",), "scale": SCALE}},
                                      **kw))


def test_a_second_run_reuses_every_case_and_fresh_measures_again(tmp_path):
    cache = tmp_path / "cache"
    first = _arena(tmp_path / "a", cache)
    assert all(c["status"] == "ok" and "reused" not in c for c in first["cases"])
    again = _arena(tmp_path / "b", cache, jobs=2, threads=1)  # another folder, other lanes: the same cases
    assert all(c.get("reused", {}).get("measured") for c in again["cases"])
    assert [c["score"] for c in again["cases"]] == [c["score"] for c in first["cases"]]
    assert any("case(s) reused" in n and str(cache) in n for n in again["notes"])
    assert all(any("reused from the result cache" in n for n in c["notes"]) for c in again["cases"])
    fresh = _arena(tmp_path / "c", cache, fresh=True)
    assert not any("reused" in c for c in fresh["cases"])
    assert any("--fresh, nothing reused" in n for n in fresh["notes"])


def test_a_case_that_others_need_is_reused_only_with_them(tmp_path):
    cache = ResultCache(tmp_path)
    specs = [{"suite": "tasks", "id": "x/exact/train", "name": "exact", "skip": None},
             {"suite": "tasks", "id": "x/local/swap_in", "name": "local", "skip": None, "needs": ["x/exact/train"]},
             {"suite": "tasks", "id": "x/linear/train", "name": "linear", "skip": None}]
    for s in specs:
        s.update({k: 0 for k in ("kind", "mask", "N", "B", "H", "D", "dtype", "device", "mode")}, settings={})
    for s in (specs[0], specs[2]):
        cache.put(case_key(s), {"status": "ok", "notes": []})
    assert sorted(reusable(specs, cache)) == [2]  # exact runs again: the swap-in needs its checkpoint on disk
    cache.put(case_key(specs[1]), {"status": "ok", "notes": []})
    assert sorted(reusable(specs, cache)) == [0, 1, 2]
    cache.put(case_key(specs[1]) + "x", {"status": "error", "notes": []})  # failures are not kept
    assert not list(cache.dir.glob("*.tmp")) and len(list(cache.dir.glob("*.json"))) == 3
    assert sorted(reusable(specs, ResultCache(tmp_path, fresh=True))) == []


def test_the_key_holds_the_code_torch_and_the_cpu(tmp_path):
    fp = fingerprint()
    assert set(fp) == {"attnlab", "commit", "torch", "cpu"} and all(fp.values())
    cache = ResultCache(tmp_path)
    cache.put("k", {"status": "ok", "notes": []})
    (entry,) = cache.dir.glob("*.json")
    assert json.loads(entry.read_text())["fingerprint"] == fp
    entry.write_text(entry.read_text()[:10])  # cut off: read as absent, never as a wrong record
    assert cache.get("k") is None
