"""The ``generate`` suite: greedy generation of a small :class:`~attnlab.models.CausalLM`,
with and without the KV cache.

A random ``CausalLM`` (by default 4 layers, 256 wide, 8 heads, vocabulary 1024,
sinusoidal positions) continues a random prompt of ``P`` tokens by ``T`` new tokens,
greedily, once feeding only the new token to a KV cache (``kv_cache``) and once
recomputing the whole prefix every step (``no_cache``). Each variant is one case, run in
its own process like the other suites: a short warm-up, one generation whose peak memory
is measured, then timed generations (at least one, at most ``repeats``, fewer once they
total ``budget_s``). A case records seconds (median), tokens/s (``T * B`` new tokens per
second, prompt processing included) and a digest of the generated tokens;
:func:`link_cases` then gives both records the ``speedup`` (no-cache seconds over cached
seconds) and ``tokens_match`` (the two digests are equal: the cache must not change
what is generated).

Cost of one step at length ``L``: with the cache O(layers (B dim^2 + B H L D)); without
it O(layers (B L dim^2 + B H L^2 D)), so the speedup grows with the prompt length.

Shape legend: ``B`` batch, ``P`` prompt length, ``T`` new tokens, ``L`` current
length, ``H`` heads, ``D`` head dim, ``V`` vocabulary.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

from torch import Tensor

from ...models import CausalLM, generate
from ...utils import positive_int
from ..format import clip, is_ok, mb_cell, notes_cell, num
from ..measure import CausalLMSizeOptions, CausalLMSizes, peak_memory, random_causal_lm, sync, timed_calls, token_digest
from ..suite import Case, Context, RunOptions, Suite, register_suite

SUITE = "generate"
#: the two cases: name -> use_cache
VARIANTS = {"kv_cache": True, "no_cache": False}
#: what the report calls them
LABELS = {"kv_cache": "with KV cache", "no_cache": "without cache (recomputes the prefix)"}
#: model and run sizes: 4 layers, 256 wide, 8 heads, 256 tokens after a 512-token prompt
DEFAULT_SIZES = {"layers": 4, "dim": 256, "heads": 8, "vocab_size": 1024, "prompt_len": 512, "new_tokens": 256,
                 "batch": 1}
#: positional encoding of the benchmarked model
POSITIONAL = "sinusoidal"
#: the sizes each profile changes (``--prompt-len`` and ``--new-tokens`` replace them)
PROFILE_SIZES = {"quick": {"prompt_len": 256, "new_tokens": 64}, "standard": {"prompt_len": 256, "new_tokens": 64},
                 "full": {"prompt_len": 512, "new_tokens": 256}}


@dataclass(frozen=True)
class GenerateOptions(CausalLMSizeOptions):
    """The generate suite's own options: model and run sizes (None: the profile's, :data:`PROFILE_SIZES`)."""

    batch: int | None = None

    def sizes(self, profile: str) -> dict:
        """The validated sizes of a run of ``profile``."""
        given = {k: v for k, v in asdict(self).items() if v is not None}
        return check_sizes(given, PROFILE_SIZES[profile])


def check_sizes(sizes: dict | None, base: dict | None = None) -> dict:
    """``base`` (default :data:`DEFAULT_SIZES`) updated with ``sizes``, validated.

    Raises:
        ValueError: an unknown key, a value that is not a positive int, or ``dim`` not
            divisible by ``heads``.
    """
    out = dict(DEFAULT_SIZES if base is None else {**DEFAULT_SIZES, **base})
    for key, val in (sizes or {}).items():
        if key not in DEFAULT_SIZES:
            raise ValueError(f"generate sizes must be among {sorted(DEFAULT_SIZES)}, got {key!r}")
        out[key] = val
    for key, val in out.items():
        positive_int(val, f"generate size {key}")
    if out["dim"] % out["heads"]:
        raise ValueError(f"generate size dim must be divisible by heads, got dim={out['dim']} heads={out['heads']}")
    return out


@dataclass(frozen=True)
class GenerateCase(CausalLMSizes, Case):
    """One case of this suite: a seeded random CausalLM continuing a seeded random prompt, greedily.

    Attributes:
        name: ``kv_cache`` or ``no_cache`` (:data:`VARIANTS`).
        layers, dim, heads, vocab_size: the model (``dim / heads`` the head dim;
            :class:`~attnlab.bench.measure.CausalLMSizes`).
        prompt_len, new_tokens, batch: ``P``, ``T`` and ``B`` of the legend.
        use_cache: feed only the new token to a KV cache (else recompute the whole prefix every step).
        positional, seed: the model's positions; the seed of its weights and of the prompt.
    """

    suite: ClassVar[str] = SUITE
    kind: ClassVar[str] = "generation"
    mask: ClassVar[str] = "causal"
    mode: ClassVar[str] = "generate"

    name: str
    batch: int
    use_cache: bool
    positional: str = POSITIONAL
    seed: int = 0

    def header(self) -> dict:
        # the record's length is the prompt's
        return {"kind": self.kind, "name": self.name, "mask": self.mask, "N": self.prompt_len, "B": self.batch,
                "H": self.heads, "D": self.dim // self.heads, "mode": self.mode}

    def settings(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in ("name", "dtype", "device")}

    def label(self) -> str:
        return f"generate {self.name} prompt={self.prompt_len} new={self.new_tokens}"


def cases(sizes: dict, device: str, dtype: str) -> list[GenerateCase]:
    """The two cases of this suite (``kv_cache``, ``no_cache``) at the validated ``sizes``."""
    return [GenerateCase(name=name, **sizes, use_cache=use_cache, dtype=dtype, device=device)
            for name, use_cache in VARIANTS.items()]


def build(case: GenerateCase) -> tuple[CausalLM, Tensor]:
    """The seeded random model (eval mode) and prompt ``(B, P)`` of a case; the same in every process."""
    return random_causal_lm(case.vocab_size, case.dim, case.heads, case.layers, case.prompt_len, case.new_tokens,
                            batch=case.batch, positional=case.positional, seed=case.seed, device=case.device,
                            dtype=case.dtype)


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / hz


#: other processes using this many CPUs on average during the timed runs earn the case a note
BUSY_NOTE_CPUS = 0.5


def measure_generation(gen: Callable[[int], Tensor], new_tokens: int, device: str, repeats: int,
                       budget_s: float) -> tuple[dict, Tensor]:
    """Time and peak memory of ``gen(new_tokens)`` (a whole generation), and its output.

    A warm-up of 2 tokens, one generation whose peak memory is measured (on CPU with
    glibc returning large blocks to the kernel, see :mod:`.measure`), then timed
    generations under the ordinary allocator: at least one, at most ``repeats``,
    fewer once they total ``budget_s``. When other processes kept the CPUs busy during
    the timed generations (from ``/proc/stat``), the result carries a ``note`` saying so:
    a thread pool sharing its cores loses a scheduler slice at every small operation.
    """
    gen(min(2, new_tokens))  # warm-up: lazy initialization, thread pool, kernels
    sync(device)
    out, peak, method = peak_memory(lambda: gen(new_tokens), device)
    busy0, cpu0, wall0 = busy_cpu_seconds(), time.process_time(), time.perf_counter()
    times = timed_calls(lambda: gen(new_tokens), repeats, budget_s, device)
    res = {"time_s": statistics.median(times), "times_s": times, "peak_bytes": peak, "peak_method": method}
    busy1 = busy_cpu_seconds()
    if busy0 is not None and busy1 is not None:
        others = (busy1 - busy0 - (time.process_time() - cpu0)) / (time.perf_counter() - wall0)
        if others >= BUSY_NOTE_CPUS:
            res["note"] = (f"other processes kept {others:.1f} CPUs busy during the timed runs "
                           f"({os.cpu_count()} logical CPUs): times are pessimistic, small operations suffer most")
    return res, out


def run_case(case: GenerateCase, ctx: Context) -> dict:
    """Measure one generation case in this process (see the module docstring)."""
    model, prompt = build(case)

    def gen(n: int) -> Tensor:
        return generate(model, prompt, max_new_tokens=n, eos_id=None, use_cache=case.use_cache)  # (B, P + n)

    res, out = measure_generation(gen, case.new_tokens, case.device, ctx.repeats, ctx.budget_s)
    want = (case.batch, case.prompt_len + case.new_tokens)
    if tuple(out.shape) != want:
        raise ValueError(f"generate returned shape {tuple(out.shape)}, expected (batch, prompt + new) = {want}")
    res["tokens_per_s"] = case.new_tokens * case.batch / res["time_s"]
    res["tokens_digest"] = token_digest(out)
    return res


def link_cases(records: list[dict]) -> None:
    """Give the generate records of one run their ``speedup`` and ``tokens_match`` (in place).

    Both are None unless both variants of the same settings ran ``ok``.
    """
    groups: dict[str, dict[str, dict]] = {}
    for r in records:
        if r["suite"] == SUITE:
            key = repr(sorted((k, v) for k, v in r["settings"].items() if k != "use_cache"))
            groups.setdefault(key, {})[r["name"]] = r
    for g in groups.values():
        cached, full = g.get("kv_cache"), g.get("no_cache")
        both = (cached is not None and full is not None and cached["status"] == "ok" and full["status"] == "ok"
                and cached.get("time_s") and full.get("time_s"))
        speedup = full["time_s"] / cached["time_s"] if both else None
        match = cached.get("tokens_digest") == full.get("tokens_digest") if both else None
        for r in g.values():
            r["speedup"], r["tokens_match"] = speedup, match


def rows(cases: list[dict], width: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the generate table (one row per case: with / without the KV cache)."""
    head = ["case", "prompt", "new tokens", "seconds", "tokens/s", "peak MB", "speedup", "same tokens", "notes"]
    out = []
    for c in cases:
        st, ok, match = c["settings"], c["status"] == "ok", c.get("tokens_match")
        out.append([c["name"], str(st["prompt_len"]), str(st["new_tokens"]),
                    num(c["time_s"], ",.3f") if ok else c["status"], num(c.get("tokens_per_s"), ",.1f"), mb_cell(c),
                    num(c.get("speedup"), ".1f") + ("x" if c.get("speedup") else ""),
                    "" if match is None else ("yes" if match else "NO"), clip(notes_cell(c), width)])
    return head, out


def _speed(speedup: float) -> str:
    if speedup >= 1.05:
        return f"{speedup:.1f}x faster"
    if speedup <= 1 / 1.05:
        return f"{1 / speedup:.1f}x slower"
    return "about as fast"


def verdicts(cases: list[dict]) -> list[dict]:
    """One verdict per pair of cases (with / without the KV cache) with the same settings: the measured speedup."""
    out = []
    groups: dict[str, dict[str, dict]] = {}
    for c in cases:
        key = repr(sorted((k, v) for k, v in c["settings"].items() if k != "use_cache"))
        groups.setdefault(key, {})[c["name"]] = c
    for g in groups.values():
        cached, full = g.get("kv_cache"), g.get("no_cache")
        any_c = cached or full
        st = any_c["settings"]
        sizes = (f"{st['layers']} layer{'s' if st['layers'] != 1 else ''}, {st['dim']} wide, {st['heads']} heads, "
                 f"{st['prompt_len']}-token prompt, {st['new_tokens']} new tokens"
                 + (f", batch {st['batch']}" if st.get("batch", 1) != 1 else ""))
        v = {"suite": SUITE, "N": any_c["N"], "mask": any_c["mask"], "mode": any_c["mode"], "fastest": None,
             "frugal": None, "speedup": None, "tokens_match": None}
        if not (cached and full and is_ok(cached) and is_ok(full) and cached.get("tokens_per_s")
                and full.get("tokens_per_s")):
            why = "; ".join(f"{name}: {c['status']}" for name, c in g.items() if c["status"] != "ok") or "a case is missing"
            v["text"] = f"generation: KV cache not compared ({why}; {sizes})."
            out.append(v)
            continue
        speedup = full["time_s"] / cached["time_s"]
        match = cached.get("tokens_digest") is not None and cached.get("tokens_digest") == full.get("tokens_digest")
        text = (f"generation: KV cache {_speed(speedup)} ({cached['tokens_per_s']:,.1f} vs "
                f"{full['tokens_per_s']:,.1f} tokens/s; {sizes}); "
                + ("same tokens with and without the cache" if match else
                   "the generated tokens DIFFER with and without the cache"))
        v.update(text=text + ".", speedup=speedup, tokens_match=match,
                 fastest="kv_cache" if speedup >= 1 else "no_cache")
        if cached["peak_bytes"] is not None and full["peak_bytes"] is not None:
            v["frugal"] = "kv_cache" if cached["peak_bytes"] <= full["peak_bytes"] else "no_cache"
        out.append(v)
    return out


# -- the suite object ----------------------------------------------------------------------------

_POS_OR_NULL = {"type": ["number", "null"], "exclusiveMinimum": 0}


@register_suite
class GenerateSuite(Suite):
    """Greedy generation of a small CausalLM with and without the KV cache."""

    name = SUITE
    summary = "a small CausalLM generating with and without the KV cache (tokens/s, the speedup)"
    title = "Generation"
    order = 30
    Options = GenerateOptions
    kinds = ("generation",)
    modes = ("generate",)
    result_keys = ("tokens_per_s", "tokens_digest")
    record_defaults = {"tokens_per_s": None}
    case_properties = {
        "tokens_digest": {"type": ["string", "null"], "description": "generate: digest of the generated tokens"},
        "speedup": {**_POS_OR_NULL,
                    "description": "generate: seconds without the cache / seconds with it (null unless both ran)"},
        "tokens_match": {"type": ["boolean", "null"],
                         "description": "generate: both cases generated the same tokens (null unless both ran)"},
    }
    settings_properties = {"generate": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1},
                                        "description": "model and run sizes of the generate suite"}}
    verdict_properties = {"speedup": _POS_OR_NULL, "tokens_match": {"type": ["boolean", "null"]}}

    def add_arguments(self, group) -> None:
        group.add_argument("--prompt-len", type=int, default=None,
                           help="generate: prompt length (default per profile: quick 256, full 512)")
        group.add_argument("--new-tokens", type=int, default=None,
                           help="generate: tokens to generate (default per profile: quick 64, full 256)")

    def options_from_args(self, args) -> dict:
        return {k: v for k, v in (("prompt_len", args.prompt_len), ("new_tokens", args.new_tokens)) if v is not None}

    def sizes(self, opts: RunOptions) -> dict:
        """The validated model and run sizes of ``opts``."""
        return opts.of(self).sizes(opts.profile)

    def check(self, opts: RunOptions) -> None:
        self.sizes(opts)

    def cases(self, opts: RunOptions) -> list[GenerateCase]:
        return cases(self.sizes(opts), opts.device, opts.dtype)

    run_case = staticmethod(run_case)  # the module's: the suite adds nothing
    rows = staticmethod(rows)

    def settings(self, opts: RunOptions) -> dict:
        return {"generate": self.sizes(opts)}

    def finish(self, records: list[dict]) -> None:
        link_cases(records)

    def verdicts(self, records: list[dict], settings: dict) -> list[dict]:
        return verdicts(records)

    def about(self, records: list[dict]) -> str:
        st = records[0]["settings"]
        layers = f"{st['layers']} layer{'s' if st['layers'] != 1 else ''}"
        return (f"Greedy generation of a random CausalLM ({layers}, {st['dim']} wide, "
                f"{st['heads']} heads, vocabulary {st['vocab_size']}, {st['positional']} positions, batch "
                f"{st['batch']}): {st['new_tokens']} new tokens after a {st['prompt_len']}-token prompt, "
                "with the KV cache (each step feeds the new token) and without it (each step recomputes "
                "the whole prefix). Seconds are the median of whole generations, prompt included; "
                "tokens/s counts new tokens; memory is the peak allocated beyond the model and prompt; "
                "speedup is seconds without / with the cache; 'same tokens' compares what both generated.")

    def plots(self, results: dict, cases: list[dict], out_dir: str, plt) -> list[str]:
        gen = [c for c in cases if c.get("tokens_per_s")]
        if not gen:
            return []
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = [f"{c['name']}\nP={c['settings']['prompt_len']} T={c['settings']['new_tokens']}" for c in gen]
        bars = ax.bar(range(len(gen)), [c["tokens_per_s"] for c in gen],
                      color=["tab:blue" if c["name"] == "kv_cache" else "tab:orange" for c in gen])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(gen)), labels, fontsize=8)
        ax.set_ylabel("new tokens per second")
        ax.set_title("generate: greedy CausalLM, with and without the KV cache")
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "generate_tokens_per_s.png"), dpi=90)
        plt.close(fig)
        return ["generate_tokens_per_s.png"]

    def tiny_options(self) -> dict | None:
        return {"suite_options": {SUITE: {"layers": 1, "dim": 32, "heads": 2, "vocab_size": 64, "prompt_len": 8,
                                          "new_tokens": 4}}}

__all__ = ["DEFAULT_SIZES", "LABELS", "PROFILE_SIZES", "SUITE", "VARIANTS", "GenerateCase", "GenerateOptions", "GenerateSuite", "build",
           "cases", "check_sizes", "link_cases", "measure_generation", "rows", "run_case", "verdicts"]
