"""Model configurations: frozen dataclasses, validated on creation, round-tripping through JSON.

Every model of :mod:`attnlab.models` is built from one config. The shared knobs of a
Transformer stack live in :class:`TransformerConfig` (width, heads, depth, norm
placement, positional encoding, attention mechanism, activation checkpointing); the
model configs add what is particular to them (vocabulary, classes, image size). A config
is validated in ``__post_init__`` and raises ``ValueError`` naming the field and the
value seen; ``to_dict``/``from_dict`` and ``to_json``/``from_json`` round-trip it.

No tensors here: configs are plain values (time and memory O(1)).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..mechanisms import mechanisms
from ..utils import int_at_least, positive_int, positive_number, probability

__all__ = [
    "POSITIONALS",
    "ACTIVATIONS",
    "TransformerConfig",
    "CausalLMConfig",
    "Seq2SeqConfig",
    "ClassifierConfig",
    "ViTConfig",
    "RegressionConfig",
    "VideoConfig",
    "VIDEO_ATTENTIONS",
    "BertConfig",
    "GATConfig",
    "GRAPH_CONVS",
    "GlimpseConfig",
    "GLIMPSE_CORES",
    "GLIMPSE_POLICIES",
    "GLIMPSE_STARTS",
    "GLIMPSE_POLICY_GRADS",
    "GLIMPSE_WHATS",
    "ConvConfig",
]

#: accepted values of ``TransformerConfig.positional``
POSITIONALS = ("sinusoidal", "learned", "rotary", "alibi", "t5", "none")
#: accepted values of ``TransformerConfig.activation`` (``gelu`` is the exact erf form)
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")





def _choice(name: str, value: Any, options: tuple) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")


class _JSONConfig:
    """``to_dict``/``from_dict``/``to_json``/``from_json`` for the dataclasses below."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Rebuild from :meth:`to_dict` output; unknown keys raise ValueError naming them."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}.from_dict needs a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def to_json(self, indent: int | None = 2) -> str:
        """The config as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        """Rebuild from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True, kw_only=True)
class TransformerConfig(_JSONConfig):
    """The knobs shared by every Transformer stack.

    Attributes:
        dim: model width.
        heads: query heads ``H``; ``dim`` must be divisible by it.
        layers: number of layers (the encoder's, for encoder-decoder models).
        kv_heads: key/value heads (grouped-query attention); None = ``heads``.
        ff_dim: hidden width of the feed-forward block; None = ``4 * dim``.
        dropout: dropout on embeddings and on every residual branch (training only).
        attn_dropout: dropout on attention weights (used by the ``exact`` mechanism
            unless ``mechanism_settings`` sets ``dropout`` itself).
        activation: feed-forward nonlinearity, one of :data:`ACTIVATIONS`.
        norm_first: True for pre-norm (``x + f(norm(x))``, with a final norm after the
            stack), False for the original post-norm (``norm(x + dropout(f(x)))``).
        norm_eps: LayerNorm epsilon.
        positional: one of :data:`POSITIONALS`: ``sinusoidal``/``learned`` are added to
            the embeddings, ``rotary`` rotates q and k, ``alibi``/``t5`` bias the scores
            (causal in decoders, symmetric/bidirectional in encoders), ``none``.
        max_len: positions of a ``learned`` table (longer inputs raise ValueError).
        rope_base: frequency base of ``rotary``.
        t5_buckets, t5_max_distance: bucketing of the ``t5`` relative bias.
        mechanism: name of an :mod:`attnlab.mechanisms` mechanism (``exact`` default).
        mechanism_settings: keyword settings for ``attnlab.mechanisms.create``.
        checkpointing: recompute each layer in backward (``torch.utils.checkpoint``,
            ``use_reentrant=False``) to save activation memory while training.
        bias: whether linear layers have biases.
    """

    dim: int = 64
    heads: int = 4
    layers: int = 2
    kv_heads: int | None = None
    ff_dim: int | None = None
    dropout: float = 0.0
    attn_dropout: float = 0.0
    activation: str = "gelu"
    norm_first: bool = True
    norm_eps: float = 1e-5
    positional: str = "sinusoidal"
    max_len: int = 512
    rope_base: float = 10000.0
    t5_buckets: int = 32
    t5_max_distance: int = 128
    mechanism: str = "exact"
    mechanism_settings: dict[str, Any] = field(default_factory=dict)
    checkpointing: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        positive_int(self.dim, "dim")
        positive_int(self.heads, "heads")
        positive_int(self.layers, "layers")
        if self.dim % self.heads != 0:
            raise ValueError(f"dim must be divisible by heads, got dim={self.dim} and heads={self.heads}")
        if self.kv_heads is not None:
            positive_int(self.kv_heads, "kv_heads")
            if self.heads % self.kv_heads != 0:
                raise ValueError(f"kv_heads must divide heads, got kv_heads={self.kv_heads} and heads={self.heads}")
        if self.ff_dim is not None:
            positive_int(self.ff_dim, "ff_dim")
        probability(self.dropout, "dropout")
        probability(self.attn_dropout, "attn_dropout")
        _choice("activation", self.activation, ACTIVATIONS)
        if not isinstance(self.norm_first, bool):
            raise ValueError(f"norm_first must be a bool, got {self.norm_first!r}")
        positive_number(self.norm_eps, "norm_eps")
        _choice("positional", self.positional, POSITIONALS)
        positive_int(self.max_len, "max_len")
        if not isinstance(self.rope_base, (int, float)) or not self.rope_base > 1:
            raise ValueError(f"rope_base must be a number > 1, got {self.rope_base!r}")
        if self.positional == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary needs an even head dim, got dim={self.dim} / heads={self.heads} = {self.head_dim}")
        int_at_least(self.t5_buckets, "t5_buckets", 4)
        int_at_least(self.t5_max_distance, "t5_max_distance", 2)
        if self.mechanism not in mechanisms():
            raise ValueError(f"mechanism must be one of {sorted(mechanisms())}, got {self.mechanism!r}")
        if not isinstance(self.mechanism_settings, dict):
            raise ValueError(f"mechanism_settings must be a dict, got {type(self.mechanism_settings).__name__}")
        try:
            json.dumps(self.mechanism_settings)
        except (TypeError, ValueError) as e:
            raise ValueError(f"mechanism_settings must be JSON-serializable, got {self.mechanism_settings!r}") from e
        if not isinstance(self.checkpointing, bool):
            raise ValueError(f"checkpointing must be a bool, got {self.checkpointing!r}")

    @property
    def head_dim(self) -> int:
        """Per-head size ``dim // heads``."""
        return self.dim // self.heads

    @property
    def ff(self) -> int:
        """Feed-forward hidden width (``ff_dim`` or ``4 * dim``)."""
        return self.ff_dim if self.ff_dim is not None else 4 * self.dim


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _token_id(name: str, value: Any, vocab: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
        raise ValueError(f"{name} must be a token id in [0, {vocab}), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class CausalLMConfig(TransformerConfig):
    """A decoder-only language model.

    Attributes:
        vocab_size: number of token ids.
        tie_embeddings: the output projection reuses the token embedding matrix.
        pad_id: id written after a sequence ended in :func:`~attnlab.models.generate.generate`.
        eos_id: end-of-sequence id (None: generation runs to ``max_new_tokens``).
        scale_embeddings: Vaswani et al.'s embedding scheme: initialize the token
            embedding ``N(0, dim**-0.5)`` and multiply it by ``sqrt(dim)`` on the way in, so
            tokens enter at unit scale next to a sinusoidal encoding while a tied output
            projection starts with unit-scale logits. False: GPT-2's ``N(0, 0.02)``, unscaled.
    """

    vocab_size: int
    tie_embeddings: bool = True
    pad_id: int = 0
    eos_id: int | None = None
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _bool("scale_embeddings", self.scale_embeddings)
        positive_int(self.vocab_size, "vocab_size")
        _token_id("pad_id", self.pad_id, self.vocab_size)
        _token_id("eos_id", self.eos_id, self.vocab_size, optional=True)


@dataclass(frozen=True, kw_only=True)
class Seq2SeqConfig(TransformerConfig):
    """An encoder-decoder (translation) model; ``layers`` is the encoder depth.

    Attributes:
        src_vocab_size, tgt_vocab_size: vocabularies of source and target.
        decoder_layers: decoder depth (None = ``layers``).
        tie_embeddings: the target embedding doubles as the output projection.
        pad_id, bos_id, eos_id: padding, decoder-start and end-of-sequence ids (target).
        scale_embeddings: Vaswani et al.'s embedding scheme for both embeddings: initialize
            ``N(0, dim**-0.5)`` and multiply by ``sqrt(dim)`` on the way in (see
            :class:`CausalLMConfig`). False: ``N(0, 0.02)``, unscaled.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    decoder_layers: int | None = None
    tie_embeddings: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int | None = 2
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _bool("scale_embeddings", self.scale_embeddings)
        positive_int(self.src_vocab_size, "src_vocab_size")
        positive_int(self.tgt_vocab_size, "tgt_vocab_size")
        if self.decoder_layers is not None:
            positive_int(self.decoder_layers, "decoder_layers")
        _token_id("pad_id", self.pad_id, self.tgt_vocab_size)
        _token_id("bos_id", self.bos_id, self.tgt_vocab_size)
        _token_id("eos_id", self.eos_id, self.tgt_vocab_size, optional=True)

    @property
    def dec_layers(self) -> int:
        """Decoder depth (``decoder_layers`` or ``layers``)."""
        return self.decoder_layers if self.decoder_layers is not None else self.layers


@dataclass(frozen=True, kw_only=True)
class ClassifierConfig(TransformerConfig):
    """An encoder with a classification head over a pooled sequence.

    Attributes:
        vocab_size: number of token ids.
        num_classes: number of output classes.
        pooling: ``"cls"`` (the first token's state; put a CLS token there) or
            ``"mean"`` (average over the tokens the attention mask keeps).
        scale_embeddings: Vaswani et al.'s embedding scheme (see :class:`CausalLMConfig`).
    """

    vocab_size: int
    num_classes: int
    pooling: str = "cls"
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _bool("scale_embeddings", self.scale_embeddings)
        positive_int(self.vocab_size, "vocab_size")
        positive_int(self.num_classes, "num_classes")
        _choice("pooling", self.pooling, ("cls", "mean"))


@dataclass(frozen=True, kw_only=True)
class ViTConfig(TransformerConfig):
    """Vision Transformer (Dosovitskiy et al., 2021).

    Attributes:
        image_size: side of the square input image (pixels).
        patch_size: side of a square patch; must divide ``image_size``.
        channels: input channels.
        num_classes: output classes.
        pooling: ``"cls"`` (class token) or ``"mean"`` (average of patch tokens).

    ``positional="sinusoidal"`` means the 2-D sin-cos code of the patch grid
    (:class:`attnlab.positional.SinusoidalND`); ``"learned"`` one vector per token
    (class token included); the rotary/alibi/t5 encodings see the row-major patch order.
    """

    image_size: int
    patch_size: int
    channels: int = 3
    num_classes: int
    pooling: str = "cls"

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int(self.image_size, "image_size")
        positive_int(self.patch_size, "patch_size")
        positive_int(self.channels, "channels")
        positive_int(self.num_classes, "num_classes")
        _choice("pooling", self.pooling, ("cls", "mean"))
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"patch_size must divide image_size, got image_size={self.image_size} and patch_size={self.patch_size}"
            )
        if self.positional == "sinusoidal" and self.dim % 4 != 0:
            raise ValueError(f"2-D sinusoidal positions need dim divisible by 4, got dim={self.dim}")
        if self.positional == "learned" and self.max_len < self.num_patches + 1:
            raise ValueError(
                f"max_len={self.max_len} is below the {self.num_patches + 1} tokens (patches + class token) of a "
                f"{self.image_size}x{self.image_size} image in {self.patch_size}x{self.patch_size} patches"
            )

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid ``(rows, cols)``."""
        g = self.image_size // self.patch_size
        return (g, g)

    @property
    def num_patches(self) -> int:
        """Number of patch tokens."""
        return self.grid[0] * self.grid[1]


@dataclass(frozen=True, kw_only=True)
class RegressionConfig(TransformerConfig):
    """A causal Transformer over ``(x, y)`` pairs that predicts each ``y`` from the pairs before it
    (:class:`~attnlab.models.InContextRegressor`; Garg et al., 2022).

    Attributes:
        n_dims: dimension ``d`` of the inputs ``x``.

    A prompt of ``k`` pairs is ``2k`` tokens; ``positional="learned"`` needs ``max_len >= 2k``.
    """

    n_dims: int
    positional: str = "learned"

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int(self.n_dims, "n_dims")


#: accepted values of ``VideoConfig.attention``
VIDEO_ATTENTIONS = ("joint", "divided", "space", "axial")


@dataclass(frozen=True, kw_only=True)
class VideoConfig(TransformerConfig):
    """A video classifier whose layers differ only in how tokens attend (:class:`~attnlab.models.VideoTransformer`).

    Attributes:
        frames: ``T``, frames per video.
        image_size: side of the square frames (pixels).
        patch_size: side of a square patch; must divide ``image_size``.
        channels: input channels.
        num_classes: output classes.
        attention: ``joint`` (every token sees every token), ``divided`` (TimeSformer's time
            then space), ``space`` (within its frame only: the frames meet only in the final
            mean over all tokens) or ``axial`` (time, then rows, then columns).

    ``positional="sinusoidal"`` is the 3-D sin-cos code of the ``(T, H, W)`` token grid
    (:class:`attnlab.positional.SinusoidalND` on the largest multiple of 6 channels, the rest
    uncoded); ``"learned"`` is TimeSformer's: a learned vector per frame plus one per patch
    position; ``"none"`` adds none. The other encodings are not offered for video.
    """

    frames: int
    image_size: int
    patch_size: int
    channels: int = 1
    num_classes: int
    attention: str = "divided"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("frames", "image_size", "patch_size", "channels", "num_classes"):
            positive_int(getattr(self, name), name)
        _choice("attention", self.attention, VIDEO_ATTENTIONS)
        _choice("positional", self.positional, ("sinusoidal", "learned", "none"))
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"patch_size must divide image_size, got image_size={self.image_size} and patch_size={self.patch_size}"
            )
        if self.attention != "joint" and self.mechanism != "exact":
            raise ValueError(f"attention={self.attention!r} restricts exact attention with a mask; mechanism must be "
                             f"'exact', got {self.mechanism!r}")

    @property
    def grid(self) -> tuple[int, int, int]:
        """Token grid ``(T, H, W)``."""
        g = self.image_size // self.patch_size
        return (self.frames, g, g)


@dataclass(frozen=True, kw_only=True)
class BertConfig(_JSONConfig):
    """BERT (Devlin et al., 2019): the layout is fixed by the pretrained weights (post-norm layers,
    GELU (erf) feed-forward, learned absolute positions plus token-type embeddings, exact attention).

    Fields are spelled as in every attnlab config (``dim``, ``heads``, ``layers``, ``ff_dim``,
    ``max_len``, ``dropout``, ``attn_dropout``, ``activation``, ``norm_eps``); :meth:`from_hf`
    reads a published Hugging Face ``config.json`` (``hidden_size``, ``num_attention_heads``, ...)
    through :data:`HF_BERT_NAMES`.
    """

    vocab_size: int = 30522
    dim: int = 768
    layers: int = 12
    heads: int = 12
    ff_dim: int = 3072
    max_len: int = 512
    type_vocab_size: int = 2
    norm_eps: float = 1e-12
    dropout: float = 0.1
    attn_dropout: float = 0.1
    pad_token_id: int = 0
    activation: str = "gelu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "layers", "heads", "ff_dim", "max_len", "type_vocab_size"):
            positive_int(getattr(self, name), name)
        if self.dim % self.heads:
            raise ValueError(f"dim must be divisible by heads, got {self.dim} and {self.heads}")
        positive_number(self.norm_eps, "norm_eps")
        probability(self.dropout, "dropout")
        probability(self.attn_dropout, "attn_dropout")
        _token_id("pad_token_id", self.pad_token_id, self.vocab_size)
        _choice("activation", self.activation, ("gelu", "gelu_tanh", "relu"))

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> BertConfig:
        """From a Hugging Face BERT ``config.json`` dict (keys this model does not use are ignored).

        Raises:
            ValueError: for settings this BERT cannot honour (non-absolute positions).
        """
        pos = data.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"position_embedding_type must be 'absolute', got {pos!r}")
        kw = {ours: data[theirs] for theirs, ours in HF_BERT_NAMES.items() if theirs in data}
        kw["activation"] = {"gelu_new": "gelu_tanh"}.get(kw.get("activation", "gelu"), kw.get("activation", "gelu"))
        return cls(**kw)

    def to_transformer_config(self) -> TransformerConfig:
        """The equivalent stack settings (post-norm, learned positions handled by the embeddings)."""
        return TransformerConfig(dim=self.dim, heads=self.heads, layers=self.layers, ff_dim=self.ff_dim,
                                 dropout=self.dropout, attn_dropout=self.attn_dropout, activation=self.activation,
                                 norm_first=False, norm_eps=self.norm_eps, positional="none", max_len=self.max_len)


#: Hugging Face BERT ``config.json`` names -> :class:`BertConfig` fields
HF_BERT_NAMES = {"vocab_size": "vocab_size", "hidden_size": "dim", "num_hidden_layers": "layers",
                 "num_attention_heads": "heads", "intermediate_size": "ff_dim", "max_position_embeddings": "max_len",
                 "type_vocab_size": "type_vocab_size", "layer_norm_eps": "norm_eps", "hidden_dropout_prob": "dropout",
                 "attention_probs_dropout_prob": "attn_dropout", "pad_token_id": "pad_token_id",
                 "hidden_act": "activation"}


#: accepted values of ``GATConfig.conv``: the graph attention layer of every layer
GRAPH_CONVS = ("gat", "gatv2", "transformer")


@dataclass(frozen=True, kw_only=True)
class GATConfig(_JSONConfig):
    """A graph attention network for node classification (Veličković et al., 2018).

    The defaults are the paper's transductive model (Cora, CiteSeer): 2 layers, 8 heads of 8
    hidden channels (concatenated, ELU), one output head (averaged), dropout 0.6 on each
    layer's input and on the attention weights, and, as the authors' code does, on each
    layer's projected features before they are aggregated (``message_dropout``).

    Attributes:
        in_channels: input features per node (the task sets them from its data).
        num_classes: output classes.
        hidden: channels per head of the hidden layers.
        heads: heads of the hidden layers (concatenated).
        out_heads: heads of the output layer (averaged).
        layers: graph attention layers (>= 1; the last is the output layer).
        conv: the layer, one of :data:`GRAPH_CONVS` (``gatv2``: dynamic attention, Brody et al.
            2022; ``transformer``: scaled dot-product, Shi et al. 2021).
        dropout: dropout on each layer's input features (training only).
        attn_dropout: dropout on the attention weights (training only).
        message_dropout: dropout on the projected source features (the messages ``W h_j``) before
            the weighted sum, the scores seeing them undropped (training only). The GAT paper's
            text does not name it; its reference code (``utils/layers.py``, ``attn_head``: ``seq_fts``
            dropped with ``in_drop``) does, and PyG's example does not: CiteSeer measured 72.5 with
            it against 70.8 without (10 seeds each, docs/graphs.md). 0 gives PyG's model.
        negative_slope: of the LeakyReLU in GAT's and GATv2's score.
    """

    in_channels: int = 16
    num_classes: int = 7
    hidden: int = 8
    heads: int = 8
    out_heads: int = 1
    layers: int = 2
    conv: str = "gat"
    dropout: float = 0.6
    attn_dropout: float = 0.6
    message_dropout: float = 0.6
    negative_slope: float = 0.2

    def __post_init__(self) -> None:
        for name in ("in_channels", "num_classes", "hidden", "heads", "out_heads", "layers"):
            positive_int(getattr(self, name), name)
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        _choice("conv", self.conv, GRAPH_CONVS)
        probability(self.dropout, "dropout")
        probability(self.attn_dropout, "attn_dropout")
        probability(self.message_dropout, "message_dropout")
        if not isinstance(self.negative_slope, (int, float)) or isinstance(self.negative_slope, bool) \
                or not 0 <= self.negative_slope < 1:
            raise ValueError(f"negative_slope must be a number in [0, 1), got {self.negative_slope!r}")


#: accepted values of ``GlimpseConfig.core`` (the recurrent cell) and ``GlimpseConfig.policy``
GLIMPSE_CORES = ("gru", "lstm", "rnn")
GLIMPSE_POLICIES = ("learned", "random")
#: where :class:`~attnlab.models.RecurrentAttention`'s first glimpse is (:attr:`GlimpseConfig.start`)
GLIMPSE_STARTS = ("random", "learned", "center")
#: accepted values of ``GlimpseConfig.what`` (the glimpse network's pathway for the patches)
GLIMPSE_WHATS = ("linear", "conv")
#: where :class:`~attnlab.models.RecurrentAttention`'s REINFORCE gradient goes (:attr:`GlimpseConfig.policy_grad`)
GLIMPSE_POLICY_GRADS = ("head", "all")


@dataclass(frozen=True, kw_only=True)
class GlimpseConfig(_JSONConfig):
    """A recurrent attention model (:class:`~attnlab.models.RecurrentAttention`; Mnih et al., 2014).

    Attributes:
        image_size: side ``S`` of the square canvas (pixels).
        channels: input channels.
        num_classes: output classes.
        patch_size: side ``P`` of the retina's patches (pixels after downsampling).
        scales: patches per glimpse; patch ``k`` covers ``P 2^k`` pixels averaged down to ``P x P``.
        glimpses: glimpses per image ``G``.
        dim: width of the glimpse vector and of the core's state.
        glimpse_dim: width of the what (patches) and where (location) layers of the glimpse network.
        what: the what pathway, one of :data:`GLIMPSE_WHATS`: ``linear`` (Mnih et al.'s one layer on
            the pixels) or ``conv`` (two 3x3 convolutions and a 2x2 max pool before it).
        core: the recurrent cell, one of :data:`GLIMPSE_CORES`.
        std: standard deviation of the Gaussian location policy, in the location units
            (the canvas spans ``[-1, 1]``).
        start: where the first glimpse is, one of :data:`GLIMPSE_STARTS`: ``random`` (uniform on
            ``[-1, 1]^2``, as Mnih et al.), ``learned`` (drawn from the policy at the state before any
            glimpse: one learned place) or ``center`` (the canvas's centre, for either policy: with
            ``scales`` whose largest patch spans the canvas, the first glimpse sees all of it coarsely).
        policy: ``learned`` (the location network, trained with REINFORCE) or ``random``
            (every location uniform on ``[-1, 1]^2``: the same model that never learns where to look).
        policy_grad: where the REINFORCE gradient goes: ``head`` (the location network alone; it
            reads the core's state detached) or ``all`` (through the location network into the
            core and the glimpse network too, as in Mnih et al.'s joint gradient), so the state learns
            to hold where to look next, not only what the class is.
        core_grad: with ``policy_grad="all"``, the factor on the policy gradient that reaches the
            core and the glimpse network (the location network gets it whole; 1: Mnih et al.'s
            joint gradient, smaller: the classification gradient dominates what the state learns).
        locate_hidden: width of a hidden ReLU layer in the location network (0: none, Mnih et al.'s
            one linear layer from the state to the mean location).
    """

    image_size: int
    channels: int = 1
    num_classes: int
    patch_size: int = 8
    scales: int = 2
    glimpses: int = 4
    dim: int = 256
    glimpse_dim: int = 128
    what: str = "linear"
    core: str = "gru"
    std: float = 0.15
    start: str = "random"
    policy: str = "learned"
    policy_grad: str = "head"
    core_grad: float = 1.0
    locate_hidden: int = 0

    def __post_init__(self) -> None:
        for name in ("image_size", "channels", "num_classes", "patch_size", "scales", "glimpses", "dim",
                     "glimpse_dim"):
            positive_int(getattr(self, name), name)
        _choice("core", self.core, GLIMPSE_CORES)
        _choice("what", self.what, GLIMPSE_WHATS)
        _choice("policy", self.policy, GLIMPSE_POLICIES)
        _choice("start", self.start, GLIMPSE_STARTS)
        _choice("policy_grad", self.policy_grad, GLIMPSE_POLICY_GRADS)
        if not isinstance(self.locate_hidden, int) or isinstance(self.locate_hidden, bool) or self.locate_hidden < 0:
            raise ValueError(f"locate_hidden must be an int >= 0 (0: no hidden layer), got {self.locate_hidden!r}")
        positive_number(self.std, "std")
        positive_number(self.core_grad, "core_grad")
        if self.core_grad != 1.0 and self.policy_grad != "all":
            raise ValueError(f"core_grad scales the policy gradient into the core, which only policy_grad='all' "
                             f"sends there; got core_grad={self.core_grad} with policy_grad={self.policy_grad!r}")

    @property
    def largest_patch(self) -> int:
        """Side in canvas pixels of a glimpse's largest patch, ``P 2^(scales - 1)``."""
        return self.patch_size * 2 ** (self.scales - 1)


@dataclass(frozen=True, kw_only=True)
class ConvConfig(_JSONConfig):
    """A small convolutional image classifier (:class:`~attnlab.models.ConvClassifier`).

    Attributes:
        image_size: side of the square input (pixels).
        channels: input channels.
        num_classes: output classes.
        dim: channels of the first block; block ``i`` has ``dim 2^i``.
        layers: blocks of 3x3 convolution, ReLU and 2x2 max pooling (the last without pooling).
        dropout: dropout before the linear head (training only).
    """

    image_size: int
    channels: int = 1
    num_classes: int
    dim: int = 32
    layers: int = 3
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("image_size", "channels", "num_classes", "dim", "layers"):
            positive_int(getattr(self, name), name)
        probability(self.dropout, "dropout")
        if self.image_size < 2 ** (self.layers - 1):
            raise ValueError(f"image_size must be at least 2^(layers - 1) = {2 ** (self.layers - 1)} pixels (each "
                             f"block but the last halves it), got image_size={self.image_size}, layers={self.layers}")
