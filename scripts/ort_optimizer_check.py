"""Does ONNX Runtime's transformer optimizer speed up attnlab's exported MiniLM?

    .venv/bin/python scripts/ort_optimizer_check.py      # about a minute on a 2-core CPU

Exports MiniLM with ``attnlab.deploy.export_onnx``, runs
``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`` on the graph, prints
which fused operators it found, and times eager fp32, ONNX Runtime fp32 and the optimized
graph on 320 review sentences (batch 32), calls alternated, medians of 5. Every figure is
measured by this run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnlab.bench.deploy import _minilm, read_sentences
from attnlab.bench.tasks import default_data_dir
from attnlab.deploy import export_onnx
from attnlab.deploy.verify import runner, session
from attnlab.models import mean_pool


def main() -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    model, tok = _minilm({"model": "minilm", "max_tokens": 128})
    sentences = read_sentences(default_data_dir(), 320)
    batches = [tok(sentences[i:i + 32]) for i in range(0, len(sentences), 32)]
    tmp = Path(tempfile.mkdtemp(prefix="attnlab-ortopt-"))
    path = export_onnx(model, tmp / "fp32", force=True).files["model"]
    opt = optimize_model(str(path), model_type="bert", num_heads=12, hidden_size=384, opt_level=99)
    print("fused operators found:", {k: v for k, v in opt.get_fused_operator_statistics().items() if v})
    opt.save_model_to_file(str(tmp / "optimized.onnx"))

    @torch.no_grad()
    def eager():
        return torch.cat([torch.nn.functional.normalize(mean_pool(model(**b).last_hidden_state, b["attention_mask"]), dim=1)
                          for b in batches])

    plain, optimized = runner(session(path, threads=torch.get_num_threads())), runner(
        session(tmp / "optimized.onnx", threads=torch.get_num_threads()))
    fns = {"eager fp32": eager,
           "onnxruntime fp32": lambda: torch.cat([plain(b)["sentence_embedding"] for b in batches]),
           "onnxruntime fp32, transformer optimizer": lambda: torch.cat(
               [optimized(b)["sentence_embedding"] for b in batches])}
    ref = eager()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for name, fn in fns.items():
        print(f"{name}: min cosine to eager {float((fn() * ref).sum(1).min()):.6f}")
    for _ in range(5):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times["eager fp32"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name}: {len(sentences) / m:.1f} sentences/s, {base / m:.2f}x eager")


if __name__ == "__main__":
    main()
