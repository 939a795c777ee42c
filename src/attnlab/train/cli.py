"""``attnlab train | generate | translate | evaluate``: thin skins over :mod:`attnlab.train`.

``attnlab train TASK`` builds a :class:`~attnlab.train.RunSpec` from (in increasing
priority) the task's defaults, ``--config file.json`` and the flags, then calls
:func:`~attnlab.train.train`. The other three load a checkpoint (or a run directory's
latest) with :func:`~attnlab.train.load_run` and call the task.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..command import run_command

__all__ = ["add_train_parsers", "parse_kv", "parse_attention", "spec_from_args"]

#: train flags that map one-to-one onto TrainConfig fields (flag dest == field name)
_TRAIN_FLAGS = ("steps", "time_budget", "batch_size", "lr", "min_lr", "schedule", "warmup", "decay_steps", "weight_decay",
                "optimizer", "early_stopping_patience", "grad_clip", "label_smoothing", "init", "embed_std", "precision", "device", "dist_timeout", "eval_every", "eval_batches",
                "save_every", "keep_checkpoints", "log_every", "seed", "threads", "context_parallel",
                "context_strategy", "curriculum", "init_from")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_kv(text: str, what: str) -> dict[str, Any]:
    """``"dim=128,layers=4"`` -> ``{"dim": 128, "layers": 4}`` (values parsed as JSON when they can be)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, val = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} must be key=value pairs separated by commas, got {part!r} in {text!r}")
        out[key.strip()] = _value(val.strip())
    return out


def parse_attention(text: str) -> dict[str, Any]:
    """``"performer:features=64"`` -> ``{"mechanism": "performer", "mechanism_settings": {"features": 64}}``."""
    name, _, rest = text.partition(":")
    if not name:
        raise ValueError(f"--attention must be MECHANISM[:k=v,...], got {text!r}")
    return {"mechanism": name, "mechanism_settings": parse_kv(rest, "--attention settings")}


def spec_from_args(args: argparse.Namespace):
    """The :class:`~attnlab.train.RunSpec` that ``attnlab train`` flags describe."""
    from .config import RunSpec

    base: dict[str, Any] = {"task": args.task}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise ValueError(f"--config must name a JSON file, not found: {str(path)!r}")
        loaded = json.loads(path.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {path} must hold a JSON object with task/data/task_options/model/train")
        base.update({k: v for k, v in loaded.items() if k != "task"})
        if loaded.get("task", args.task) != args.task:
            raise ValueError(f"--config {path} is for task {loaded['task']!r}, not {args.task!r}")
    spec = RunSpec.from_dict(base)
    if args.data is not None:
        spec.data = args.data
    for text in args.task_opt or []:
        spec.task_options.update(parse_kv(text, "--task-opt"))
    for text in args.model or []:
        spec.model.update(parse_kv(text, "--model"))
    if args.attention:
        spec.model.update(parse_attention(args.attention))
    if args.positional:
        spec.model["positional"] = args.positional
    if args.dropout is not None:
        spec.model["dropout"] = args.dropout
    if args.checkpointing:
        spec.model["checkpointing"] = True
    for name in _TRAIN_FLAGS:
        value = getattr(args, name)
        if value is not None:
            spec.train[name] = value
    if args.attn_penalty:
        kind, _, weight = args.attn_penalty.partition(":")
        spec.train["attn_penalty"] = kind
        try:
            spec.train["attn_penalty_weight"] = float(weight) if weight else 0.01
        except ValueError:
            raise ValueError(f"--attn-penalty must be entropy[:WEIGHT] or l2[:WEIGHT], got {args.attn_penalty!r}") from None
    if args.tensorboard:
        spec.train["tensorboard"] = True
    if args.quiet:
        spec.train["progress"] = False
    return spec


def _train(args: argparse.Namespace) -> int:
    from .trainer import train

    spec = spec_from_args(args)
    out = args.out or str(Path("runs") / args.task)
    if args.seeds is not None:
        if args.resume:
            raise ValueError("--seeds runs fresh seeds; it does not combine with --resume")
        from .seeds import format_summary, train_seeds

        many = train_seeds(spec, out, args.seeds, quiet=args.quiet)
        print(json.dumps(many.to_dict(), indent=2))
        for line in format_summary(many):
            print(line, file=sys.stderr)
        return 0
    result = train(spec, out, resume=args.resume, quiet=args.quiet)
    if result.checkpoint is not None:
        print(json.dumps({"step": result.step, "seconds": round(result.seconds, 2), "metrics": result.metrics,
                          "checkpoint": str(result.checkpoint)}, indent=2))
    return 0


def _generate(args: argparse.Namespace) -> int:
    import torch

    from .trainer import load_run

    task, model, _ = load_run(args.checkpoint)
    if not hasattr(task, "encode_prompt"):
        raise ValueError(f"generate needs a text language-model checkpoint (task 'chars'), got task {task.name!r}")
    ids = task.encode_prompt(args.prompt)
    if not ids:
        raise ValueError("--prompt must hold at least one character")
    prompt = torch.tensor([ids] * args.num_samples)
    ctx = model.config.max_len
    out_ids = prompt
    with torch.no_grad():  # slide the window when the text outgrows the learned positions
        remaining, seed = args.max_new_tokens, args.seed
        while remaining > 0:
            window = out_ids[:, -ctx + 1:] if out_ids.shape[1] >= ctx else out_ids
            n = min(remaining, ctx - window.shape[1])
            gen = model.generate(window, n, do_sample=not args.greedy, temperature=args.temperature,
                                 top_k=args.top_k, top_p=args.top_p, seed=seed)
            out_ids = torch.cat([out_ids, gen[:, window.shape[1]:]], dim=1)
            remaining -= n
            seed += 1
    for i, row in enumerate(out_ids.tolist()):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        print(task.decode(row))
    return 0


def _translate(args: argparse.Namespace) -> int:
    from .trainer import load_run

    sentences = list(args.sentences)
    if sentences == ["-"]:
        sentences = [s for s in sys.stdin.read().split("\n") if s.strip()]
    if args.alignment and len(sentences) != 1:
        raise ValueError(f"--alignment draws one sentence's map; got {len(sentences)} sentences")
    task, model, _ = load_run(args.checkpoint)
    if not hasattr(task, "translate"):
        raise ValueError(f"translate needs a translation checkpoint, got task {task.name!r}")
    if args.alignment:
        draw = getattr(args, "draw_map", None)
        if draw is None:
            raise ValueError("--alignment draws with attnlab.viz, which this entry does not load: run "
                             "`attnlab translate CHECKPOINT SENTENCE --alignment FILE.png`")
        weights, src_toks, tgt_toks, text = task.alignment(model, sentences[0], beams=args.beams)
        print(text)
        draw(weights, tgt_toks, key_tokens=src_toks, path=args.alignment,
                       title="Cross-attention, last decoder layer (mean over heads)")
        print(f"wrote {args.alignment}", file=sys.stderr)
        return 0
    for line in task.translate(model, sentences, beams=args.beams):
        print(line)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .trainer import load_run

    task, model, state = load_run(args.checkpoint, data=args.data, need_data=True)
    split = args.split or task.eval_splits[-1]
    metrics = task.evaluate(model, split, batch_size=args.batch_size, final=True)
    print(json.dumps({"checkpoint": state["path"], "step": state["step"], "task": task.name, "split": split,
                      **metrics}, indent=2))
    return 0


def add_train_parsers(subparsers, draw_map: Callable[..., Any] | None = None) -> None:
    """Register ``train``, ``generate``, ``translate`` and ``evaluate`` on an argparse subparsers object.

    ``draw_map`` draws ``translate --alignment``'s heat map (``attnlab.viz.plot_attention``, which
    the ``attnlab`` command passes: the train layer does not import viz, which sits above it).
    """
    _add_train(subparsers)
    _add_checkpoint_commands(subparsers, draw_map)


def _add_train(subparsers) -> None:
    from ..tasks import tasks

    p = subparsers.add_parser("train", help="train a model on a task (copy, chars, translation, ...)",
                              description="Train a model on a task; every option has a default.")
    p.add_argument("task", choices=sorted(tasks()), help="the task")
    p.add_argument("--data", default=None, help="data file or directory for tasks that read files")
    p.add_argument("--task-opt", action="append", metavar="K=V,...", help="task options (e.g. context=64)")
    p.add_argument("--model", action="append", metavar="K=V,...",
                   help="model config fields (e.g. dim=128,heads=4,layers=4)")
    p.add_argument("--attention", metavar="MECHANISM[:K=V,...]", help="attention mechanism (default exact)")
    p.add_argument("--positional", help="positional encoding (sinusoidal, learned, rotary, alibi, t5, none)")
    p.add_argument("--dropout", type=float, help="dropout on embeddings and residual branches")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing (recompute in backward)")
    p.add_argument("--config", help="JSON file with task/data/task_options/model/train (flags override it)")
    p.add_argument("--out", help="run directory (default runs/TASK)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    _add_trainer_settings(p)
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_train)


def _add_trainer_settings(p) -> None:
    """The flags that set :class:`~attnlab.train.TrainConfig` fields."""
    from .config import INITS, OPTIMIZERS, PRECISIONS, parse_duration
    from .schedule import SCHEDULES

    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--curriculum", metavar="LEN:STEPS[:BATCH],...",
                   help="a length curriculum: phases at increasing sequence lengths, e.g. 64:200,512:100:16 "
                        "(the steps are their total; the model is built for the longest)")
    p.add_argument("--init-from", metavar="CHECKPOINT",
                   help="start from this checkpoint's weights (e.g. swap another --attention into a trained model)")
    p.add_argument("--time-budget", type=parse_duration, help="stop after this long (300, 15m, 1h30m)")
    p.add_argument("--batch-size", type=int, help="global batch size")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--min-lr", type=float, help="final learning rate of the cosine and wsd schedules")
    p.add_argument("--schedule", choices=SCHEDULES, help="learning-rate schedule after the warm-up")
    p.add_argument("--warmup", type=int, help="warm-up steps")
    p.add_argument("--decay-steps", type=int, help="wsd: the last steps, over which the rate falls to --min-lr")
    p.add_argument("--weight-decay", type=float, help="weight decay (AdamW) or L2 penalty (Adam)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="adamw (decoupled decay) or adam (decay as an L2 penalty)")
    p.add_argument("--grad-clip", type=float, help="clip the gradient norm (0 disables)")
    p.add_argument("--label-smoothing", type=float, help="label smoothing epsilon")
    p.add_argument("--init", choices=INITS, help="weight initialization")
    p.add_argument("--embed-std", type=float, help="re-initialize token embeddings N(0, std) (0: the model's)")
    p.add_argument("--attn-penalty", metavar="entropy|l2[:WEIGHT]", help="penalty on attention weights")
    p.add_argument("--precision", choices=PRECISIONS, help="auto picks by device (and measures bf16 on the CPU)")
    p.add_argument("--device", help="auto, cpu or cuda")
    p.add_argument("--dist-timeout", type=parse_duration,
                   help="how long a torchrun rank waits for the others (default 2h; 600, 30m)")
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (0: at the end only)")
    p.add_argument("--early-stopping-patience", type=int, metavar="N",
                   help="stop when the val loss has not improved for N evaluations; keep the best weights (0: off)")
    p.add_argument("--eval-batches", type=int, help="batches per evaluation during training (0: all)")
    p.add_argument("--save-every", type=int, help="checkpoint every N steps (0: at the end only)")
    p.add_argument("--keep-checkpoints", type=int, help="checkpoints kept on disk (0: all)")
    p.add_argument("--log-every", type=int, help="metrics record every N steps")
    p.add_argument("--seed", type=int, help="random seed (model, dropout, data)")
    p.add_argument("--seeds", type=int, metavar="N",
                   help="train N seeds (--seed, --seed+1, ...) into OUT/seed-S; report each metric's mean +- std")
    p.add_argument("--threads", type=int, help="torch threads (0: torch's default)")
    p.add_argument("--context-parallel", type=int, metavar="P",
                   help="shard every sequence over P torchrun ranks (data parallel over WORLD/P groups)")
    p.add_argument("--context-strategy", choices=("ring", "ulysses"), help="sequence-parallel attention (ring)")


def _add_checkpoint_commands(subparsers, draw_map: Callable[..., Any] | None) -> None:
    """``generate``, ``translate`` and ``evaluate``: commands that load a trained checkpoint."""
    g = subparsers.add_parser("generate", help="sample text from a trained character language model")
    g.add_argument("checkpoint", help="checkpoint directory or run directory")
    g.add_argument("--prompt", default="\n", help="text to continue")
    g.add_argument("--max-new-tokens", type=int, default=300)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--greedy", action="store_true", help="most likely character each step")
    g.add_argument("--num-samples", type=int, default=1)
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=_generate)

    t = subparsers.add_parser("translate", help="translate sentences with a trained translation model")
    t.add_argument("checkpoint", help="checkpoint directory or run directory")
    t.add_argument("sentences", nargs="+", help="sentences to translate ('-' reads lines from stdin)")
    t.add_argument("--beams", type=int, default=None, help="beam size (default: the task's, 4)")
    t.add_argument("--alignment", metavar="FILE.png", default=None,
                   help="also draw the cross-attention of the last decoder layer (target rows, source columns)")
    t.set_defaults(func=_translate, draw_map=draw_map)

    e = subparsers.add_parser("evaluate", help="evaluate a checkpoint on its task's validation or test split")
    e.add_argument("checkpoint", help="checkpoint directory or run directory")
    e.add_argument("--split", default=None, choices=("val", "test"),
                   help="default: test, or val for tasks without a test split (chars)")
    e.add_argument("--data", default=None, help="data path (default: the one the run trained on)")
    e.add_argument("--batch-size", type=int, default=64)
    e.set_defaults(func=_evaluate)


def main(argv: list[str] | None = None) -> int:
    """``python -m attnlab.train.cli train|generate|translate|evaluate ...`` (same as ``attnlab ...``)."""
    p = argparse.ArgumentParser(prog="attnlab")
    add_train_parsers(p.add_subparsers(dest="command", required=True))
    return run_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
