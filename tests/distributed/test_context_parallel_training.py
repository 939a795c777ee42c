"""Training with every sequence sharded (``--context-parallel``) takes the single-process steps.

``torchrun --nproc_per_node=2 -m attnlab.train.cli train chars --context-parallel 2`` on the
CPU (gloo): the loss at every step equals the one-process run's within 1e-4, the checkpoint
holds the same weights (so a run resumes on another world size: here on one process), and
with 4 processes the mesh is 2 data-parallel groups x 2 context ranks. Also: a
``MultiHeadAttention`` with a sequence-parallel setting (rotary at global positions)
equals the plain layer on the full sequence.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_harness import run_ranks, shard

from attnlab import masks
from attnlab.distributed import SequenceParallel, sequence_parallel
from attnlab.layers import MultiHeadAttention
from attnlab.positional import RotaryEmbedding
from attnlab.train import RunSpec, read_metrics, train

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(text: Path, model: str, steps: int) -> list[str]:
    return ["train", "chars", "--data", str(text), "--task-opt", "context=23", "--model", model, "--steps", str(steps),
            "--batch-size", "4", "--warmup", "2", "--precision", "fp32", "--log-every", "1", "--quiet",
            "--threads", "1", "--eval-batches", "1", "--device", "cpu"]


def _torchrun(nproc: int, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "attnlab.train.cli", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _single(tmp_path: Path, text: Path, model: dict, steps: int):
    spec = RunSpec(task="chars", data=str(text), task_options={"context": 23}, model=model,
                   train=dict(steps=steps, batch_size=4, warmup=2, precision="fp32", log_every=1, progress=False,
                              threads=1, eval_batches=1, device="cpu"))
    return train(spec, tmp_path / "one", quiet=True)


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"}


def _text(tmp_path: Path) -> Path:
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. " * 40)
    return text


def _same_losses(got: dict[int, float], want: dict[int, float], steps) -> None:
    assert sorted(got) == list(steps)
    torch.testing.assert_close(torch.tensor([got[s] for s in steps]), torch.tensor([want[s] for s in steps]),
                               rtol=0, atol=1e-4)


def test_two_context_ranks_train_like_one_process_and_resume_on_one(tmp_path):
    text = _text(tmp_path)
    model = "dim=32,heads=2,layers=2,ff_dim=64,positional=rotary"
    _torchrun(2, [*_args(text, model, 6), "--context-parallel", "2", "--out", str(tmp_path / "cp"),
                  "--save-every", "4", "--keep-checkpoints", "0"])
    single = _single(tmp_path, text, {"dim": 32, "heads": 2, "layers": 2, "ff_dim": 64, "positional": "rotary"}, 6)
    _same_losses(_losses(tmp_path / "cp"), single.losses, range(1, 7))
    # resume the two-process run's step-4 checkpoint on one process: steps 5 and 6 are the single run's again
    shutil.rmtree(tmp_path / "cp" / "checkpoints" / "step_00000006")
    _torchrun(1, [*_args(text, model, 6), "--out", str(tmp_path / "cp"), "--resume"])
    _same_losses(_losses(tmp_path / "cp"), single.losses, range(1, 7))


@pytest.mark.slow
@pytest.mark.parametrize("strategy,model,nproc", [
    ("ring", "dim=32,heads=2,layers=2,ff_dim=64", 2),  # the task's own learned absolute positions
    ("ulysses", "dim=32,heads=2,layers=2,ff_dim=64,positional=alibi", 2),
    ("ring", "dim=32,heads=2,layers=2,ff_dim=64,positional=t5", 4),  # 2 data-parallel groups x 2 context ranks
])
def test_fifty_steps_match_the_single_process_loss_curve(tmp_path, strategy, model, nproc):
    text = _text(tmp_path)
    _torchrun(nproc, [*_args(text, model, 50), "--context-parallel", "2", "--context-strategy", strategy,
                      "--out", str(tmp_path / "cp")])
    settings = dict(kv.split("=") for kv in model.split(","))
    settings = {k: (int(v) if v.isdigit() else v) for k, v in settings.items()}
    single = _single(tmp_path, text, settings, 50)
    _same_losses(_losses(tmp_path / "cp"), single.losses, range(1, 51))
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "cp" / "checkpoints" / "step_00000050" / "model.safetensors"))
    for name, p in single.model.state_dict().items():
        if name.endswith("k_proj.bias"):  # zero up to rounding noise, which Adam turns into lr-sized steps
            continue
        torch.testing.assert_close(weights[name], p, rtol=1e-3, atol=1e-4, msg=name)


def _layer(rank, world):
    torch.manual_seed(0)
    for strategy in ("ring", "ulysses"):
        layer = MultiHeadAttention(32, 4, kv_heads=2, positional=RotaryEmbedding(8))
        x = torch.randn(2, 29, 32, requires_grad=True)
        dy = torch.randn(2, 29, 32)
        want = layer(x, mask=masks.causal())
        want_grads = torch.autograd.grad(want, [x, *layer.parameters()], dy)
        xl = shard(x.detach(), rank, world, "zigzag", dim=1).requires_grad_()
        with sequence_parallel(layer, SequenceParallel(strategy=strategy)):
            got = layer(xl, mask=masks.causal())
        grads = torch.autograd.grad(got, [xl, *layer.parameters()], shard(dy, rank, world, "zigzag", dim=1))
        torch.testing.assert_close(got, shard(want.detach(), rank, world, "zigzag", dim=1), atol=1e-5, rtol=0)
        torch.testing.assert_close(grads[0], shard(want_grads[0], rank, world, "zigzag", dim=1), atol=5e-5, rtol=0)
        for g, w in zip(grads[1:], want_grads[1:]):  # each rank's share of a parameter's gradient
            g = g.clone()
            torch.distributed.all_reduce(g)
            torch.testing.assert_close(g, w, atol=5e-5, rtol=1e-5)
        assert layer.sequence_parallel is None  # the setting holds only inside the block


def test_multihead_attention_with_a_sequence_parallel_setting():
    run_ranks(_layer, 2)
