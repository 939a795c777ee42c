"""Complete Transformer models built from attnlab parts, with generation and real weights.

* :class:`Encoder`, :class:`Decoder` - stacks of pre- or post-norm layers
  (:mod:`~attnlab.models.blocks`) with any positional encoding and any mechanism.
* :class:`EncoderDecoder` (translation), :class:`CausalLM` (GPT-style),
  :class:`SequenceClassifier` (CLS or mean pooling), :class:`ViT` (images),
  :class:`VideoTransformer` (videos: joint, divided, space-only or axial attention).
* :class:`InContextRegressor` - a causal Transformer over ``(x, y)`` pairs that learns
  linear functions in context (the ``icl-linear`` task).
* :class:`GAT` - a graph attention network for node classification (GAT, GATv2 or
  TransformerConv layers from :mod:`attnlab.layers.graph`).
* :class:`RecurrentAttention` - a recurrent attention model (Mnih et al., 2014): glimpses
  whose locations a Gaussian policy learns with REINFORCE; :class:`ConvClassifier`, a small
  CNN that sees the whole image (the ``cluttered-digits`` task).
* :class:`Bert` - BERT that loads all-MiniLM-L6-v2 (:func:`load_minilm`) and gives
  sentence embeddings (:meth:`Bert.encode`).
* :func:`generate` - greedy, beam search and sampling with the KV cache, for any model
  that implements :class:`Generative` (:mod:`~attnlab.models.search`).
* Configs are frozen dataclasses that round-trip through JSON
  (:mod:`~attnlab.models.config`); ``model.save_pretrained(dir)`` /
  ``Model.from_pretrained(dir)`` use JSON + safetensors (:mod:`~attnlab.models.io`).

Shape legend used throughout: ``B`` batch, ``N`` queries, ``M`` keys, ``H`` heads,
``D`` head dim, ``V`` vocabulary.
"""

from .bert import Bert, BertOutput, TextTokenizer, load_minilm
from .blocks import DecoderLayer, EncoderLayer, FeedForward, PositionalParts
from .causal_lm import CausalLM, CausalLMOutput
from .classifier import ClassifierOutput, SequenceClassifier
from .common import check_tokens, mean_pool
from .config import (
    BertConfig,
    CausalLMConfig,
    ClassifierConfig,
    ConvConfig,
    GATConfig,
    GlimpseConfig,
    RegressionConfig,
    Seq2SeqConfig,
    TransformerConfig,
    VideoConfig,
    ViTConfig,
)
from .convnet import ConvClassifier, ConvOutput
from .decoder import Decoder, DecoderCache, DecoderOutput, DecodingState
from .encoder import Encoder, EncoderOutput
from .gat import GAT, GraphOutput
from .generate import Generative, generate
from .glimpse import GlimpseOutput, RecurrentAttention
from .init import init_weights
from .io import from_pretrained, model_types, save_pretrained
from .regression import InContextRegressor, RegressionOutput
from .seq2seq import EncoderDecoder, Seq2SeqOutput
from .video import VideoOutput, VideoTransformer
from .vit import ViT, ViTOutput

__all__ = [
    "Bert",
    "BertConfig",
    "BertOutput",
    "CausalLM",
    "CausalLMConfig",
    "CausalLMOutput",
    "ClassifierConfig",
    "ClassifierOutput",
    "ConvClassifier",
    "ConvConfig",
    "ConvOutput",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "DecoderOutput",
    "DecodingState",
    "Encoder",
    "EncoderDecoder",
    "EncoderLayer",
    "EncoderOutput",
    "FeedForward",
    "GAT",
    "GATConfig",
    "Generative",
    "GlimpseConfig",
    "GlimpseOutput",
    "GraphOutput",
    "InContextRegressor",
    "PositionalParts",
    "RecurrentAttention",
    "RegressionConfig",
    "RegressionOutput",
    "Seq2SeqConfig",
    "Seq2SeqOutput",
    "SequenceClassifier",
    "TextTokenizer",
    "TransformerConfig",
    "ViT",
    "ViTConfig",
    "VideoConfig",
    "VideoOutput",
    "VideoTransformer",
    "ViTOutput",
    "check_tokens",
    "from_pretrained",
    "generate",
    "init_weights",
    "load_minilm",
    "mean_pool",
    "model_types",
    "save_pretrained",
]
