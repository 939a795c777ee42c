"""The ``deploy`` suite: what ONNX Runtime, INT8 and bf16 buy and cost on this CPU.

Two parts, every variant one case in its own process:

* **MiniLM sentence embeddings** (all-MiniLM-L6-v2) of real review sentences from the
  UCI sentiment set (Kotzias et al., 2015: Amazon, IMDB and Yelp reviews, read in
  turn), batch 32, tokenized once before timing. Variants: ``eager_fp32``,
  ``ort_fp32`` (the graph of :func:`attnlab.deploy.export_onnx`), ``ort_int8``
  (:func:`attnlab.deploy.quantize_onnx`), ``ort_fp32_optimized`` (the exported graph after
  ONNX Runtime's transformer optimizer, ``optimize_model(model_type="bert")``: which fused
  operators it found is the case's note), ``torchao_int8``
  (:func:`attnlab.deploy.quantize_eager_int8`) and ``eager_bf16`` (skipped, with the
  reason, where the CPU has no native bf16). Each records sentences/s over whole passes,
  and against the fp32 eager embeddings of the same sentences (computed in the same
  process): the mean and minimum cosine, and the Spearman correlation of the pairwise
  cosine similarities of all sentence pairs (``S (S - 1) / 2`` pairs, 51,040 at 320
  sentences). ``speedup`` (in :meth:`DeploySuite.finish`) is sentences/s over eager fp32's.
* **CausalLM decode**: greedy generation of a seeded random CausalLM (the generate
  suite's shape), eager with the KV cache (``decode_eager``) and through the exported
  prefill and decode graphs with the cache as explicit tensors (``decode_ort``):
  new tokens/s, and whether both generate the same tokens (``same_tokens``).

ONNX Runtime runs with as many intra-op threads as torch, so neither gets more cores.
The export (and its ONNX Runtime check) happens in the case before the timing starts.

Shape legend: ``S`` sentences, ``B`` batch, ``N`` tokens, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from ...data import MissingDataError
from ...utils import positive_int
from ..format import text_table
from ..measure import CausalLMSizeOptions, CausalLMSizes, random_causal_lm, timed_calls, token_digest
from ..suite import Case, Context, Job, RunOptions, Suite, register_suite

SUITE = "deploy"
EMBED = ("eager_fp32", "ort_fp32", "ort_fp32_optimized", "ort_int8", "torchao_int8", "eager_bf16")
DECODE = ("decode_eager", "decode_ort")
LABELS = {"eager_fp32": "eager fp32 (PyTorch)", "ort_fp32": "ONNX Runtime fp32",
          "ort_fp32_optimized": "ONNX Runtime fp32, transformer optimizer", "ort_int8": "ONNX Runtime INT8 "
          "(dynamic)", "torchao_int8": "torchao INT8 (dyn. act. + weights)", "eager_bf16": "eager bf16",
          "decode_eager": "eager + KV cache", "decode_ort": "ONNX Runtime prefill + decode graphs"}
DEFAULTS = {"model": "minilm", "sentences": 320, "batch": 32, "max_tokens": 128,
            "layers": 4, "dim": 256, "heads": 8, "vocab_size": 1024, "prompt_len": 64, "new_tokens": 64}
PROFILE = {"quick": {}, "standard": {}, "full": {"sentences": 960, "prompt_len": 256, "new_tokens": 128}}
SENTIMENT_FILES = ("amazon_cells_labelled.txt", "imdb_labelled.txt", "yelp_labelled.txt")


@dataclass(frozen=True)
class DeployOptions(CausalLMSizeOptions):
    """The deploy suite's own options (None: :data:`DEFAULTS`, then the profile's, :data:`PROFILE`).

    ``model`` is ``minilm`` (the pretrained all-MiniLM-L6-v2) or ``tiny`` (a random small BERT
    with its vocabulary, for tests); ``sentences``, ``batch`` and ``max_tokens`` are sizes of the
    embedding part, the CausalLM's (:class:`~attnlab.bench.measure.CausalLMSizeOptions`) of the decode part.
    """

    model: str | None = None
    sentences: int | None = None
    batch: int | None = None
    max_tokens: int | None = None

    def sizes(self, profile: str) -> dict:
        """The validated settings of a run of ``profile``."""
        out = {**DEFAULTS, **PROFILE[profile], **{k: v for k, v in asdict(self).items() if v is not None}}
        if out["model"] not in ("minilm", "tiny"):
            raise ValueError(f"deploy option model must be 'minilm' or 'tiny', got {out['model']!r}")
        for key in ("sentences", "batch", "max_tokens", "layers", "dim", "heads", "vocab_size", "prompt_len",
                    "new_tokens"):
            positive_int(out[key], f"deploy option {key}")
        if out["sentences"] < 46:
            raise ValueError(f"deploy option sentences must be >= 46 (>= 1,000 pairs), got {out['sentences']}")
        return out


@dataclass(frozen=True)
class DeployCase(CausalLMSizes, Case):
    """One case of this suite: a variant of the embedding part or of the decode part (always float32 on the CPU).

    Attributes:
        name: a variant of :data:`EMBED` (``mode`` ``embed``) or of :data:`DECODE` (``mode`` ``decode``).
        model, sentences, batch, max_tokens: the embedding part (:class:`DeployOptions`).
        layers, dim, heads, vocab_size, prompt_len, new_tokens: the decode part's CausalLM and run
            (:class:`~attnlab.bench.measure.CausalLMSizes`).
        data_dir: the folder of the sentiment sentences.
    """

    suite: ClassVar[str] = SUITE
    kind: ClassVar[str] = "deploy"

    name: str
    mode: str
    model: str
    sentences: int
    batch: int
    max_tokens: int
    data_dir: str | None = None

    def header(self) -> dict:
        if self.mode == "embed":  # MiniLM: 12 heads of 32; the tiny BERT: 2 of 16
            h, d = (12, 32) if self.model == "minilm" else (2, 16)
            return {"kind": self.kind, "name": self.name, "mask": "padding", "N": self.max_tokens, "B": self.batch,
                    "H": h, "D": d, "mode": self.mode}
        return {"kind": self.kind, "name": self.name, "mask": "causal", "N": self.prompt_len, "B": 1, "H": self.heads,
                "D": self.dim // self.heads, "mode": self.mode}

    def settings(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in ("name", "mode", "dtype", "device")}

    def label(self) -> str:
        return f"deploy {self.name}"


def read_sentences(data_dir: str | Path, count: int) -> list[str]:
    """``count`` review sentences from the sentiment files in the folder ``data_dir``, taken from each file in turn.

    Raises:
        ValueError: when the files are missing or hold fewer sentences.
    """
    folder = Path(data_dir)
    per_file = []
    for name in SENTIMENT_FILES:
        path = folder / name
        if not path.is_file():
            raise ValueError(f"the deploy suite reads review sentences from {path}, which is missing; "
                             f"fetch them with: attnlab data fetch sentiment")
        text = path.read_text(encoding="utf-8").split("\n")  # split on \n only: the IMDB file holds U+0085
        per_file.append([line.rpartition("\t")[0].strip() for line in text if "\t" in line])
    out = [s for row in zip(*per_file) for s in row if s]
    if len(out) < count:
        raise ValueError(f"sentences must be at most {len(out)} (the sentiment files), got {count}")
    return out[:count]


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two 1-D float tensors (ties broken by position)."""
    ra = torch.empty_like(a, dtype=torch.float64)
    rb = torch.empty_like(b, dtype=torch.float64)
    ra[a.argsort()] = torch.arange(a.numel(), dtype=torch.float64)
    rb[b.argsort()] = torch.arange(b.numel(), dtype=torch.float64)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def quality(emb: Tensor, ref: Tensor) -> dict:
    """Mean and min cosine of ``emb (S, dim)`` to ``ref``, and Spearman of their pairwise similarities."""
    emb, ref = F.normalize(emb.double(), dim=1), F.normalize(ref.double(), dim=1)
    cos = (emb * ref).sum(dim=1)  # (S,)
    i, j = torch.triu_indices(len(emb), len(emb), offset=1)
    pairs = ((emb @ emb.T)[i, j], (ref @ ref.T)[i, j])  # (S (S - 1) / 2,) each
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "spearman": spearman(*pairs),
            "pairs": int(i.numel())}


def embedding_model(case: DeployCase):
    """The model (eval mode) and tokenizer of the embedding part: pretrained MiniLM or a tiny random BERT."""
    from ...models import Bert, BertConfig, TextTokenizer
    from ...models.bert import minilm_path

    if case.model == "minilm":
        model = Bert.from_minilm()
    else:  # "tiny": a random small BERT with MiniLM's vocabulary (the suite's own test)
        torch.manual_seed(0)
        model = Bert(BertConfig(dim=32, layers=2, heads=2, ff_dim=64, max_len=case.max_tokens))
    tok = TextTokenizer(minilm_path() / "tokenizer.json", max_length=case.max_tokens)
    return model.eval(), tok


def _ort_threads() -> int:
    return torch.get_num_threads()


def run_embed(case: DeployCase, ctx: Context) -> dict:
    """Measure one MiniLM embedding variant (see the module docstring)."""
    from ...deploy import export_onnx, quantize_eager_int8, quantize_onnx
    from ...deploy.verify import runner, session
    from ...models import mean_pool

    model, tok = embedding_model(case)
    sentences = read_sentences(case.data_dir, case.sentences)
    batches = [tok(sentences[i:i + case.batch]) for i in range(0, len(sentences), case.batch)]

    def eager(m) -> Callable[[], Tensor]:
        @torch.no_grad()
        def run() -> Tensor:
            out = []
            for b in batches:
                h = m(**b).last_hidden_state.float()  # (B, N, dim)
                out.append(F.normalize(mean_pool(h, b["attention_mask"]), dim=1))
            return torch.cat(out)  # (S, dim)
        return run

    ref = eager(model)()
    name = case.name
    note = None
    if name == "eager_fp32":
        fn = eager(model)
    elif name == "torchao_int8":
        fn = eager(quantize_eager_int8(model))
    elif name == "eager_bf16":
        fn = eager(model.to(torch.bfloat16))
    else:
        tmp = Path(tempfile.mkdtemp(prefix="attnlab-deploy-"))
        report = export_onnx(model, tmp / "fp32", force=True)
        path = report.files["model"]
        note = f"export: onnxruntime = eager within {report.max_abs:.1e} max abs on held-out inputs"
        if name == "ort_int8":
            path = quantize_onnx(path, tmp / "model.int8.onnx")
        elif name == "ort_fp32_optimized":
            path, fused = _ort_optimized(path, model, tmp / "optimized.onnx")
            note += f"; the transformer optimizer fused: {fused or 'nothing'}"
        run = runner(session(path, threads=_ort_threads()))

        def fn() -> Tensor:
            return torch.cat([run(b)["sentence_embedding"] for b in batches])  # (S, dim)

    emb = fn()  # the warm-up: lazy initialization, thread pools, ORT's first-run allocations
    times = timed_calls(fn, ctx.repeats, ctx.budget_s)
    res = {"time_s": statistics.median(times), "times_s": times, "sentences_per_s": len(sentences) / min(times),
           **quality(emb.float(), ref)}
    if note:
        res["note"] = note
    return res


def _ort_optimized(path: Path, model, out: Path) -> tuple[Path, str]:
    """The graph at ``path`` through ONNX Runtime's transformer optimizer; (its file, the fused operators found)."""
    from onnxruntime.transformers.optimizer import optimize_model

    cfg = model.config
    opt = optimize_model(str(path), model_type="bert", num_heads=cfg.heads, hidden_size=cfg.dim,
                         opt_level=99)
    opt.save_model_to_file(str(out))
    fused = ", ".join(f"{k} x{v}" for k, v in opt.get_fused_operator_statistics().items() if v)
    return out, fused


def ort_greedy(files: dict[str, Path], prompt: Tensor, new_tokens: int, layers: int, threads: int | None = None
               ) -> Tensor:
    """Greedy continuation of ``prompt (B, P)`` by ``new_tokens`` through exported prefill/decode graphs -> ``(B, P + T)``."""
    from ...deploy.verify import runner, session

    prefill, decode = runner(session(files["prefill"], threads=threads)), runner(session(files["decode"], threads=threads))
    keep = torch.ones_like(prompt)
    out = prefill({"tokens": prompt, "attention_mask": keep})
    tokens = [prompt]
    for step in range(new_tokens):
        nxt = out["logits"][:, -1].argmax(-1, keepdim=True)  # (B, 1)
        tokens.append(nxt)
        if step == new_tokens - 1:
            break
        keep = torch.cat([keep, torch.ones_like(nxt)], dim=1)  # (B, T + 1)
        past = {f"past.{i}.{kv}": out[f"present.{i}.{kv}"] for i in range(layers) for kv in ("key", "value")}
        out = decode({"tokens": nxt, "attention_mask": keep, **past})
    return torch.cat(tokens, dim=1)


def run_decode(case: DeployCase, ctx: Context) -> dict:
    """Measure greedy decoding, eager with the KV cache or through the ONNX graphs."""
    from ...deploy import export_onnx
    from ...models import generate

    model, prompt = random_causal_lm(case.vocab_size, case.dim, case.heads, case.layers, case.prompt_len,
                                     case.new_tokens)
    n = case.new_tokens
    note = None
    if case.name == "decode_eager":
        def fn() -> Tensor:
            with torch.no_grad():
                return generate(model, prompt, max_new_tokens=n, eos_id=None, use_cache=True)
    else:
        report = export_onnx(model, Path(tempfile.mkdtemp(prefix="attnlab-deploy-")) / "lm", force=True)
        note = f"export: onnxruntime = eager within {report.max_abs:.1e} max abs on held-out inputs"

        def fn() -> Tensor:
            return ort_greedy(report.files, prompt, n, case.layers, _ort_threads())
    out = fn()  # the warm-up
    times = timed_calls(fn, ctx.repeats, ctx.budget_s)
    res = {"time_s": statistics.median(times), "times_s": times, "tokens_per_s": n / min(times),
           "decode_digest": token_digest(out)}
    if note:
        res["note"] = note
    return res


_POS_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}
_NUM_OR_NULL = {"type": ["number", "null"]}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


@register_suite
class DeploySuite(Suite):
    """MiniLM embeddings through eager, ONNX Runtime, INT8 and bf16; a CausalLM's decode eager vs ONNX Runtime."""

    name = SUITE
    summary = "MiniLM embeddings eager vs ONNX Runtime fp32/INT8, torchao INT8, bf16; CausalLM decode eager vs ORT"
    default = False
    order = 60
    Options = DeployOptions
    kinds = ("deploy",)
    modes = ("embed", "decode")
    result_keys = ("sentences_per_s", "mean_cosine", "min_cosine", "spearman", "pairs", "tokens_per_s",
                   "decode_digest")
    record_defaults = {"sentences_per_s": None, "mean_cosine": None, "min_cosine": None, "spearman": None,
                       "pairs": None, "decode_digest": None}
    case_properties = {
        "sentences_per_s": {**_POS_OR_NULL, "description": "deploy: sentences embedded per second (batch 32)"},
        "mean_cosine": {**_NUM_OR_NULL, "description": "deploy: mean cosine to the fp32 eager embeddings"},
        "min_cosine": {**_NUM_OR_NULL, "description": "deploy: minimum cosine to the fp32 eager embeddings"},
        "spearman": {**_NUM_OR_NULL, "description": "deploy: Spearman of pairwise similarities vs fp32 eager"},
        "pairs": {"type": ["integer", "null"], "description": "deploy: sentence pairs in the Spearman correlation"},
        "decode_digest": {"type": ["string", "null"], "description": "deploy: digest of the decoded tokens"},
        "speedup_vs_eager": {**_POS_OR_NULL, "description": "deploy: throughput over the eager fp32 case's"},
        "same_tokens": {"type": ["boolean", "null"], "description": "deploy: ORT decoded the eager tokens"},
    }
    verdict_properties = {"speedup_vs_eager": _POS_OR_NULL}

    def sizes(self, opts: RunOptions) -> dict:
        """Settings of the run: defaults, the profile's, then the suite's options; and the data folder."""
        folder = opts.find_data("sentiment")
        return {**opts.of(self).sizes(opts.profile), "data_dir": None if folder is None else str(folder)}

    def check(self, opts: RunOptions) -> None:
        st = self.sizes(opts)
        if opts.device != "cpu" or opts.dtype != "float32":
            raise ValueError(f"the deploy suite measures the CPU from float32 (--device cpu --dtype float32), got "
                             f"{opts.device} {opts.dtype}")
        if st["data_dir"] is None:
            raise MissingDataError(f"the deploy suite embeds review sentences: {opts.missing_data('sentiment')}")

    def cases(self, opts: RunOptions) -> list[Job]:
        from ...deploy import native_cpu_bf16

        st = self.sizes(opts)
        bf16, why = native_cpu_bf16()
        keep = set(opts.names) if opts.names is not None else set(EMBED + DECODE)
        timeout_s = max(opts.timeout_s or 0.0, 600.0)
        jobs = []
        for mode, names in (("embed", EMBED), ("decode", DECODE)):
            for name in (n for n in names if n in keep):
                skip = {"status": "skipped", "reason": why} if name == "eager_bf16" and not bf16 else None
                jobs.append(Job(DeployCase(name=name, mode=mode, **st), skip=skip, timeout_s=timeout_s))
        return jobs

    def run_case(self, case: DeployCase, ctx: Context) -> dict:
        return run_embed(case, ctx) if case.mode == "embed" else run_decode(case, ctx)

    def known_names(self) -> set[str]:
        return set(EMBED + DECODE)

    def finish(self, records: list[dict]) -> None:
        mine = self.own(records)
        base = next((r for r in mine if r["name"] == "eager_fp32" and r["status"] == "ok"), None)
        eager = next((r for r in mine if r["name"] == "decode_eager" and r["status"] == "ok"), None)
        for r in mine:
            r["speedup_vs_eager"], r["same_tokens"] = None, None
            if r["status"] != "ok":
                continue
            if r["mode"] == "embed" and base and base.get("sentences_per_s") and r.get("sentences_per_s"):
                r["speedup_vs_eager"] = r["sentences_per_s"] / base["sentences_per_s"]
            if r["mode"] == "decode" and eager and eager.get("tokens_per_s") and r.get("tokens_per_s"):
                r["speedup_vs_eager"] = r["tokens_per_s"] / eager["tokens_per_s"]
                r["same_tokens"] = r.get("decode_digest") == eager.get("decode_digest")

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        out = []
        for r in self.own(records):
            if r["name"] in ("eager_fp32", "decode_eager"):
                continue
            v = {"suite": SUITE, "N": r["N"], "mask": r["mask"], "mode": r["mode"],
                 "speedup_vs_eager": r.get("speedup_vs_eager")}
            if r["status"] != "ok" or r.get("speedup_vs_eager") is None:
                v["text"] = f"deploy {LABELS[r['name']]}: not measured ({r['status']}: {r.get('reason') or '-'})."
            elif r["mode"] == "decode":
                v["text"] = (f"deploy: CausalLM decode through ONNX Runtime runs {r['speedup_vs_eager']:.2f}x eager "
                             f"({r['tokens_per_s']:,.1f} tokens/s) and "
                             + ("decodes the same tokens." if r["same_tokens"] else "decodes DIFFERENT tokens."))
            else:
                v["text"] = (f"deploy: MiniLM {LABELS[r['name']]} embeds {r['sentences_per_s']:,.1f} sentences/s, "
                             f"{r['speedup_vs_eager']:.2f}x eager fp32, mean cosine {r['mean_cosine']:.4f} (min "
                             f"{r['min_cosine']:.4f}), Spearman {r['spearman']:.4f} over {r['pairs']:,} pairs.")
            out.append(v)
        return out

    def _rows(self, results: dict, mode: str) -> tuple[list[str], list[list[str]]]:
        rows = []
        for c in self.own(results["cases"]):
            if c["mode"] != mode:
                continue
            status = c["status"] if c["status"] != "ok" else ""
            if mode == "embed":
                rows.append([LABELS[c["name"]], _fmt(c.get("sentences_per_s"), ",.1f"),
                             _fmt(c.get("speedup_vs_eager"), ".2f"), _fmt(c.get("mean_cosine"), ".4f"),
                             _fmt(c.get("min_cosine"), ".4f"), _fmt(c.get("spearman"), ".4f"), status])
            else:
                same = c.get("same_tokens")
                rows.append([LABELS[c["name"]], _fmt(c.get("tokens_per_s"), ",.1f"),
                             _fmt(c.get("speedup_vs_eager"), ".2f"), "-" if same is None else ("yes" if same else "NO"),
                             status])
        if mode == "embed":
            return ["variant", "sentences/s", "x eager", "mean cos", "min cos", "Spearman", "status"], rows
        return ["variant", "tokens/s", "x eager", "same tokens", "status"], rows

    def summary_lines(self, results: dict) -> list[str]:
        if not self.own(results["cases"]):
            return []
        return ["", "deploy (MiniLM embeddings, batch 32):", text_table(*self._rows(results, "embed")),
                "", "deploy (CausalLM greedy decode):", text_table(*self._rows(results, "decode"))]

    def report_sections(self, results: dict) -> list[tuple]:
        mine = self.own(results["cases"])
        if not mine:
            return []
        st = mine[0]["settings"]
        return [("h2", "Deploy"),
                ("p", f"{'all-MiniLM-L6-v2' if st['model'] == 'minilm' else 'a tiny random BERT'} sentence embeddings "
                      f"of {st['sentences']} review sentences (the UCI sentiment set), batch {st['batch']}, "
                      f"at most {st['max_tokens']} tokens, tokenized before timing; sentences/s from the fastest "
                      "whole pass; cosine and Spearman (of the pairwise similarities of every sentence pair) against "
                      "the fp32 eager embeddings. ONNX Runtime uses as many threads as torch."),
                ("table", *self._rows(results, "embed")),
                ("p", f"Greedy decoding of a random CausalLM ({st['layers']} layers, {st['dim']} wide, "
                      f"{st['heads']} heads, vocabulary {st['vocab_size']}): {st['new_tokens']} new tokens after a "
                      f"{st['prompt_len']}-token prompt, eager with the KV cache vs the exported prefill and decode "
                      "graphs with the cache as explicit tensors."),
                ("table", *self._rows(results, "decode"))]

    def tiny_options(self) -> dict | None:
        return {"names": ["eager_fp32", "ort_fp32", "decode_eager", "decode_ort"],
                "suite_options": {SUITE: {"model": "tiny", "sentences": 48, "batch": 16, "max_tokens": 32,
                                          "layers": 1, "dim": 32, "heads": 2, "vocab_size": 64, "prompt_len": 8,
                                          "new_tokens": 4}}}


__all__ = ["DECODE", "EMBED", "SUITE", "DeployCase", "DeployOptions", "DeploySuite", "embedding_model", "ort_greedy", "quality", "read_sentences",
           "run_decode", "run_embed", "spearman"]
