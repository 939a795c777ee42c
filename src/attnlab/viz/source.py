"""Where the explorer's maps come from: a model (pretrained MiniLM or a checkpoint) run on text.

* :func:`load_source` - ``"minilm"`` (all-MiniLM-L6-v2, :func:`attnlab.models.load_minilm`),
  a directory written by ``save_pretrained`` (with its ``tokenizer.json``, or a
  character ``vocab.json``), or a translation checkpoint (``tokenizer_src.json`` and
  ``tokenizer_tgt.json``; the maps are its encoder's self-attention over the source
  sentence). A run directory of ``attnlab train`` stands for its latest checkpoint. A
  Hugging Face model folder (``config.json`` with a transformers ``model_type``) runs in
  transformers with attnlab as its attention (:mod:`attnlab.integrations.hf`); the maps
  are its ``output_attentions``, and without a tokenizer the text is token ids.
* :func:`text_attention` - tokens and per-layer weights ``(H, N, N)`` of one text.
* :func:`approximate_attention` - the weights another mechanism (for example Performer)
  implies on the *same* queries and keys as the exact model, layer by layer: the fair
  side-by-side comparison (the model's own forward pass stays exact).
* :func:`with_mechanism` - a copy of a model whose attention layers all use another
  mechanism (errors then compound through the layers).

Time and memory of one forward pass with ``return_weights=True``: O(layers H N^2).
Shape legend: ``H`` heads, ``N`` tokens.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..integrations import hf
from ..mechanisms import Mechanism, create
from ..models import EncoderDecoder, TextTokenizer, from_pretrained, load_minilm
from ..models.io import FORMAT
from ..tasks.tokenizer import load_tokenizer
from ..train.checkpoint import resolve_checkpoint
from ..utils import eval_mode

__all__ = ["ModelSource", "TextAttention", "approximate_attention", "is_hf_folder", "load_source", "text_attention",
           "with_mechanism"]


@dataclass
class ModelSource:
    """A model ready to be run on text."""

    name: str
    model: nn.Module
    tokenize: object  # callable: str -> (input dict for the model, list of token strings)


@dataclass
class TextAttention:
    """Tokens of a text and the attention of every layer on it.

    Attributes:
        tokens: the ``N`` token strings.
        weights: one ``(H, N, N)`` float32 tensor per layer.
    """

    tokens: list[str]
    weights: list[Tensor]


def _hf_tokenize(tok):
    def run(text: str):
        enc = tok([text])
        toks = [tok.tokenizer.id_to_token(int(i)) for i in enc["input_ids"][0]]
        return enc, toks

    return run


def _char_tokenize(vocab: dict[str, int], unk: int | None):
    def run(text: str):
        ids, toks = [], []
        for ch in text:
            if ch in vocab:
                ids.append(vocab[ch])
            elif unk is not None:
                ids.append(unk)
            else:
                raise ValueError(f"text holds {ch!r}, which is not in the model's vocab.json and it has no <unk>")
            toks.append(ch)
        return {"tokens": torch.tensor([ids], dtype=torch.long)}, toks

    return run


class _SourceEncoder(nn.Module):
    """An encoder-decoder seen through its encoder: ``forward(tokens)`` is ``model.encode``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, return_weights: bool = False):
        return self.model.encode(tokens, return_weights=return_weights)


def _source_tokenize(tok, eos: int | None):
    """Encode with a ``tokenizers`` tokenizer and append ``eos`` (as the translation task does)."""

    def run(text: str):
        enc = tok.encode(text)
        ids, toks = list(enc.ids), list(enc.tokens)
        if eos is not None:
            ids.append(eos)
            toks.append(tok.id_to_token(eos) or "</s>")
        return {"tokens": torch.tensor([ids], dtype=torch.long)}, toks

    return run


class _HFModel(nn.Module):
    """A transformers model seen as an attnlab one: ``return_weights`` asks for ``output_attentions``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, return_weights: bool = False, **inputs):
        return self.model(**inputs, output_attentions=return_weights)


def is_hf_folder(d: Path) -> bool:
    """Whether ``d/config.json`` is a Hugging Face config: a ``model_type``, not attnlab's format."""
    try:
        meta = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "model_type" in meta and meta.get("format") != FORMAT


def _ids_tokenize(d: Path, vocab_size: int):
    """Text as token ids ("12 7 33" or "12,7,33"), for a model folder without a tokenizer."""

    def run(text: str):
        parts = text.replace(",", " ").split()
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError(f"{d} has no tokenizer ({', '.join(hf.TOKENIZER_FILES)}), so TEXT must be token ids "
                             f"separated by spaces or commas, like '12 7 33', got {text!r}")
        ids = [int(p) for p in parts]
        if max(ids) >= vocab_size:
            raise ValueError(f"token ids must be below the model's vocab_size {vocab_size}, got {max(ids)}")
        return {"input_ids": torch.tensor([ids], dtype=torch.long)}, parts

    return run


def _hf_folder_tokenize(tok):
    def run(text: str):
        enc = tok(text, return_tensors="pt")  # input_ids (1, N), and attention_mask, token_type_ids if it makes them
        return dict(enc), tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())

    return run


def _load_hf_folder(d: Path) -> ModelSource:
    """A Hugging Face model folder run in transformers with attnlab's exact attention."""
    model = hf.from_pretrained(d)  # attn_implementation="attnlab", checked to reach every layer
    tok = hf.load_tokenizer(d)
    tokenize = _ids_tokenize(d, model.config.vocab_size) if tok is None else _hf_folder_tokenize(tok)
    return ModelSource(f"{d.name} ({model.config.model_type}, transformers + attnlab)", _HFModel(model), tokenize)


def _checkpoint_dir(d: Path) -> Path:
    """``d`` itself when it holds a model, else the latest checkpoint of the run directory ``d``."""
    if (d / "config.json").is_file() or not (d / "checkpoints").is_dir():
        return d
    return resolve_checkpoint(d)


def load_source(spec: str | Path) -> ModelSource:
    """Load ``"minilm"``, an attnlab checkpoint or run directory, or a Hugging Face model folder.

    An :class:`~attnlab.models.EncoderDecoder` (a translation checkpoint) is shown through
    its encoder: the text is the source sentence and the maps are the encoder's
    self-attention, layer by layer.

    A Hugging Face folder loads through :func:`attnlab.integrations.hf.from_pretrained`
    (``AutoModel`` with ``attn_implementation="attnlab"``) with its tokenizer if it has one;
    without one, the text must be token ids ("12 7 33").

    Raises:
        ValueError: when the directory is not a checkpoint or has no tokenizer
            (``tokenizer.json``, ``vocab.json`` or ``tokenizer_src.json``), or is a Hugging
            Face folder whose model attnlab cannot run (naming the supported models).
        ImportError: when the MiniLM weights, ``tokenizers`` or (for a Hugging Face folder)
            ``transformers`` are missing (with the pip line).
    """
    if str(spec).lower() in ("minilm", "all-minilm-l6-v2"):
        model, tok = load_minilm()
        return ModelSource("all-MiniLM-L6-v2", model, _hf_tokenize(tok))
    d = Path(spec)
    if not d.is_dir():
        raise ValueError(f"checkpoint must be 'minilm' or a directory written by save_pretrained, not found: {d}")
    d = _checkpoint_dir(d)
    if is_hf_folder(d):
        return _load_hf_folder(d)
    model = from_pretrained(d)
    if isinstance(model, EncoderDecoder):
        if not (d / "tokenizer_src.json").is_file():
            raise ValueError(f"translation checkpoint {d} needs the tokenizer_src.json that 'attnlab train "
                             f"translation' writes beside config.json to read the source text")
        tok = load_tokenizer(d / "tokenizer_src.json")
        name = f"{d.name} (encoder self-attention)"
        return ModelSource(name, _SourceEncoder(model), _source_tokenize(tok, model.config.eos_id))
    if (d / "tokenizer.json").is_file():
        tokenize = _hf_tokenize(TextTokenizer(d / "tokenizer.json"))
        if type(model).__name__ != "Bert":
            inner = tokenize

            def tokenize(text: str):  # models other than Bert take the ids as ``tokens``
                enc, toks = inner(text)
                return {"tokens": enc["input_ids"]}, toks
    elif (d / "vocab.json").is_file():
        vocab = json.loads((d / "vocab.json").read_text())
        if isinstance(vocab, dict) and isinstance(vocab.get("chars"), list):
            vocab = vocab["chars"]  # the format `attnlab train chars` writes (id = position)
        if isinstance(vocab, list):
            vocab = {t: i for i, t in enumerate(vocab)}
        if not isinstance(vocab, dict):
            raise ValueError(f"{d / 'vocab.json'} must hold a list of tokens, {{\"chars\": [...]}} or a token -> id mapping")
        tokenize = _char_tokenize(vocab, vocab.get("<unk>"))
    else:
        raise ValueError(f"checkpoint {d} needs a tokenizer.json, a vocab.json or (translation) a "
                         f"tokenizer_src.json beside config.json to read text")
    return ModelSource(d.name, model, tokenize)


@torch.no_grad()
def text_attention(source: ModelSource, text: str) -> TextAttention:
    """Run ``source`` on ``text`` and return its tokens and per-layer ``(H, N, N)`` weights.

    Raises:
        ValueError: on empty text or a model that returns no attention weights.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    enc, toks = source.tokenize(text)
    with eval_mode(source.model):
        out = source.model(**enc, return_weights=True)
    att = getattr(out, "attentions", None) or getattr(out, "encoder_attentions", None)
    if not att:
        raise ValueError(f"{type(source.model).__name__} returned no attention weights for return_weights=True")
    return TextAttention(list(toks), [a[0].detach().float().cpu() for a in att])  # each (H, N, N)


def _check_mechanisms(source: ModelSource) -> None:
    if isinstance(source.model, _HFModel):
        raise ValueError(f"{source.name} runs in transformers, whose attention layers hold no attnlab mechanism to "
                         f"swap or compare; use an attnlab model for that")


def with_mechanism(source: ModelSource, name: str, **settings) -> ModelSource:
    """A copy of ``source`` whose every attention layer mixes values with mechanism ``name``.

    Settings go to :func:`attnlab.mechanisms.create`; the mechanism must return weights
    (``linear``, ``performer``, ``nystrom``, ``longformer``, ``bigbird``, ``exact``).
    Random features are drawn under ``torch.manual_seed(0)`` so the page is reproducible.

    Raises:
        ValueError: for an unknown mechanism or a model without attention layers.
    """
    _check_mechanisms(source)
    model = copy.deepcopy(source.model)
    n = 0
    torch.manual_seed(0)
    for module in model.modules():
        if isinstance(getattr(module, "mechanism", None), Mechanism):
            module.mechanism = create(name, **settings)
            n += 1
    if n == 0:
        raise ValueError(f"{type(model).__name__} has no attention layer with a mechanism to replace")
    label = name + (":" + ",".join(f"{k}={v}" for k, v in settings.items()) if settings else "")
    return ModelSource(label, model.eval(), source.tokenize)


class _Recorder(nn.Module):
    """Runs the layer's own mechanism and records ``other``'s weights on the same q, k, v."""

    def __init__(self, inner: nn.Module, other: nn.Module, log: list):
        super().__init__()
        self.inner, self.other, self.log = inner, other, log

    def forward(self, q, k, v, mask=None, *, bias=None, return_weights=False):
        _, w = self.other(q, k, v, mask, bias=bias, return_weights=True)  # (B, H, N, M)
        self.log.append(w[0].detach().float().cpu())  # (H, N, M)
        return self.inner(q, k, v, mask, bias=bias, return_weights=return_weights)


@torch.no_grad()
def approximate_attention(source: ModelSource, text: str, name: str, **settings) -> TextAttention:
    """Weights of mechanism ``name`` on the exact model's queries and keys of every layer.

    The model runs exactly as usual; at each attention layer the mechanism (built with
    :func:`attnlab.mechanisms.create` under ``torch.manual_seed(0)``) is also applied to
    that layer's ``q, k, v`` and its implied weights ``(H, N, M)`` are recorded. So layer
    ``l`` of the result differs from the exact weights only by the approximation, not by
    errors compounded in earlier layers.

    Raises:
        ValueError: for an unknown mechanism, one that returns no weights, or a model
            without attention layers.
    """
    _check_mechanisms(source)
    log: list = []
    swapped = []
    torch.manual_seed(0)
    try:
        for module in source.model.modules():
            mech = getattr(module, "mechanism", None)
            if isinstance(mech, Mechanism):
                module.mechanism = _Recorder(mech, create(name, **settings), log)
                swapped.append((module, mech))
        if not swapped:
            raise ValueError(f"{type(source.model).__name__} has no attention layer to compare")
        ta = text_attention(source, text)
    finally:
        for module, mech in swapped:
            module.mechanism = mech
    if len(log) != len(ta.weights):
        raise ValueError(f"recorded {len(log)} approximate maps for {len(ta.weights)} layers")
    return TextAttention(ta.tokens, log)
