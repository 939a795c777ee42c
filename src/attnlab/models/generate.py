"""Autoregressive generation with the KV cache: greedy, beam search, sampling.

* Greedy: the most likely next token at every step.
* Beam search (the standard form used for translation since Sutskever et al., 2014;
  length penalty from Wu et al., 2016, "Google's Neural Machine Translation System"):
  keep the ``num_beams`` best partial sequences by summed log-probability; a finished
  hypothesis (ending in ``eos_id``) is scored ``sum_logprob / generated_len **
  length_penalty``; the search for one input stops once ``num_beams`` hypotheses are
  finished and (without ``early_stopping``) no running beam can still beat the worst of
  them. Surviving beams are followed with :meth:`KVCache.reorder`.
* Sampling: ``softmax(logits / temperature)``, optionally restricted to the ``top_k``
  most likely tokens and/or the nucleus (Holtzman et al., 2020, "The Curious Case of
  Neural Text Degeneration"): the smallest set of tokens whose probability reaches
  ``top_p``. ``seed=`` makes it reproducible (a private ``torch.Generator``).

With the cache (default) the prompt is processed once and every step feeds only the new
token: a step costs O(layers (B dim^2 + B H T D)) instead of O(layers (B T dim^2 +
B H T^2 D)) for recomputing the whole prefix of length ``T`` (``use_cache=False``, kept
as the reference the cached path is tested against).

Shape legend: ``B`` batch, ``K`` beams, ``P`` prompt length, ``T`` current length,
``V`` vocabulary, ``S`` source length, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn

from .blocks import eval_mode

__all__ = ["generate", "filter_logits", "benchmark_generation"]

_FROM_CONFIG: Any = object()


# -- what a model looks like to the search --------------------------------------------
class _Stepper:
    """Feeds tokens to a model, with or without a KV cache; tracks what beams need reordering."""

    def __init__(self, model: nn.Module, inputs: Tensor, src_mask, use_cache: bool, max_new_tokens: int):
        from .causal_lm import CausalLM, check_tokens
        from .seq2seq import EncoderDecoder

        self.model, self.use_cache = model, use_cache
        self.seq2seq = isinstance(model, EncoderDecoder)
        if not (self.seq2seq or isinstance(model, CausalLM)):
            raise ValueError(f"model must be a CausalLM or an EncoderDecoder, got {type(model).__name__}")
        cfg = model.config
        if self.seq2seq:
            check_tokens(inputs, cfg.src_vocab_size, "src")
            if src_mask is not None and (not isinstance(src_mask, Tensor) or src_mask.shape != inputs.shape):
                got = tuple(src_mask.shape) if isinstance(src_mask, Tensor) else type(src_mask).__name__
                raise ValueError(f"src_mask must be a (batch, src_len) tensor like src {tuple(inputs.shape)}, got {got}")
            self.src_mask = None if src_mask is None else src_mask.bool()
            self.memory = model.encode(inputs, self.src_mask).last_hidden_state  # (B, S, dim)
            self.prefix = torch.full((inputs.shape[0], 1), cfg.bos_id, dtype=torch.long, device=inputs.device)
        else:
            check_tokens(inputs, cfg.vocab_size, "prompt")
            if src_mask is not None:
                raise ValueError("src_mask is for EncoderDecoder models; a CausalLM prompt batch shares one length")
            self.prefix = inputs
        self.seq = self.prefix  # (B, T) what the model has been fed
        cap = self.prefix.shape[1] + max_new_tokens
        self.cache = model.new_cache(capacity=cap) if use_cache else None

    def _logits(self, tokens: Tensor) -> Tensor:
        if self.seq2seq:
            out = self.model.decode(tokens, self.memory, self.src_mask, cache=self.cache)
            return out.logits[:, -1]  # (B, V)
        return self.model(tokens, cache=self.cache).logits[:, -1]  # (B, V)

    def start(self) -> Tensor:
        """Logits ``(B, V)`` of the first new token."""
        return self._logits(self.seq)

    def step(self, new: Tensor) -> Tensor:
        """Append ``new (B, 1)``; logits ``(B, V)`` of the token after it."""
        self.seq = torch.cat([self.seq, new], dim=1)  # (B, T+1)
        return self._logits(new if self.use_cache else self.seq)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beams that survive, or a batch expanded to beams)."""
        self.seq = self.seq.index_select(0, index)
        if self.seq2seq:
            self.memory = self.memory.index_select(0, index)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)


# -- token choice -----------------------------------------------------------------------
def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set to ``-inf`` the logits ``(B, V)`` outside the ``top_k`` best and outside the nucleus ``top_p``.

    ``top_k=0`` and ``top_p=1.0`` disable the respective filter. The nucleus keeps the
    smallest set of most likely tokens whose probability sum reaches ``top_p`` (always at
    least one token).
    """
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = logits.sort(dim=-1, descending=True)  # (B, V) each
        probs = srt.softmax(dim=-1)
        remove = probs.cumsum(dim=-1) - probs >= top_p  # mass before this token already reaches top_p
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))
    return logits


def _check(max_new_tokens, num_beams, do_sample, temperature, top_k, top_p, length_penalty) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(num_beams, int) or isinstance(num_beams, bool) or num_beams < 1:
        raise ValueError(f"num_beams must be a positive int, got {num_beams!r}")
    if do_sample and num_beams > 1:
        raise ValueError(f"sampling with beams is not supported: pass do_sample=False or num_beams=1, got {num_beams}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(length_penalty, (int, float)):
        raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")


def _greedy_or_sample(stepper: _Stepper, max_new_tokens: int, eos_id, pad_id: int, do_sample: bool,
                      temperature: float, top_k: int, top_p: float, gen: torch.Generator | None) -> Tensor:
    logits = stepper.start()  # (B, V)
    seq = stepper.prefix
    done = torch.zeros(seq.shape[0], dtype=torch.bool, device=seq.device)  # (B,)
    for t in range(max_new_tokens):
        if do_sample:
            probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(dim=-1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # (B,)
        else:
            nxt = logits.argmax(dim=-1)  # (B,)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            done = done | (nxt == eos_id)
        seq = torch.cat([seq, nxt[:, None]], dim=1)  # (B, T+1)
        if t == max_new_tokens - 1 or bool(done.all()):
            break
        logits = stepper.step(nxt[:, None])
    return seq


class _Hypotheses:
    """The ``k`` best finished hypotheses of one input, scored ``sum_logprob / len ** length_penalty``."""

    def __init__(self, k: int, length_penalty: float, early_stopping: bool):
        self.k, self.lp, self.early = k, length_penalty, early_stopping
        self.items: list[tuple[float, Tensor]] = []

    def add(self, tokens: Tensor, sum_logprob: float) -> None:
        score = sum_logprob / (max(tokens.numel(), 1) ** self.lp)
        self.items.append((score, tokens))
        self.items.sort(key=lambda it: it[0], reverse=True)
        del self.items[self.k:]

    def is_done(self, best_running: float, length: int) -> bool:
        if len(self.items) < self.k:
            return False
        if self.early:
            return True
        return best_running / (length ** self.lp) <= self.items[-1][0]

    def best(self) -> Tensor:
        return self.items[0][1]


def _beam_search(stepper: _Stepper, max_new_tokens: int, K: int, eos_id, pad_id: int, length_penalty: float,
                 early_stopping: bool) -> Tensor:
    logp = stepper.start().float().log_softmax(dim=-1)  # (B, V)
    B, V = logp.shape
    dev = logp.device
    prefix = stepper.prefix
    expand = torch.arange(B, device=dev).repeat_interleave(K)  # (B*K,)
    stepper.reorder(expand)
    logp = logp.index_select(0, expand)  # (B*K, V)
    scores = torch.zeros(B, K, device=dev)  # (B, K) summed log-probabilities
    scores[:, 1:] = float("-inf")  # at the start every beam is the same: expand beam 0 only
    gen = prefix.new_empty(B * K, 0)  # (B*K, t) generated tokens per beam
    hyps = [_Hypotheses(K, length_penalty, early_stopping) for _ in range(B)]
    done = [False] * B
    for t in range(max_new_tokens):
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)  # (B, K*V)
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
        top_beam, top_tok = top_i // V, top_i % V
        next_s = torch.zeros(B, K, device=dev)
        next_tok = torch.full((B, K), pad_id, dtype=torch.long, device=dev)
        next_beam = torch.arange(K, device=dev).repeat(B, 1)  # (B, K)
        ts, tb, tt = top_s.tolist(), top_beam.tolist(), top_tok.tolist()
        for b in range(B):
            if done[b]:
                continue
            j = 0
            for r in range(len(ts[b])):
                if eos_id is not None and tt[b][r] == eos_id:
                    if r < K:  # a finished hypothesis only counts if it is among the K best
                        row = b * K + tb[b][r]
                        hyps[b].add(torch.cat([gen[row], gen.new_tensor([eos_id])]), ts[b][r])
                    continue
                next_s[b, j], next_tok[b, j], next_beam[b, j] = ts[b][r], tt[b][r], tb[b][r]
                j += 1
                if j == K:
                    break
            done[b] = hyps[b].is_done(float(next_s[b].max()), t + 1)
        index = (torch.arange(B, device=dev) * K)[:, None] + next_beam  # (B, K) rows of the old beams
        index = index.view(-1)  # (B*K,)
        gen = torch.cat([gen.index_select(0, index), next_tok.view(-1, 1)], dim=1)  # (B*K, t+1)
        scores = next_s
        if all(done) or t == max_new_tokens - 1:
            break
        stepper.reorder(index)
        logp = stepper.step(next_tok.view(-1, 1)).float().log_softmax(dim=-1)  # (B*K, V)
    outs = []
    for b in range(B):
        if not done[b]:
            for k in range(K):
                s = float(scores[b, k])
                if s > float("-inf"):
                    hyps[b].add(gen[b * K + k], s)
        outs.append(hyps[b].best())
    width = max(o.numel() for o in outs)
    tail = prefix.new_full((B, width), pad_id)  # (B, new)
    for b, o in enumerate(outs):
        tail[b, : o.numel()] = o
    return torch.cat([prefix, tail], dim=1)


@torch.no_grad()
def generate(
    model: nn.Module,
    inputs: Tensor,
    *,
    max_new_tokens: int,
    num_beams: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = _FROM_CONFIG,
    pad_id: int | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool = False,
    seed: int | None = None,
    use_cache: bool = True,
    src_mask: Tensor | None = None,
) -> Tensor:
    """Generate with a :class:`~attnlab.models.CausalLM` or an :class:`~attnlab.models.EncoderDecoder`.

    Args:
        model: the model (run in eval mode for the call; its mode is restored after).
        inputs: CausalLM: the prompt ``(B, P)`` (the rows share one length, no padding);
            EncoderDecoder: the source ``(B, S)``.
        max_new_tokens: tokens to generate at most.
        num_beams: > 1 for beam search.
        do_sample: sample instead of taking the most likely token.
        temperature, top_k, top_p: sampling settings (``top_k=0``/``top_p=1`` = off).
        eos_id: end-of-sequence id (default: the config's; None = never stop early).
        pad_id: written after a row has ended (default: the config's ``pad_id``).
        length_penalty: beam scores are ``sum_logprob / generated_len ** length_penalty``.
        early_stopping: beam search stops an input as soon as ``num_beams`` hypotheses ended.
        seed: seed of the sampling generator (reproducible sampling).
        use_cache: use the KV cache (False recomputes the whole prefix every step).
        src_mask: EncoderDecoder only: ``(B, S)`` keep mask of the source (1/True = token).

    Returns:
        CausalLM: ``(B, P + n)``, the prompt followed by the new tokens; EncoderDecoder:
        ``(B, 1 + n)`` starting with ``bos_id``. ``n <= max_new_tokens``; rows that
        ended early are filled with ``pad_id``.
    """
    _check(max_new_tokens, num_beams, do_sample, temperature, top_k, top_p, length_penalty)
    cfg = model.config
    eos = cfg.eos_id if eos_id is _FROM_CONFIG else eos_id
    pad = cfg.pad_id if pad_id is None else pad_id
    with eval_mode(model):
        stepper = _Stepper(model, inputs, src_mask, use_cache, max_new_tokens)
        if num_beams > 1:
            return _beam_search(stepper, max_new_tokens, num_beams, eos, pad, float(length_penalty), early_stopping)
        gen = None
        if do_sample and seed is not None:
            gen = torch.Generator(device=inputs.device).manual_seed(int(seed))
        return _greedy_or_sample(stepper, max_new_tokens, eos, pad, do_sample, float(temperature), top_k,
                                 float(top_p), gen)


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
    from .causal_lm import CausalLM
    from .config import CausalLMConfig

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
