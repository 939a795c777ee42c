"""Subword (BPE) and word tokenizers trained with the Hugging Face ``tokenizers`` library.

Both split text at spaces (marking a word start with ``▁``, as SentencePiece does) and
around punctuation, so decoding restores the original spacing: "bushes." encodes as
``▁bushes`` ``.`` and decodes back to "bushes.". Special tokens take ids 0-3 in the
order ``<pad> <s> </s> <unk>``. The text tasks train them; :mod:`attnlab.viz` loads a
translation checkpoint's source tokenizer with :func:`load_tokenizer`. Time O(corpus
size) to train; memory O(vocabulary).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SPECIALS", "PAD", "BOS", "EOS", "UNK", "train_tokenizer", "load_tokenizer", "tokenizers_module"]

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = 0, 1, 2, 3


def tokenizers_module():
    """The ``tokenizers`` package, or ImportError with the install line."""
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError("text tasks need the tokenizers package: pip install 'attnlab[text]' "
                          "(or pip install tokenizers)") from e
    return tokenizers


def train_tokenizer(lines: Iterable[str], *, kind: str = "bpe", vocab_size: int = 8000, lowercase: bool = False,
                    min_frequency: int = 1):
    """A tokenizer trained on ``lines``.

    Args:
        kind: ``bpe`` (byte-pair-encoding subwords, Sennrich et al., 2016) or ``word``.
        vocab_size: largest vocabulary (specials included).
        lowercase: lowercase before splitting (NFKC normalization is always applied).
        min_frequency: pieces/words seen fewer times are not kept.
    """
    tk = tokenizers_module()
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "bpe":
        tok = tk.Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                      min_frequency=min_frequency, show_progress=False)
    elif kind == "word":
        tok = tk.Tokenizer(models.WordLevel(unk_token="<unk>"))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                            min_frequency=min_frequency, show_progress=False)
    else:
        raise ValueError(f"tokenizer must be 'bpe' or 'word', got {kind!r}")
    norms = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
    tok.normalizer = normalizers.Sequence(norms)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"), pre_tokenizers.Punctuation("isolated")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(list(lines), trainer)
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise ValueError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def load_tokenizer(path) -> object:
    """A tokenizer saved with ``tokenizer.save(path)`` (a JSON file, no code)."""
    return tokenizers_module().Tokenizer.from_file(str(path))
