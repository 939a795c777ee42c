"""Running the cases on a Ray cluster (``attnlab bench --executor ray``), when one machine is not enough.

:class:`RayRunner` stands where :class:`~attnlab.bench.isolate.Runner` stands in the runner:
the lanes call it with a case spec and get the case's result. Each case is a Ray task asking
for ``num_cpus`` = its ``threads`` (1 when it sets none); inside the task the case runs as it
would at home, in a child of an :class:`~attnlab.bench.isolate.Runner` (its own process, the
memory cap, the timeout). Only the parent writes the journal and the result files.

No folder is shared between the machines. Paths in a spec are relative to ``spec["out_dir"]``,
and these spec keys say what travels:

* ``artifacts``: folders (relative to ``out_dir``) the case produces. The task runs the case in
  a temporary ``out_dir`` of its own, returns those folders as a tar archive in its result,
  and the parent unpacks them into the real ``out_dir`` (so ``--resume`` and local readers
  find them as a local run leaves them).
* a case that ``needs`` cases with ``artifacts`` receives those folders, packed by the parent
  from its ``out_dir`` (put in Ray's object store once), unpacked into the task's ``out_dir``.
* ``data_files`` (name -> path on this machine): the files travel the same way, once each.
* ``group``: cases of one group run on one node, in a placement group of ``STRICT_PACK``
  bundles of ``threads`` CPUs each (as many as the largest node holds, at most one per case
  of the group), so the ratios computed within a group compare like with like. The group's
  placement group is removed once its last case is recorded. Every result carries the
  ``node`` it ran on.

A case whose worker died (the node was lost, or someone killed the process) is ``lost``: not
a result, so the runner does not journal it and ``--resume`` runs it again. Ctrl-C cancels the
tasks in flight (``ray.cancel(force=True)``).

Ray is an optional extra (``pip install 'attnlab[ray]'``), imported only when a runner is made.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import threading
import weakref
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from .isolate import Runner

#: the install line of the extra
PIP = "pip install 'attnlab[ray]'"

__all__ = ["PIP", "RayRunner", "node_name", "pack", "require_ray", "run_remote", "unpack"]


def require_ray() -> ModuleType:
    """Import ray, or raise ImportError naming the pip line that installs it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"executor 'ray' needs the ray package, which is not installed: {PIP}") from e
    return ray


def pack(root: str, folders: Iterable[str]) -> bytes:
    """The ``folders`` (relative to ``root``; missing ones are left out) as one gzipped tar archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in folders:
            path = os.path.join(root, rel)
            if os.path.exists(path):
                tar.add(path, arcname=os.path.normpath(rel))
    return buf.getvalue()


def unpack(blob: bytes, root: str) -> list[str]:
    """Unpack an archive of :func:`pack` under ``root``, each of its top folders replacing what was there.

    Returns the folders written (relative to ``root``). Members that would land outside
    ``root`` (absolute paths, ``..``, links out) are refused with a ValueError.
    """
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        members = tar.getmembers()
        tops = sorted({m.name.split("/", 1)[0] for m in members if m.name not in ("", ".")})
        for m in members:
            if os.path.isabs(m.name) or ".." in m.name.split("/") or m.issym() or m.islnk():
                raise ValueError(f"archive member {m.name!r} would land outside {root!r}")
        for top in tops:
            shutil.rmtree(os.path.join(root, top), ignore_errors=True)
        os.makedirs(root, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, filter="data")
        else:  # pragma: no cover - Python before 3.10.12 / 3.11.4: the members were checked above
            tar.extractall(root)
    return tops


def node_name() -> str:
    """This machine as the records name it: its host name and, inside a Ray worker, the node's IP."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")  # a Ray worker has imported it; nothing else should import it for this
    if ray is not None and ray.is_initialized():
        return f"{host} ({ray.util.get_node_ip_address()})"
    return host


def run_remote(spec: dict, inputs: bytes | None = None, files: dict[str, tuple[str, bytes]] | None = None,
               isolate: bool = True, timeout_s: float = 120.0) -> dict:
    """What one Ray task does: run ``spec`` in a temporary ``out_dir`` and return its result.

    Args:
        spec: the case spec (its ``out_dir`` is replaced by the temporary folder).
        inputs: an archive of :func:`pack` unpacked into that folder first (the needed cases' artifacts).
        files: ``spec["data_files"]``'s contents, name -> (file name, bytes); written there and pointed to.
        isolate, timeout_s: as :class:`~attnlab.bench.isolate.Runner`'s (the case runs in its own child).

    Returns:
        The case's result, with ``node`` and, when the case is ``ok`` and names ``artifacts``,
        ``artifacts_blob`` (those folders, packed).
    """
    with tempfile.TemporaryDirectory(prefix="attnlab-ray-") as tmp:
        if inputs:
            unpack(inputs, tmp)
        local = {**spec, "out_dir": tmp}
        if files:
            local["data_files"] = {}
            for name, (base, data) in files.items():
                folder = os.path.join(tmp, ".data", name)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, base), "wb") as f:
                    f.write(data)
                local["data_files"][name] = os.path.join(folder, base)
        res = Runner(isolate=isolate, timeout_s=timeout_s)(local)
        if res.get("status") == "ok" and spec.get("artifacts"):
            res["artifacts_blob"] = pack(tmp, spec["artifacts"])
    res["node"] = node_name()
    return res


_REMOTE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _remote_case(ray: ModuleType):
    """The Ray remote function of a case (made once per ray module; its process title is ``ray::attnlab_case``)."""
    if ray not in _REMOTE:
        def attnlab_case(spec, inputs, files, isolate, timeout_s):
            return run_remote(spec, inputs, files, isolate, timeout_s)

        # no retries: a case's figures come from one uninterrupted run; a lost one is rerun by --resume
        _REMOTE[ray] = ray.remote(max_retries=0)(attnlab_case)
    return _REMOTE[ray]


class RayRunner:
    """Executes case specs as Ray tasks (see the module docstring); called by the runner's lanes.

    Args:
        address: the cluster's address (``HEAD:PORT``); None: ``$RAY_ADDRESS``, else a cluster
            started on this machine, else a new local one. Ignored when ray is already initialized.
        isolate: run each case in a child process inside its task (else in the Ray worker itself).
        timeout_s: hard wall-clock limit of one case (a spec's ``timeout_s`` may allow longer).

    Raises:
        ImportError: ray is not installed (naming ``pip install 'attnlab[ray]'``).
    """

    def __init__(self, address: str | None = None, isolate: bool = True, timeout_s: float = 120.0):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.ray = require_ray()
        self.isolate, self.timeout_s = isolate, float(timeout_s)
        self.started = not self.ray.is_initialized()
        if self.started:
            self.ray.init(address=address, log_to_driver=False)
        self.stopped = False
        self.lanes = 1
        self._lock = threading.Lock()
        self._live: set = set()
        self._by_id: dict[str, dict] = {}
        self._left: dict[str, int] = {}  # group -> cases not recorded yet
        self._cpus: dict[str, int] = {}  # group -> CPUs of one bundle (the most threads of its cases)
        self._groups: dict[str, Any] = {}  # group -> its placement group
        self._refs: dict[tuple, Any] = {}  # what was put in the object store once: inputs, data files

    # -- what the runner tells it --------------------------------------------------------------------

    def plan(self, specs: list[dict]) -> None:
        """The run's specs: their groups (sizes, CPUs per case) and ids, and one lane per spec (Ray queues them)."""
        self._by_id = {s["id"]: s for s in specs if s.get("id")}
        for s in specs:
            if s.get("group") is not None:
                g = str(s["group"])
                self._left[g] = self._left.get(g, 0) + 1
                self._cpus[g] = max(self._cpus.get(g, 1), _threads(s))
        # a lane only waits on its task: with one per spec no case waits for a lane held by a case that waits for
        # a placement group
        self.lanes = max(1, len(specs))

    def finished(self, spec: dict) -> None:
        """``spec`` is recorded: remove its group's placement group once that was the group's last case."""
        g = spec.get("group")
        if g is None:
            return
        with self._lock:
            self._left[str(g)] = self._left.get(str(g), 1) - 1
            pg = self._groups.pop(str(g), None) if self._left[str(g)] <= 0 else None
        if pg is not None:
            self.ray.util.remove_placement_group(pg)

    def stop(self) -> None:
        """Cancel the tasks in flight (their workers are killed) and start no more: ``--resume`` runs them again."""
        with self._lock:
            self.stopped = True
            live = list(self._live)
        for ref in live:
            self.ray.cancel(ref, force=True)

    def close(self) -> None:
        """Remove the placement groups left, and shut Ray down if this runner started it."""
        with self._lock:
            groups, self._groups = list(self._groups.values()), {}
        for pg in groups:
            self.ray.util.remove_placement_group(pg)
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()

    # -- running one case ----------------------------------------------------------------------------

    def __call__(self, spec: dict) -> dict:
        ray = self.ray
        threads = _threads(spec)
        options: dict[str, Any] = {"num_cpus": threads}
        if spec.get("group") is not None:
            pg = self._group(str(spec["group"]))
            if isinstance(pg, dict):
                return pg  # the group cannot be placed: why
            options["scheduling_strategy"] = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=-1)
        args = ({**spec, "threads": threads}, self._inputs(spec), self._files(spec), self.isolate, self.timeout_s)
        with self._lock:
            if self.stopped:
                raise KeyboardInterrupt("the run was interrupted")
            ref = _remote_case(ray).options(**options).remote(*args)
            self._live.add(ref)
        try:
            res = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            res = {"status": "error", "reason": "cancelled (the run was interrupted)"}
        except ray.exceptions.OutOfMemoryError as e:  # Ray's memory monitor killed it: the case's own doing
            res = {"status": "oom", "reason": f"out of memory: Ray killed the worker ({_first_line(e)})"}
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError, ray.exceptions.LocalRayletDiedError) as e:
            res = {"status": "error", "lost": True,
                   "reason": f"lost: the Ray worker running it died ({type(e).__name__}); --resume runs it again"}
        except ray.exceptions.RayError as e:  # pragma: no cover - run_remote never raises; Ray itself failed
            res = {"status": "error", "reason": f"{type(e).__name__}: {_first_line(e)}"}
        finally:
            with self._lock:
                self._live.discard(ref)
        blob = res.pop("artifacts_blob", None)
        if blob:
            unpack(blob, spec["out_dir"])
        return res

    def _group(self, group: str) -> Any:
        """The placement group of ``group`` (made on its first case), or the error result when no node can hold it."""
        with self._lock:
            if group in self._groups:
                return self._groups[group]
            cpus = self._cpus.get(group, 1)
            largest = max((int(n["Resources"].get("CPU", 0)) for n in self.ray.nodes() if n.get("Alive")), default=0)
            if largest < cpus:
                return {"status": "error", "reason": f"its group {group} needs {cpus} CPUs on one node (threads), "
                                                     f"and the cluster's largest node has {largest}"}
            bundles = max(1, min(self._left.get(group, 1), largest // cpus))
            pg = self.ray.util.placement_group([{"CPU": cpus}] * bundles, strategy="STRICT_PACK",
                                               name=f"attnlab {group}")
            self._groups[group] = pg
            return pg

    def _inputs(self, spec: dict) -> Any:
        """The artifacts of the cases ``spec`` needs, packed from this machine's ``out_dir`` (an object ref; None: none)."""
        folders = tuple(a for need in spec.get("needs") or [] for a in self._by_id.get(need, {}).get("artifacts") or [])
        if not folders:
            return None
        key = ("inputs", spec["out_dir"], folders)
        with self._lock:
            if key not in self._refs:
                self._refs[key] = self.ray.put(pack(spec["out_dir"], folders))
            return self._refs[key]

    def _files(self, spec: dict) -> Any:
        """``spec["data_files"]``'s contents in the object store (an object ref; None: none)."""
        files = spec.get("data_files") or {}
        if not files:
            return None
        key = ("files", *sorted(files.items()))
        with self._lock:
            if key not in self._refs:
                blobs = {}
                for name, path in files.items():
                    with open(path, "rb") as f:
                        blobs[name] = (os.path.basename(path), f.read())
                self._refs[key] = self.ray.put(blobs)
            return self._refs[key]


def _threads(spec: dict) -> int:
    return int(spec.get("threads") or 1)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
