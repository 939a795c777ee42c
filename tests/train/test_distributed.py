"""Data parallelism: ``torchrun --nproc_per_node=2`` on the CPU (gloo) takes the same steps as one
process with the same global batch (same losses, same final weights to float tolerance), and
only rank 0 writes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from attnlab.train import RunSpec, read_metrics, train

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["train", "copy", "--task-opt", "length=5", "--model", "dim=32,heads=2,layers=1,ff_dim=64",
        "--steps", "6", "--batch-size", "8", "--warmup", "2", "--precision", "fp32", "--log-every", "1",
        "--quiet", "--threads", "1", "--eval-batches", "1"]


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
                              threads=1, eval_batches=1))
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
