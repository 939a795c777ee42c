"""The moving-digits table: accuracy, time per training step and memory of each attention variant.

    # 1. train every variant at both sizes (each an ordinary `attnlab train` run):
    .venv/bin/python scripts/moving_digits_table.py --train --runs /tmp/moving-digits
    # 2. time and memory of a training step of every variant, then the table from the runs:
    .venv/bin/python scripts/moving_digits_table.py --runs /tmp/moving-digits

``--train`` runs, for T in (8, 16) and attention in (joint, divided, space, axial),
``attnlab train moving-digits --task-opt frames=T --model attention=A --steps S --threads 1
--out RUNS/T{T}-{A}`` one after the other (``--print-commands`` lists them instead). The table
reads each run's final test accuracy (and the accuracy with the frames shuffled) from its
``metrics.jsonl``; the time per step is the median of training steps (forward, backward,
AdamW) of the task's model at the task's batch size, the variants' steps alternated in one
process so that a load change hits all of them; the memory is the peak of one such step
beyond what was held before it, in a fresh process per variant after a first step
(``attnlab.bench.measure.peak_memory``, glibc returning freed blocks). Every figure printed
is measured by this run or read from the runs it names.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

VARIANTS = ("joint", "divided", "space", "axial")
SIZES = (8, 16)


def train_command(frames: int, attention: str, runs: Path, steps: int) -> list[str]:
    exe = str(Path(sys.executable).with_name("attnlab"))
    return [exe, "train", "moving-digits", "--task-opt", f"frames={frames}", "--model", f"attention={attention}",
            "--steps", str(steps), "--threads", "1", "--out", str(runs / f"T{frames}-{attention}")]


def final_test(run: Path) -> dict | None:
    """The final test record of a run directory, or None when it has none (yet)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    finals = [r for r in rows if r.get("split") == "test" and r.get("final")]
    return finals[-1] if finals else None


def training_step(frames: int, attention: str, batch_size: int):
    """One training step (forward, backward, AdamW) of the task's model, after a first one (the optimizer's state)."""
    from attnlab.tasks import create_task
    from attnlab.train.trainer import build_model

    task = create_task("moving-digits", frames=frames, val_size=8, test_size=8)
    task.ensure_setup()
    batch = task.train_batch(0, batch_size)
    torch.manual_seed(0)
    model = build_model(task, {"attention": attention}).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        loss, _ = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    return step


def memory_of(frames: int, attention: str, batch_size: int) -> None:
    """Print the peak bytes of one training step (run in a fresh process, glibc returning freed blocks)."""
    from attnlab.bench.measure import honest_malloc, peak_memory

    honest_malloc()
    step = training_step(frames, attention, batch_size)
    _, peak, method = peak_memory(step, "cpu")
    print(json.dumps({"peak": peak, "method": method}))


def step_costs(frames: int, repeats: int, batch_size: int, threads: int) -> dict[str, tuple[float, int | None]]:
    """``variant -> (median seconds per training step, peak bytes of one step)`` at ``frames``."""
    steps = {attention: training_step(frames, attention, batch_size) for attention in VARIANTS}
    times: dict[str, list[float]] = {a: [] for a in VARIANTS}
    for _ in range(repeats):
        for attention, step in steps.items():
            t = time.perf_counter()
            step()
            times[attention].append(time.perf_counter() - t)
    out = {}
    for attention in VARIANTS:
        res = subprocess.run([sys.executable, __file__, "--memory-of", str(frames), attention, "--batch-size",
                              str(batch_size), "--threads", str(threads)], check=True, capture_output=True, text=True)
        out[attention] = (statistics.median(times[attention]), json.loads(res.stdout.strip().splitlines()[-1])["peak"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="/tmp/moving-digits", help="folder of the training runs")
    ap.add_argument("--train", action="store_true", help="run the trainings (one after the other)")
    ap.add_argument("--print-commands", action="store_true", help="print the training commands and stop")
    ap.add_argument("--steps", type=int, default=2000, help="training steps of every run (the task's default)")
    ap.add_argument("--repeats", type=int, default=5, help="timed training steps per variant")
    ap.add_argument("--batch-size", type=int, default=32, help="batch of the timed steps (the task's default)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the timed steps")
    ap.add_argument("--memory-of", nargs=2, default=None, help=argparse.SUPPRESS)  # FRAMES ATTENTION (a subprocess)
    args = ap.parse_args()
    if args.memory_of:
        torch.set_num_threads(args.threads)
        memory_of(int(args.memory_of[0]), args.memory_of[1], args.batch_size)
        return
    runs = Path(args.runs)
    commands = [train_command(f, a, runs, args.steps) for f in SIZES for a in VARIANTS]
    if args.print_commands or args.train:
        for cmd in commands:
            print(" ".join(cmd), flush=True)
            if args.train:
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        if args.print_commands:
            return
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch {args.batch_size}, runs in {runs}")
    print()
    print("| frames | attention | test accuracy | accuracy, frames shuffled | ms / training step | "
          "step time / joint's | peak MiB of a step |")
    print("|---|---|---|---|---|---|---|")
    for frames in SIZES:
        costs = step_costs(frames, args.repeats, args.batch_size, args.threads)
        for attention in VARIANTS:
            rec = final_test(runs / f"T{frames}-{attention}")
            acc = f"{100 * rec['accuracy']:.1f} %" if rec else "(no run)"
            shuf = f"{100 * rec['accuracy_frames_shuffled']:.1f} %" if rec and "accuracy_frames_shuffled" in rec else "-"
            sec, peak = costs[attention]
            mem = f"{peak / 2**20:,.0f}" if peak is not None else "-"
            print(f"| {frames} | {attention} | {acc} | {shuf} | {sec * 1e3:,.0f} | "
                  f"{sec / costs['joint'][0]:.2f} | {mem} |", flush=True)


if __name__ == "__main__":
    main()
