"""What is exported for each model kind: tensor-only graphs, their dynamic axes, and their checks.

A model's forward takes Python objects (a :class:`~attnlab.models.DecoderCache`, attnlab
masks) and validates its inputs by reading them (``check_tokens`` reads the ids' min and
max), which a traced graph cannot do. So each kind exports small wrappers over the
model's own submodules whose inputs and outputs are tensors only:

* ``Bert`` (MiniLM): ``model``: ``input_ids, attention_mask, token_type_ids (B, N) ->
  last_hidden_state (B, N, dim), pooler_output (B, dim), sentence_embedding (B, dim)``
  (masked mean, L2-normalized, as :meth:`attnlab.models.Bert.encode`).
* ``SequenceClassifier``: ``model``: ``tokens, attention_mask (B, N) -> logits (B, K)``.
* ``ViT``: ``model``: ``images (B, C, S, S) -> logits (B, K)`` (only the batch is dynamic).
* ``CausalLM``: ``prefill``: ``tokens, attention_mask (B, N) -> logits (B, N, V)`` and
  every layer's ``present.I.key/value (B, Hkv, N, D)``; ``decode``: one token ``(B, 1)``,
  ``attention_mask (B, T + 1)`` and ``past.I.key/value (B, Hkv, T, D)`` -> ``logits
  (B, 1, V)`` and ``present.I.key/value (B, Hkv, T + 1, D)``.
* ``EncoderDecoder``: ``encoder``: ``src, src_mask (B, S) -> memory (B, S, dim)``;
  ``decoder_step``: ``tgt (B, 1), memory, src_mask, past.I.key/value (B, Hkv, T, D)``
  (``T = 0`` on the first step) -> ``logits (B, 1, V)`` and the presents. The
  cross-attention keys are projected from ``memory`` in every step (O(S dim^2) per layer
  and step; the graph stays one function of its inputs).

Each kind's ``check`` runs the exported graphs (through a callable, ONNX Runtime in
:mod:`attnlab.deploy.verify`) on held-out inputs -- batch sizes and lengths other than
the traced ones, right-padded rows -- and compares them with the model's *public* eager
forward (``model(...)``, ``model.decode(..., cache=...)``), so a wrapper that drifted
from its model fails the check instead of shipping.

Shape legend: ``B`` batch, ``N`` tokens, ``T`` cached positions, ``S`` source length,
``Hkv`` key/value heads, ``D`` head dim, ``V`` vocabulary, ``K`` classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.export import Dim

from ..layers import KVCache
from ..models import Bert, CausalLM, DecoderCache, EncoderDecoder, SequenceClassifier, ViT, mean_pool

__all__ = ["Check", "ConcatKVCache", "Graph", "Kind", "kind_of", "kinds"]

#: runs one exported graph: (graph name, named input tensors) -> named output tensors
Runner = Callable[[str, dict[str, Tensor]], dict[str, Tensor]]


class ConcatKVCache(KVCache):
    """A growing KV cache that concatenates instead of writing into preallocated storage.

    :class:`~attnlab.layers.KVCache` preallocates and writes in place (amortized O(1)
    copies per token in eager decoding); a traced graph needs the pure form, a
    ``cat`` whose output is the graph's ``present`` tensor.
    """

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B, Hkv, t, D)``, ``v (B, Hkv, t, Dv)``; return all keys and values."""
        if self._k is None:
            self._k, self._v = k, v
        else:
            self._k = torch.cat([self._k, k], dim=2)  # (B, Hkv, T + t, D)
            self._v = torch.cat([self._v, v], dim=2)  # (B, Hkv, T + t, Dv)
        self._len = self._k.shape[2]
        return self._k, self._v


@dataclass
class Graph:
    """One graph to export: a module over tensors, its names, a tracing input and its dynamic axes."""

    name: str
    module: nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    example: tuple[Tensor, ...]
    dynamic_shapes: tuple[dict[int, Any] | None, ...]


@dataclass
class Check:
    """One verified output: which graph, on what input, and the largest absolute difference to eager."""

    graph: str
    case: str
    output: str
    max_abs: float

    def to_dict(self) -> dict:
        return {"graph": self.graph, "case": self.case, "output": self.output, "max_abs": self.max_abs}


def _max_abs(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _tokens(gen: torch.Generator, b: int, n: int, vocab: int, lo: int = 1) -> Tensor:
    return torch.randint(lo, vocab, (b, n), generator=gen)  # (b, n)


def _keep(b: int, n: int, lengths: list[int]) -> Tensor:
    """Right-padded keep mask ``(b, n)`` int64: row ``i`` keeps its first ``lengths[i]`` positions."""
    return (torch.arange(n).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()  # (b, n)


def _cases(max_len: int) -> list[tuple[str, int, int, list[int]]]:
    """Held-out (description, batch, length, kept lengths) that differ from the traced batch 2, length 7."""
    n1, n2 = min(11, max_len), min(5, max_len)
    return [
        (f"batch 3, length {n1}, right-padded rows", 3, n1, [n1, max(2, n1 - 4), max(2, n1 // 2)]),
        (f"batch 1, length {n2}", 1, n2, [n2]),
    ]


class Kind:
    """How one model class is exported and checked (subclasses register themselves by model class)."""

    model_class: type = nn.Module
    #: the graphs this kind writes (names of the ``.onnx`` files)
    graph_names: tuple[str, ...] = ()

    def graphs(self, model: nn.Module) -> list[Graph]:
        """The graphs of ``model`` with tracing inputs (batch 2, length 7)."""
        raise NotImplementedError

    def check(self, model: nn.Module, run: Runner, gen: torch.Generator) -> list[Check]:
        """Run the exported graphs through ``run`` on held-out inputs and compare with eager ``model``."""
        raise NotImplementedError


_KINDS: dict[type, Kind] = {}


def _register(kind: type[Kind]) -> type[Kind]:
    _KINDS[kind.model_class] = kind()
    return kind


def kinds() -> dict[str, Kind]:
    """Exportable model classes by name."""
    return {cls.__name__: k for cls, k in _KINDS.items()}


def kind_of(model: nn.Module) -> Kind:
    """The :class:`Kind` of ``model``.

    Raises:
        ValueError: for a model class that has no export (naming the ones that have).
    """
    for cls, k in _KINDS.items():
        if type(model) is cls:
            return k
    raise ValueError(f"model must be one of {sorted(kinds())} to export, got {type(model).__name__}")


def _compare(graph: str, case: str, got: dict[str, Tensor], want: dict[str, Tensor]) -> list[Check]:
    return [Check(graph, case, name, _max_abs(got[name], ref)) for name, ref in want.items()]


class _ModelGraph(nn.Module):
    """One exported graph: ``forward`` is the graph's computation on ``self.model``, its inputs the graph's."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


def _encoder_example(max_len: int, vocab_size: int) -> tuple[Tensor, Tensor, dict[int, Dim]]:
    """An encoder graph's example tokens ``(2, 7)``, their keep mask (lengths 7 and 4) and the axes of both."""
    tokens = torch.randint(1, vocab_size, (2, 7))  # (2, 7)
    return tokens, _keep(2, 7, [7, 4]), {0: Dim("batch", min=1), 1: Dim("seq", min=2, max=max_len)}


# -- encoders ------------------------------------------------------------------------------
class _BertGraph(_ModelGraph):
    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor):
        m = self.model
        h = m.encoder(m.embeddings(input_ids, token_type_ids), attention_mask).last_hidden_state  # (B, N, dim)
        pooled = torch.tanh(m.pooler(h[:, 0]))  # (B, dim)
        sentence = F.normalize(mean_pool(h, attention_mask), p=2, dim=1)  # (B, dim)
        return h, pooled, sentence


@_register
class BertKind(Kind):
    model_class = Bert
    graph_names = ("model",)

    def graphs(self, model: Bert) -> list[Graph]:
        ids, keep, axes = _encoder_example(model.config.max_len, model.config.vocab_size)
        return [Graph("model", _BertGraph(model), ("input_ids", "attention_mask", "token_type_ids"),
                      ("last_hidden_state", "pooler_output", "sentence_embedding"),
                      (ids, keep, torch.zeros_like(ids)), (axes, axes, axes))]

    @torch.no_grad()
    def check(self, model: Bert, run: Runner, gen: torch.Generator) -> list[Check]:
        out = []
        for case, b, n, lengths in _cases(model.config.max_len):
            ids = _tokens(gen, b, n, model.config.vocab_size)
            keep, types = _keep(b, n, lengths), torch.zeros(b, n, dtype=torch.long)
            ref = model(ids, keep, types)
            want = {"last_hidden_state": ref.last_hidden_state, "pooler_output": ref.pooler_output,
                    "sentence_embedding": F.normalize(mean_pool(ref.last_hidden_state, keep), p=2, dim=1)}
            got = run("model", {"input_ids": ids, "attention_mask": keep, "token_type_ids": types})
            out += _compare("model", case, got, want)
        return out


class _ClassifierGraph(_ModelGraph):
    def forward(self, tokens: Tensor, attention_mask: Tensor):
        m = self.model
        x = m.embed_tokens(tokens)  # (B, N, dim)
        h = m.encoder(x, attention_mask).last_hidden_state  # (B, N, dim)
        pooled = h[:, 0] if m.config.pooling == "cls" else mean_pool(h, attention_mask)  # (B, dim)
        return m.head(m.dropout(pooled))  # (B, K)


@_register
class ClassifierKind(Kind):
    model_class = SequenceClassifier
    graph_names = ("model",)

    def graphs(self, model: SequenceClassifier) -> list[Graph]:
        tokens, keep, axes = _encoder_example(model.config.max_len, model.config.vocab_size)
        return [Graph("model", _ClassifierGraph(model), ("tokens", "attention_mask"), ("logits",), (tokens, keep),
                      (axes, axes))]

    @torch.no_grad()
    def check(self, model: SequenceClassifier, run: Runner, gen: torch.Generator) -> list[Check]:
        out = []
        for case, b, n, lengths in _cases(model.config.max_len):
            tokens, keep = _tokens(gen, b, n, model.config.vocab_size), _keep(b, n, lengths)
            got = run("model", {"tokens": tokens, "attention_mask": keep})
            out += _compare("model", case, got, {"logits": model(tokens, keep).logits})
        return out


class _ViTGraph(_ModelGraph):
    def forward(self, images: Tensor):
        return self.model(images).logits  # (B, K)


@_register
class ViTKind(Kind):
    model_class = ViT
    graph_names = ("model",)

    def graphs(self, model: ViT) -> list[Graph]:
        c, s = model.config.channels, model.config.image_size
        return [Graph("model", _ViTGraph(model), ("images",), ("logits",), (torch.randn(2, c, s, s),),
                      ({0: Dim("batch", min=1)},))]

    @torch.no_grad()
    def check(self, model: ViT, run: Runner, gen: torch.Generator) -> list[Check]:
        c, s = model.config.channels, model.config.image_size
        out = []
        for b in (3, 1):
            images = torch.randn(b, c, s, s, generator=gen)  # (b, C, S, S)
            got = run("model", {"images": images})
            out += _compare("model", f"batch {b}", got, {"logits": model(images).logits})
        return out


# -- decoders with a KV cache ----------------------------------------------------------------
def _kv_names(prefix: str, layers: int) -> tuple[str, ...]:
    return tuple(f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value"))


def _concat_cache(layers: int, past: tuple[Tensor, ...]) -> DecoderCache:
    """A self-attention-only cache of :class:`ConcatKVCache` holding ``past`` (k0, v0, k1, v1, ...)."""
    cache = DecoderCache(layers, cross_attention=False)
    cache.self_caches = [ConcatKVCache() for _ in range(layers)]
    for i, c in enumerate(cache.self_caches):
        if past:
            c.set(past[2 * i], past[2 * i + 1])
    return cache


def _presents(cache: DecoderCache) -> tuple[Tensor, ...]:
    return tuple(t for c in cache.self_caches for t in (c.k, c.v))


def _cache_tensors(cache: DecoderCache) -> dict[str, Tensor]:
    names = _kv_names("present", len(cache.self_caches))
    return dict(zip(names, (t for c in cache.self_caches for t in (c.k, c.v))))


class _CausalStep(_ModelGraph):
    """``prefill`` (no past) and ``decode`` (past given) of a :class:`CausalLM`."""

    def forward(self, tokens: Tensor, attention_mask: Tensor, *past: Tensor):
        m = self.model
        cache = _concat_cache(m.decoder.num_layers, past)
        x = m.embed_tokens(tokens)  # (B, N, dim)
        h = m.decoder(x, attention_mask, cache=cache).last_hidden_state  # (B, N, dim)
        return (m.logits_from_hidden(h), *_presents(cache))  # (B, N, V), then (B, Hkv, T + N, D) each


def _decoder_dims(seq: str, max_len: int) -> tuple[Dim, Dim, Dim]:
    """A decoder's dynamic axes: batch, the ``seq`` positions of a prompt (2 to ``max_len``) and the past."""
    return Dim("batch", min=1), Dim(seq, min=2, max=max_len), Dim("past", min=1, max=max_len - 1)


def _past_example(b: int, t: int, layers: int, kv_heads: int, head_dim: int) -> tuple[Tensor, ...]:
    return tuple(torch.randn(b, kv_heads, t, head_dim) for _ in range(2 * layers))  # (b, Hkv, t, D) each


@_register
class CausalLMKind(Kind):
    model_class = CausalLM
    graph_names = ("prefill", "decode")

    def graphs(self, model: CausalLM) -> list[Graph]:
        cfg, layers = model.config, model.decoder.num_layers
        b, n, t = _decoder_dims("seq", cfg.max_len)
        kv = _kv_names("past", layers)
        step = _CausalStep(model)
        tokens = torch.randint(1, cfg.vocab_size, (2, 7))  # (2, 7)
        prefill = Graph("prefill", step, ("tokens", "attention_mask"), ("logits", *_kv_names("present", layers)),
                        (tokens, _keep(2, 7, [7, 4])), ({0: b, 1: n}, {0: b, 1: n}))
        past = _past_example(2, 7, layers, cfg.kv_heads or cfg.heads, cfg.head_dim)
        decode = Graph("decode", step, ("tokens", "attention_mask", *kv), ("logits", *_kv_names("present", layers)),
                       (tokens[:, :1], _keep(2, 8, [8, 8]), *past),
                       ({0: b}, {0: b, 1: t + 1}, *({0: b, 2: t} for _ in kv)))
        return [prefill, decode]

    @torch.no_grad()
    def check(self, model: CausalLM, run: Runner, gen: torch.Generator) -> list[Check]:
        """Prefill a prompt, then decode 3 tokens feeding back the graph's own presents, against eager + cache."""
        cfg, layers = model.config, model.decoder.num_layers
        out = []
        for case, b, n, lengths in _cases(cfg.max_len - 4):
            tokens, keep = _tokens(gen, b, n, cfg.vocab_size), _keep(b, n, lengths)
            cache = model.new_cache(n + 4)
            ref = model(tokens, keep, cache=cache)
            got = run("prefill", {"tokens": tokens, "attention_mask": keep})
            out += _compare("prefill", case, got, {"logits": ref.logits, **_cache_tensors(cache)})
            past = {f"past{name[len('present'):]}": got[name] for name in _kv_names("present", layers)}
            for step in range(3):
                nxt = _tokens(gen, b, 1, cfg.vocab_size)  # (b, 1)
                keep = torch.cat([keep, torch.ones(b, 1, dtype=torch.long)], dim=1)  # (b, T + 1)
                ref = model(nxt, keep, cache=cache)
                got = run("decode", {"tokens": nxt, "attention_mask": keep, **past})
                out += _compare("decode", f"{case}, step {step + 1}", got,
                                {"logits": ref.logits, **_cache_tensors(cache)})
                past = {f"past{name[len('present'):]}": got[name] for name in _kv_names("present", layers)}
        return out


class _EncoderGraph(_ModelGraph):
    def forward(self, src: Tensor, src_mask: Tensor):
        m = self.model
        x = m.embed_tokens(src, m.src_embed)  # (B, S, dim)
        return m.encoder(x, src_mask).last_hidden_state  # (B, S, dim)


class _DecoderStep(_ModelGraph):
    def forward(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, *past: Tensor):
        m = self.model
        cache = _concat_cache(m.decoder.num_layers, past)
        x = m.embed_tokens(tgt, m.tgt_embed)  # (B, 1, dim)
        h = m.decoder(x, None, memory=memory, memory_mask=src_mask, cache=cache).last_hidden_state  # (B, 1, dim)
        logits = F.linear(h, m.tgt_embed.weight) if m.lm_head is None else m.lm_head(h)  # (B, 1, V)
        return (logits, *_presents(cache))


@_register
class EncoderDecoderKind(Kind):
    model_class = EncoderDecoder
    graph_names = ("encoder", "decoder_step")

    def graphs(self, model: EncoderDecoder) -> list[Graph]:
        cfg, layers = model.config, model.decoder.num_layers
        b, s, t = _decoder_dims("src", cfg.max_len)
        src, keep = torch.randint(1, cfg.src_vocab_size, (2, 7)), _keep(2, 7, [7, 4])  # (2, 7) each
        encoder = Graph("encoder", _EncoderGraph(model), ("src", "src_mask"), ("memory",), (src, keep),
                        ({0: b, 1: s}, {0: b, 1: s}))
        kv = _kv_names("past", layers)
        past = _past_example(2, 3, layers, cfg.kv_heads or cfg.heads, cfg.head_dim)
        step = Graph("decoder_step", _DecoderStep(model), ("tgt", "memory", "src_mask", *kv),
                     ("logits", *_kv_names("present", layers)),
                     (src[:, :1], torch.randn(2, 7, cfg.dim), keep, *past),
                     ({0: b}, {0: b, 1: s}, {0: b, 1: s}, *({0: b, 2: t} for _ in kv)))
        return [encoder, step]

    @torch.no_grad()
    def check(self, model: EncoderDecoder, run: Runner, gen: torch.Generator) -> list[Check]:
        """Encode, then 3 decoder steps from an empty past (``T = 0``) on the graph's own memory and presents."""
        cfg, layers = model.config, model.decoder.num_layers
        hkv, out = cfg.kv_heads or cfg.heads, []
        for case, b, n, lengths in _cases(cfg.max_len - 4):
            src, keep = _tokens(gen, b, n, cfg.src_vocab_size), _keep(b, n, lengths)
            memory = model.encode(src, keep.bool()).last_hidden_state  # (b, n, dim)
            got = run("encoder", {"src": src, "src_mask": keep})
            out += _compare("encoder", case, got, {"memory": memory})
            mem = got["memory"]
            cache = model.new_cache(4)
            past = {name: torch.zeros(b, hkv, 0, cfg.head_dim) for name in _kv_names("past", layers)}
            tgt = torch.full((b, 1), cfg.bos_id, dtype=torch.long)
            for step in range(3):
                ref = model.decode(tgt, memory, keep.bool(), cache=cache)
                got = run("decoder_step", {"tgt": tgt, "memory": mem, "src_mask": keep, **past})
                out += _compare("decoder_step", f"{case}, step {step + 1}", got,
                                {"logits": ref.logits, **_cache_tensors(cache)})
                past = {f"past{name[len('present'):]}": got[name] for name in _kv_names("present", layers)}
                tgt = _tokens(gen, b, 1, cfg.tgt_vocab_size)
        return out
