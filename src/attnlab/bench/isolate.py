"""Running each benchmark case in a fresh process, with a hard timeout and an OOM guard.

A case travels as the runner's *spec* (a dict: suite, name, mask, N, mode, ..., its typed case under ``case``;
:meth:`attnlab.bench.suite.Job.spec`). :class:`Runner`
executes it either in-process (``isolate=False``, for tests and debugging) or in a
child forked from a ``multiprocessing`` fork server that has already imported torch
and attnlab, so a child starts in milliseconds yet shares no allocator state,
thread pool or memory high-water mark with the cases before it. The child caps its
address space (an allocation that would exhaust the machine raises and is recorded as
``oom``); the parent kills a child that runs past the timeout (``timeout``); a child
killed by a signal is recorded as such. The run always continues.

A result is a dict with ``status`` (``ok``, ``unsupported``, ``timeout``, ``oom`` or
``error``), ``reason`` (None when ok) and the figures the suite measured.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback

from .measure import Unsupported, is_oom, limit_address_space

#: imported once by the fork server, so that no child pays for them (autograd's first backward imports
#: ``torch.fx.experimental.symbolic_shapes`` and with it sympy: a second or more per process)
_PRELOAD = ["torch", "torch.fx.experimental.symbolic_shapes", "attnlab", "attnlab.bench.worker"]


def execute(spec: dict) -> dict:
    """Run one case in this process and return its result (never raises)."""
    from .worker import run_case

    t0 = time.perf_counter()
    try:
        res = run_case(spec)
        res.setdefault("status", "ok")
        res.setdefault("reason", None)
    except Unsupported as e:
        res = {"status": "unsupported", "reason": str(e)}
    except Exception as e:  # every failure becomes a recorded outcome
        if is_oom(e):
            res = {"status": "oom", "reason": f"out of memory: {str(e).splitlines()[0][:300]}"}
        else:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            res = {"status": "error", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}{where}"}
    res["wall_s"] = time.perf_counter() - t0
    return res


def _die_with_parent() -> None:
    """Have Linux kill this process when its parent (the fork server) exits.

    The fork server exits when the process that started it dies (a killed ``attnlab bench``, or a
    Ray worker killed with its task), so no case goes on training for a parent that is gone."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        pass


def _child(spec: dict, conn) -> None:
    """Entry point of an isolated child: guard memory, run, send the result back.

    A Ctrl-C reaches the whole process group: the child ignores it and the parent, which
    journals results, stops its children (:meth:`Runner.stop`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if not spec.get("device", "cpu").startswith("cuda"):
        limit_address_space(spec.get("mem_fraction", 0.8))
    try:
        res = execute(spec)
    except BaseException as e:  # report, never hang the parent
        res = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:300]}
    try:
        conn.send(res)
    finally:
        conn.close()


class Runner:
    """Executes case specs, isolated in child processes or in-process.

    Args:
        isolate: run each case in a fresh child process (default) or in this process.
        timeout_s: hard wall-clock limit of one isolated case.
    """

    def __init__(self, isolate: bool = True, timeout_s: float = 120.0):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.isolate = isolate
        self.timeout_s = float(timeout_s)
        self._ctx = None
        self._live: set = set()  # the children running now (lanes run cases side by side)
        self._lock = threading.Lock()
        self.stopped = False
        if isolate:
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            self._ctx = mp.get_context(method)
            if method == "forkserver":
                self._ctx.set_forkserver_preload(_PRELOAD)

    def stop(self) -> None:
        """Kill the children running now and start no more (an interrupted run): their cases get no
        record, so ``--resume`` runs them again."""
        with self._lock:
            self.stopped = True
            for proc in self._live:
                if proc.is_alive():
                    proc.kill()

    def __call__(self, spec: dict) -> dict:
        if not self.isolate:
            return execute(spec)
        return self._isolated(spec)

    def _isolated(self, spec: dict) -> dict:
        ctx = self._ctx
        t0 = time.perf_counter()
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(spec, send), daemon=True)
        with self._lock:
            if self.stopped:
                raise KeyboardInterrupt("the run was interrupted")
            proc.start()
            self._live.add(proc)
        send.close()
        res = None
        limit = float(spec.get("timeout_s") or self.timeout_s)  # a suite may allow its cases longer
        try:
            if recv.poll(limit):
                try:
                    res = recv.recv()
                except (EOFError, OSError):
                    res = None
            else:
                proc.kill()
                res = {"status": "timeout", "reason": f"timeout: exceeded {limit:g} s"}
        finally:
            recv.close()
            proc.join(10)
            if proc.is_alive():  # pragma: no cover - a child that ignores SIGKILL
                proc.kill()
                proc.join(5)
            with self._lock:
                self._live.discard(proc)
        if res is None:
            code = proc.exitcode
            if code is not None and code < 0:
                name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
                status = "oom" if -code == signal.SIGKILL else "error"
                why = "killed by SIGKILL (most likely the kernel's out-of-memory killer)" if status == "oom" else ""
                res = {"status": status, "reason": why or f"error: worker killed by signal {name}"}
            else:
                res = {"status": "error", "reason": f"error: worker exited with code {code} without a result"}
        res.setdefault("wall_s", time.perf_counter() - t0)
        res["isolated"] = True
        return res
