"""Generation: :func:`generate` (greedy, beam search, sampling with the KV cache) and its benchmark.

The search itself lives in :mod:`attnlab.models.search` and drives models through the
:class:`~attnlab.models.search.Generative` protocol, importing no model class, so the
model classes can use it. This module sits above them: it re-exports the search and adds
:func:`benchmark_generation`, which times greedy generation of a random
:class:`~attnlab.models.CausalLM` with and without the KV cache
(``python -c "from attnlab.models.generate import benchmark_generation as b; print(b())"``).

Time of the benchmark O(new_tokens * layers (B dim^2 + B H T D)) with the cache and
O(new_tokens * layers (B T dim^2 + B H T^2 D)) without; memory O(layers B H T D).
Shape legend: ``B`` batch, ``T`` current length, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from .causal_lm import CausalLM
from .config import CausalLMConfig
from .search import Generative, filter_logits, generate

__all__ = ["Generative", "benchmark_generation", "filter_logits", "generate"]


def benchmark_generation(
    *,
    layers: int = 4,
    dim: int = 256,
    heads: int = 8,
    vocab_size: int = 1024,
    prompt_len: int = 512,
    new_tokens: int = 256,
    batch: int = 1,
    positional: str = "sinusoidal",
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict[str, Any]:
    """Greedy-generation throughput of a random :class:`CausalLM`, with and without the KV cache.

    Each variant runs once after a short warm-up; "without" recomputes the full prefix
    every step. Both must produce the same tokens (reported as ``tokens_match``).

    Returns:
        A dict with the settings and ``cached_seconds``, ``full_seconds``,
        ``cached_tokens_per_s``, ``full_tokens_per_s`` (new tokens x batch per second),
        ``speedup`` (cached / full throughput) and ``tokens_match``.
    """
    torch.manual_seed(seed)
    cfg = CausalLMConfig(vocab_size=vocab_size, dim=dim, heads=heads, layers=layers, positional=positional,
                         max_len=prompt_len + new_tokens)
    model = CausalLM(cfg).to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab_size, (batch, prompt_len), generator=g).to(device)
    dev = torch.device(device)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def run(use_cache: bool, n: int) -> tuple[float, Tensor]:
        sync()
        t0 = time.perf_counter()
        out = generate(model, prompt, max_new_tokens=n, eos_id=None, use_cache=use_cache)
        sync()
        return time.perf_counter() - t0, out

    run(True, 4)
    run(False, 2)
    t_cached, out_cached = run(True, new_tokens)
    t_full, out_full = run(False, new_tokens)
    n = new_tokens * batch
    return {
        "layers": layers, "dim": dim, "heads": heads, "vocab_size": vocab_size, "prompt_len": prompt_len,
        "new_tokens": new_tokens, "batch": batch, "positional": positional, "device": str(dev),
        "dtype": str(dtype).replace("torch.", ""),
        "cached_seconds": t_cached, "full_seconds": t_full,
        "cached_tokens_per_s": n / t_cached, "full_tokens_per_s": n / t_full,
        "speedup": t_full / t_cached, "tokens_match": bool(torch.equal(out_cached, out_full)),
    }
