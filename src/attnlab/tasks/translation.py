"""Translation with an encoder-decoder Transformer on any pair of aligned text files.

Vaswani et al., 2017: the source is encoded bidirectionally, the target decoded
causally with cross-attention, trained with teacher forcing and label smoothing, and
translated with beam search. Source and target each get a tokenizer (BPE subwords by
default, or words) trained on the training side only with the ``tokenizers`` library;
sentences are bucketed by length so a batch carries little padding. Quality is corpus
BLEU (Papineni et al., 2002) computed by ``sacrebleu`` (Post, 2018) on detokenized text
against the raw references, as is standard for Multi30k.

Data: ``--data DIR`` holding ``{split}.{lang}`` or ``{split}.{lang}.gz`` for the splits
``train``, ``val`` and ``test`` (Multi30k's test 2016 is ``test_2016_flickr``), or
``--data SRC_FILE,TGT_FILE`` (the pairs are then cut 98/1/1 by the seed). Without ``--data``,
the fetched Multi30k (``attnlab data fetch multi30k``).

Time per step O(layers B (S + T) dim^2 + attention); memory O(layers B (S + T) dim).
Shape legend: ``B`` batch, ``S`` source tokens, ``T`` target tokens, ``V`` vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data import locate
from ..utils import eval_mode
from .base import (
    EpochBatcher,
    MissingDataError,
    Task,
    masked_cross_entropy,
    perplexity,
    read_lines,
    register_task,
    split_indices,
)
from .tokenizer import BOS, EOS, PAD, load_tokenizer, train_tokenizer

__all__ = ["TranslationTask", "corpus_bleu"]



def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacrebleu's corpus BLEU (default 13a tokenization) of detokenized sentences."""
    try:
        import sacrebleu
    except ImportError as e:
        raise ImportError("BLEU needs sacrebleu: pip install sacrebleu") from e
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


@register_task
class TranslationTask(Task):
    """Sentence-level translation (an :class:`~attnlab.models.EncoderDecoder`)."""

    name = "translation"
    model_type = "EncoderDecoder"
    option_defaults: dict[str, Any] = {
        "src": "de", "tgt": "en", "train": "train", "val": "val", "test": "test_2016_flickr",
        "tokenizer": "bpe", "vocab_size": 8000, "lowercase": False, "max_tokens": 100,
        "eval_sentences": 200, "beams": 4, "length_penalty": 1.0, "train_limit": 0,
    }
    model_defaults: dict[str, Any] = {"dim": 256, "heads": 4, "layers": 3, "decoder_layers": 3, "ff_dim": 1024,
                                      "dropout": 0.1, "positional": "sinusoidal", "max_len": 256,
                                      "scale_embeddings": True}
    train_defaults: dict[str, Any] = {"steps": 4000, "batch_size": 128, "lr": 7e-4, "schedule": "inverse_sqrt",
                                      "warmup": 400, "beta2": 0.98, "weight_decay": 1e-4, "label_smoothing": 0.1,
                                      "eval_every": 500, "eval_batches": 8, "grad_clip": 1.0}
    item_unit = "tok"

    def __init__(self, data: str | None = None, seed: int = 0, **options: Any):
        super().__init__(data, seed, **options)
        self.src_tok = self.tgt_tok = None
        if self.options["beams"] < 1 or self.options["max_tokens"] < 2 or self.options["vocab_size"] < 8:
            raise ValueError(f"translation needs beams >= 1, max_tokens >= 2, vocab_size >= 8, got {self.options}")

    # -- data ---------------------------------------------------------------------------
    def _file(self, directory: Path, split: str, lang: str) -> Path:
        for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
            if (directory / name).is_file():
                return directory / name
        raise MissingDataError(
            f"task 'translation' expected {directory / f'{split}.{lang}'}[.gz]; pass --data DIR holding "
            f"{{train,val,test}}.{{src,tgt}} files or --data SRC_FILE,TGT_FILE, "
            f"and name the splits with --task-opt train=...,val=...,test=..."
        )

    def _read_pairs(self) -> dict[str, tuple[list[str], list[str]]]:
        o = self.options
        raw = self.data if self.data is not None else str(locate("multi30k"))
        if "," in raw and not Path(raw).exists():
            a, b = (Path(p.strip()).expanduser() for p in raw.split(",", 1))
            for p in (a, b):
                if not p.is_file():
                    raise MissingDataError(f"task 'translation' expected the text file {str(p)!r}, which does not exist")
            src, tgt = read_lines(a), read_lines(b)
            self._check_aligned(src, tgt, a, b)
            tr, va, te = split_indices(len(src), (0.98, 0.01, 0.01), self.seed)
            return {k: ([src[i] for i in idx], [tgt[i] for i in idx]) for k, idx in (("train", tr), ("val", va), ("test", te))}
        directory = Path(raw)
        if not directory.is_dir():
            raise MissingDataError(f"task 'translation' expected a directory or SRC_FILE,TGT_FILE at {raw!r}, which "
                                   f"does not exist (without --data, the fetched Multi30K: attnlab data fetch multi30k)")
        out = {}
        for key in ("train", "val", "test"):
            a, b = self._file(directory, o[key], o["src"]), self._file(directory, o[key], o["tgt"])
            src, tgt = read_lines(a), read_lines(b)
            self._check_aligned(src, tgt, a, b)
            out[key] = (src, tgt)
        return out

    @staticmethod
    def _check_aligned(src: list[str], tgt: list[str], a: Path, b: Path) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"aligned files must have as many lines: {a} has {len(src)}, {b} has {len(tgt)}")

    def setup(self) -> None:
        o = self.options
        self.text = self._read_pairs()
        if o["train_limit"]:
            self.text["train"] = tuple(side[: o["train_limit"]] for side in self.text["train"])
        src_train, tgt_train = self.text["train"]
        if self.src_tok is None:
            self.src_tok = train_tokenizer(src_train, kind=o["tokenizer"], vocab_size=o["vocab_size"], lowercase=o["lowercase"])
            self.tgt_tok = train_tokenizer(tgt_train, kind=o["tokenizer"], vocab_size=o["vocab_size"], lowercase=o["lowercase"])
        self.ids = {k: self._encode_pairs(*v) for k, v in self.text.items()}
        m = o["max_tokens"]
        keep = [i for i, (s, t) in enumerate(self.ids["train"]) if len(s) <= m and len(t) <= m]
        self.ids["train"] = [self.ids["train"][i] for i in keep]
        if not self.ids["train"]:
            raise ValueError(f"no training pair has at most max_tokens={m} tokens on both sides")
        self._batcher: EpochBatcher | None = None

    def _encode_pairs(self, src: list[str], tgt: list[str]) -> list[tuple[list[int], list[int]]]:
        s = [e.ids + [EOS] for e in self.src_tok.encode_batch(src)]
        t = [[BOS] + e.ids + [EOS] for e in self.tgt_tok.encode_batch(tgt)]
        return list(zip(s, t))

    def model_config(self) -> dict[str, Any]:
        self.ensure_setup()
        longest = max(max(len(s), len(t)) for split in self.ids.values() for s, t in split)
        return {"src_vocab_size": self.src_tok.get_vocab_size(), "tgt_vocab_size": self.tgt_tok.get_vocab_size(),
                "pad_id": PAD, "bos_id": BOS, "eos_id": EOS, "max_len": max(256, longest + 2 * self.options["max_tokens"])}

    @staticmethod
    def _pad(rows: list[list[int]]) -> Tensor:
        out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out

    def _collate(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, Tensor]:
        src = self._pad([s for s, _ in pairs])
        tgt = self._pad([t for _, t in pairs])
        return {"src": src, "src_mask": src != PAD, "tgt": tgt, "tgt_mask": tgt != PAD}

    def global_batch(self, step: int, batch_size: int) -> dict[str, Tensor]:
        train = self.ids["train"]
        if self._batcher is None or self._batcher.batch_size != batch_size:
            self._batcher = EpochBatcher(len(train), batch_size, self.seed, lengths=[len(s) + len(t) for s, t in train])
        return self._collate([train[i] for i in self._batcher.indices(step)])

    def data_position(self, step: int, batch_size: int) -> dict[str, Any]:
        self.ensure_setup()
        return EpochBatcher(len(self.ids["train"]), batch_size, self.seed).position(step)

    def items_per_batch(self, batch: dict[str, Tensor]) -> int:
        return int(batch["tgt_mask"][:, 1:].sum())

    # -- training and evaluation ----------------------------------------------------------
    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0,
             return_weights: bool = False):
        tgt, tm = batch["tgt"], batch["tgt_mask"]
        out = model(batch["src"], tgt[:, :-1], batch["src_mask"], tm[:, :-1], return_weights=return_weights)
        attn = None
        if return_weights:
            attn = tuple(a for group in (out.encoder_attentions, out.decoder_attentions, out.cross_attentions)
                         for a in (group or ()))
        return masked_cross_entropy(out.logits, tgt[:, 1:], tm[:, 1:], label_smoothing), attn

    @torch.no_grad()
    def translate_ids(self, model: nn.Module, sources: list[list[int]], *, beams: int = 1,
                      batch_size: int = 64, length_penalty: float = 1.0) -> list[list[int]]:
        """Target ids (without specials) for source id lists, in the input order."""
        device = next(model.parameters()).device
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        out: list[list[int]] = [[] for _ in sources]
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = self._pad([sources[i] for i in chunk]).to(device)
            longest = src.shape[1]
            new = min(int(longest * 1.5) + 10, self.options["max_tokens"] * 2)
            gen = model.generate(src, max_new_tokens=new, src_mask=src != PAD, num_beams=beams,
                                 length_penalty=length_penalty)
            for row, i in zip(gen[:, 1:].tolist(), chunk):
                ids = []
                for t in row:
                    if t == EOS or t == PAD:
                        break
                    ids.append(t)
                out[i] = ids
        return out

    def translate(self, model: nn.Module, sentences: list[str], *, beams: int | None = None) -> list[str]:
        """Translate raw sentences with the checkpoint's tokenizers."""
        src = [e.ids + [EOS] for e in self.src_tok.encode_batch(sentences)]
        hyp = self.translate_ids(model, src, beams=beams or self.options["beams"],
                                 length_penalty=self.options["length_penalty"])
        return [self.tgt_tok.decode(h) for h in hyp]

    @torch.no_grad()
    def alignment(self, model: nn.Module, sentence: str, *, beams: int | None = None,
                  layer: int = -1) -> tuple[Tensor, list[str], list[str], str]:
        """Translate ``sentence`` and return where the decoder looked while writing it.

        The translation is fed back teacher-forced and the cross-attention of decoder
        layer ``layer`` is averaged over heads: row ``t`` is the step that produced target
        token ``t`` (the last row produces ``</s>``), column ``s`` a source token (the last
        is ``</s>``), rows sum to one.

        Returns:
            ``(weights (T, S), source tokens, target tokens, translation)``.

        Raises:
            ValueError: for an empty sentence or a layer the decoder does not have.
        """
        if not isinstance(sentence, str) or not sentence.strip():
            raise ValueError(f"sentence must be a non-empty string, got {sentence!r}")
        n_layers = model.config.dec_layers
        if not -n_layers <= layer < n_layers:
            raise ValueError(f"layer must be in [{-n_layers}, {n_layers}) for a {n_layers}-layer decoder, got {layer}")
        enc = self.src_tok.encode(sentence)
        src_ids = enc.ids + [EOS]
        hyp = self.translate_ids(model, [src_ids], beams=beams or self.options["beams"],
                                 length_penalty=self.options["length_penalty"])[0]
        device = next(model.parameters()).device
        src = torch.tensor([src_ids], device=device)  # (1, S)
        tgt = torch.tensor([[BOS] + hyp], device=device)  # (1, T): the decoder's inputs
        with eval_mode(model):
            out = model(src, tgt, return_weights=True)
        weights = out.cross_attentions[layer][0].float().mean(0).cpu()  # (T, S)
        name = self.tgt_tok.id_to_token
        return (weights, list(enc.tokens) + [name(EOS)], [name(t) for t in hyp] + [name(EOS)],
                self.tgt_tok.decode(hyp))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 64,
                 max_batches: int | None = None, final: bool = False) -> dict[str, float]:
        self.ensure_setup()
        pairs = self.ids[split]
        device = next(model.parameters()).device
        chunks = [pairs[i:i + batch_size] for i in range(0, len(pairs), batch_size)]
        loss_sum, n_tok = 0.0, 0
        for chunk in chunks[:max_batches] if max_batches else chunks:
            b = {k: v.to(device) for k, v in self._collate(chunk).items()}
            loss, _ = self.loss(model, b)
            k = int(b["tgt_mask"][:, 1:].sum())
            loss_sum += float(loss) * k
            n_tok += k
        loss = loss_sum / max(n_tok, 1)
        n = len(pairs) if final else min(len(pairs), self.options["eval_sentences"])
        beams = self.options["beams"] if final else 1
        if n == 0:
            return {"loss": loss, "perplexity": perplexity(loss)}
        hyp_ids = self.translate_ids(model, [s for s, _ in pairs[:n]], beams=beams,
                                     length_penalty=self.options["length_penalty"])
        hyps = [self.tgt_tok.decode(h) for h in hyp_ids]
        refs = self.text[split][1][:n]
        bleu = corpus_bleu(hyps, refs)
        return {"loss": loss, "perplexity": perplexity(loss), "bleu": bleu, "bleu_sentences": n, "beams": beams}

    # -- assets ---------------------------------------------------------------------------
    def save_assets(self, directory: Path) -> None:
        self.src_tok.save(str(directory / "tokenizer_src.json"))
        self.tgt_tok.save(str(directory / "tokenizer_tgt.json"))

    def load_assets(self, directory: Path) -> bool:
        a, b = Path(directory) / "tokenizer_src.json", Path(directory) / "tokenizer_tgt.json"
        if not (a.is_file() and b.is_file()):
            return False
        self.src_tok, self.tgt_tok = load_tokenizer(a), load_tokenizer(b)
        return True


