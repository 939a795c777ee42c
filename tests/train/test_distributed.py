"""Data parallelism: ``torchrun --nproc_per_node=2`` on the CPU (gloo) takes the same steps as one
process with the same global batch (same losses, same final weights to float tolerance), and
only rank 0 writes. Every run here is pinned to ``--device cpu``: on a machine with one GPU,
``auto`` would hand the ranks different devices. Also: ``--device auto`` falls back to the CPU
when a machine has fewer GPUs than ranks, the process-group timeout, and each rank's own RNG
states surviving a checkpoint round trip over gloo."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.train import RunSpec, read_metrics, train

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["train", "copy", "--task-opt", "length=5", "--model", "dim=32,heads=2,layers=1,ff_dim=64",
        "--steps", "6", "--batch-size", "8", "--warmup", "2", "--precision", "fp32", "--log-every", "1",
        "--quiet", "--threads", "1", "--eval-batches", "1", "--device", "cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_equals_one_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "attnlab.train.cli", *ARGS, "--out", str(tmp_path / "ddp")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = RunSpec(task="copy", task_options={"length": 5}, model={"dim": 32, "heads": 2, "layers": 1, "ff_dim": 64},
                   train=dict(steps=6, batch_size=8, warmup=2, precision="fp32", log_every=1, progress=False,
                              threads=1, eval_batches=1, device="cpu"))
    single = train(spec, tmp_path / "one", quiet=True)
    ddp_losses = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "ddp" / "metrics.jsonl") if r["split"] == "train"}
    assert sorted(ddp_losses) == list(range(1, 7))
    torch.testing.assert_close(torch.tensor([ddp_losses[s] for s in range(1, 7)]),
                               torch.tensor([single.losses[s] for s in range(1, 7)]), rtol=1e-5, atol=1e-6)
    from safetensors.torch import load_file

    ddp_w = load_file(str(tmp_path / "ddp" / "checkpoints" / "step_00000006" / "model.safetensors"))
    for name, p in single.model.state_dict().items():
        if name.endswith("k_proj.bias"):
            # softmax ignores a shift shared by all keys, so this gradient is zero up to rounding
            # noise (~1e-9) which Adam's normalization turns into lr-sized steps of random sign
            continue
        torch.testing.assert_close(ddp_w[name], p, rtol=1e-4, atol=1e-5, msg=name)
    run = (tmp_path / "ddp" / "run.json").read_text()
    assert '"world_size": 2' in run
    # only rank 0 wrote: one checkpoint directory per step, no stray temp dirs
    assert sorted(p.name for p in (tmp_path / "ddp" / "checkpoints").iterdir()) == ["step_00000006"]


# -- device, timeout ------------------------------------------------------------------
def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_auto_device_falls_back_to_cpu_without_a_gpu_per_rank(monkeypatch):
    from attnlab.train.distributed import resolve_device

    _gpus(monkeypatch, 1)
    assert resolve_device("auto", 0, 1) == torch.device("cuda", 0)
    assert resolve_device("auto", 1, 2) == torch.device("cpu")  # rank 1 of 2 on a 1-GPU machine
    assert resolve_device("auto", 0, 2) == torch.device("cpu")  # and rank 0 agrees (gloo for both)
    _gpus(monkeypatch, 2)
    assert resolve_device("auto", 1, 2) == torch.device("cuda", 1)
    _gpus(monkeypatch, 0)
    assert resolve_device("auto", 0, 1) == torch.device("cpu")


def test_explicit_cuda_without_that_device_fails_clearly(monkeypatch):
    from attnlab.train.distributed import resolve_device

    _gpus(monkeypatch, 1)
    with pytest.raises(ValueError, match=r"'cuda:1' does not exist.*1 CUDA device"):
        resolve_device("cuda", 1, 2)
    _gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda", 0, 1)


def test_process_group_timeout(monkeypatch):
    import datetime

    import torch.distributed as dist

    from attnlab.train import distributed as du

    monkeypatch.delenv("ATTNLAB_DIST_TIMEOUT", raising=False)
    assert du.resolve_timeout() == datetime.timedelta(hours=2)
    assert du.resolve_timeout(90) == datetime.timedelta(seconds=90)
    monkeypatch.setenv("ATTNLAB_DIST_TIMEOUT", "600")
    assert du.resolve_timeout() == datetime.timedelta(minutes=10)
    with pytest.raises(ValueError, match="positive"):
        du.resolve_timeout(0)
    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: seen.update(kw))
    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    info = du.setup("cpu", timeout=7200)
    assert seen == {"backend": "gloo", "timeout": datetime.timedelta(hours=2)} and info.rank == 1


# -- each rank's RNG through a checkpoint -----------------------------------------------
def _rng_rank(rank: int, port: int, folder: str) -> None:
    import json
    import random

    import numpy as np
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file

    from attnlab.train.checkpoint import capture_rank_rng, restore_rank_rng
    from attnlab.train.distributed import DistInfo, barrier

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    info = DistInfo(rank=rank, world=2, local_rank=rank, backend="gloo")
    torch.manual_seed(100 + rank)
    random.seed(200 + rank)
    np.random.seed(300 + rank)
    tensors, meta = capture_rank_rng(info)
    if rank == 0:  # what the trainer's checkpoint does: rank 0 writes everything
        save_file({k: v.contiguous() for k, v in tensors.items()}, f"{folder}/rng.safetensors")
        Path(folder, "rng.json").write_text(json.dumps(meta))
    want = [torch.rand(4).tolist(), random.random(), float(np.random.rand())]
    torch.rand(9), random.random(), np.random.rand()  # move on, as training would
    barrier(info)
    restore_rank_rng(load_file(f"{folder}/rng.safetensors"), json.loads(Path(folder, "rng.json").read_text()), info)
    got = [torch.rand(4).tolist(), random.random(), float(np.random.rand())]
    Path(folder, f"rank{rank}.json").write_text(json.dumps({"want": want, "got": got}))
    dist.destroy_process_group()


def test_each_rank_restores_its_own_rng_states(tmp_path):
    import json

    import torch.multiprocessing as mp

    mp.start_processes(_rng_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in res:
        assert r["got"] == r["want"]
    assert res[0]["want"] != res[1]["want"]  # the ranks' streams differ, and each got its own back
