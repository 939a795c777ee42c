"""Autoregressive generation with the KV cache: greedy, beam search, sampling.

* Greedy: the most likely next token at every step.
* Beam search (the standard form used for translation since Sutskever et al., 2014;
  length penalty from Wu et al., 2016, "Google's Neural Machine Translation System"):
  keep the ``num_beams`` best partial sequences by summed log-probability; a finished
  hypothesis (ending in ``eos_id``) is scored ``sum_logprob / generated_len **
  length_penalty``; the search for one input stops once ``num_beams`` hypotheses are
  finished and (without ``early_stopping``) no running beam can still beat the worst of
  them. Surviving beams are followed by reordering the model's state (its
  :meth:`KVCache.reorder`).
* Sampling: ``softmax(logits / temperature)``, optionally restricted to the ``top_k``
  most likely tokens and/or the nucleus (Holtzman et al., 2020, "The Curious Case of
  Neural Text Degeneration"): the smallest set of tokens whose probability reaches
  ``top_p``. ``seed=`` makes it reproducible (a private ``torch.Generator``).

The search drives any model that implements :class:`Generative` (``start_generation`` and
``generation_step``; :class:`~attnlab.models.CausalLM` and
:class:`~attnlab.models.EncoderDecoder` do): it imports no model class and never asks
which one it holds.

With the cache (default) the prompt is processed once and every step feeds only the new
token: a step costs O(layers (B dim^2 + B H T D)) instead of O(layers (B T dim^2 +
B H T^2 D)) for recomputing the whole prefix of length ``T`` (``use_cache=False``, kept
as the reference the cached path is tested against).

Shape legend: ``B`` batch, ``K`` beams, ``P`` prompt length, ``T`` current length,
``V`` vocabulary, ``S`` source length, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..utils import eval_mode

__all__ = ["Generative", "GenerationState", "generate", "filter_logits"]

_FROM_CONFIG: Any = object()


# -- what a model looks like to the search --------------------------------------------
@runtime_checkable
class GenerationState(Protocol):
    """What a model carries between steps (its KV cache, an encoder output); the search only reorders it."""

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index (B',)`` (the beams that survive, or a batch expanded to beams)."""
        ...


@runtime_checkable
class Generative(Protocol):
    """What :func:`generate` needs of a model.

    ``config`` gives the defaults of ``eos_id`` and ``pad_id``. The search calls
    :meth:`start_generation` once, then :meth:`generation_step` for every new token,
    feeding only the new token when the state holds a KV cache and the whole sequence
    otherwise, and reorders the state when beams are chosen.
    """

    config: Any

    def start_generation(self, inputs: Tensor, *, max_new_tokens: int, use_cache: bool = True,
                         src_mask: Tensor | None = None) -> tuple[Tensor, GenerationState]:
        """Check ``inputs``; return the prefix ``(B, P)`` the output starts with and the state.

        With ``use_cache`` the state holds a KV cache for ``P + max_new_tokens`` positions;
        ``src_mask`` is the ``(B, S)`` keep mask of a source, for models that read one.
        """
        ...

    def generation_step(self, tokens: Tensor, state: GenerationState) -> Tensor:
        """Logits ``(B, V)`` of the token that follows ``tokens (B, N)``."""
        ...


class _Stepper:
    """Feeds tokens to a model, with or without a KV cache; tracks what beams need reordering."""

    def __init__(self, model: Generative, inputs: Tensor, src_mask, use_cache: bool, max_new_tokens: int):
        self.model, self.use_cache = model, use_cache
        self.prefix, self.state = model.start_generation(inputs, max_new_tokens=max_new_tokens, use_cache=use_cache,
                                                         src_mask=src_mask)  # prefix (B, P)
        self.seq = self.prefix  # (B, T) what the model has been fed

    def start(self) -> Tensor:
        """Logits ``(B, V)`` of the first new token."""
        return self.model.generation_step(self.seq, self.state)

    def step(self, new: Tensor) -> Tensor:
        """Append ``new (B, 1)``; logits ``(B, V)`` of the token after it."""
        self.seq = torch.cat([self.seq, new], dim=1)  # (B, T+1)
        return self.model.generation_step(new if self.use_cache else self.seq, self.state)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beams that survive, or a batch expanded to beams)."""
        self.seq = self.seq.index_select(0, index)
        self.state.reorder(index)


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
    model: Generative,
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
    """Generate with a :class:`Generative` model (:class:`~attnlab.models.CausalLM`, :class:`~attnlab.models.EncoderDecoder`).

    Args:
        model: an ``nn.Module`` implementing :class:`Generative` (run in eval mode for the
            call; its mode is restored after).
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
    if not isinstance(model, Generative):
        raise ValueError(f"model must implement start_generation and generation_step (as CausalLM and "
                         f"EncoderDecoder do), got {type(model).__name__}")
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
