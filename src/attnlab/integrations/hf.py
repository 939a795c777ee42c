"""attnlab as an attention implementation inside Hugging Face ``transformers`` models.

``register()`` enrolls attnlab's exact op (:func:`attnlab.attention`) under a name
(default ``"attnlab"``) in both of transformers' registries:

* ``AttentionInterface``: the function every supporting model calls with its
  projected ``query (B, H, N, D)``, ``key``/``value (B, Hkv, M, D)`` and mask;
* ``AttentionMaskInterface``: the function that builds that mask. Both are needed: a
  model looks its mask builder up under the same name, and with no builder it passes no
  mask at all, which silently drops causal masking and padding.

The mask builder is transformers' own ``sdpa_mask`` (a boolean ``(B, 1, N, M)`` tensor,
True = may attend, which is attnlab's convention too; or None where no mask is needed).
The attention function turns None into ``masks.causal()`` for causal layers, so the
common unpadded causal call keeps attnlab's structured mask and its fast paths; a
padded or sliding-window call arrives as the dense boolean mask the model asked for
(the window comes from the model config, e.g. Mistral's ``sliding_window``). Grouped
query heads go to attnlab as they are (no repeat of k/v). ``output_attentions=True``
returns the weights (served by the ``math`` and ``reference`` backends, which ``auto``
then picks).

After ``register()``, ``AutoModel.from_pretrained(path, attn_implementation="attnlab")``
runs attnlab. Only models whose attention classes call transformers' attention
interface can (``_supports_attention_backend``: BERT, GPT-2, Llama, Mistral, Qwen2 and
most recent ones); for any other, transformers would silently keep its own attention,
so :func:`check_model` (called by :func:`from_pretrained`) raises instead.

``load_tokenizer(path)`` gives a folder's ``AutoTokenizer`` (None when it has none).

transformers is optional (the ``hf`` extra) and imported only by these functions.

Shape legend: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``N`` queries,
``M`` keys, ``D`` head dim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .. import masks
from ..exact import attention, backends

__all__ = ["HF_PIP", "SUPPORTED", "TESTED_MODELS", "TOKENIZER_FILES", "attention_forward", "check_model",
           "from_pretrained", "load_tokenizer", "register"]

HF_PIP = "pip install 'transformers>=4.40'"
#: model types whose parity with transformers' sdpa is tested (tests/integrations)
TESTED_MODELS = ("bert", "gpt2", "llama", "mistral")


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"the Hugging Face backend needs transformers, which is not installed; run: {HF_PIP} "
                          f"(or pip install 'attnlab[hf]')") from e
    return transformers


def _check_backend(backend: str) -> str:
    known = ["auto", *backends()]
    if backend not in known:
        raise ValueError(f"backend must be one of {known}, got {backend!r}")
    return backend


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, *,
                      backend: str = "auto", **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature over :func:`attnlab.attention`.

    Args:
        module: the model's attention module (its ``is_causal`` is read when no mask comes).
        query: ``(B, H, N, D)``; key, value: ``(B, Hkv, M, D)``.
        attention_mask: what the mask builder returned: a bool ``(B, 1, N, M)`` (True =
            may attend), a float additive mask, or None (no mask needed, or causal).
        dropout: attention dropout probability (0 at evaluation).
        scaling: score scale (default ``1/sqrt(D)``).
        is_causal: overrides ``module.is_causal`` when the mask is None.
        backend: the attnlab backend (``"auto"`` or a name from :func:`attnlab.backends`).
        kwargs: transformers' extras: ``output_attentions`` returns the weights,
            ``position_bias`` is added to the scores; ``softcap`` and ``s_aux`` (sinks)
            are refused.

    Returns:
        ``(out (B, N, H, D), weights (B, H, N, M) or None)``, the layout transformers expects.

    Raises:
        ValueError: for a softcap or attention sinks, which attnlab's op does not compute.
    """
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"{type(module).__name__} asks for {name}, which attnlab's exact attention does not "
                             f"compute; load this model with attn_implementation='eager'")
    mask, bias = None, kwargs.get("position_bias")
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if causal and query.shape[2] > 1:
            mask = masks.causal()  # bottom-right aligned: right for a prefix in the cache too
    elif attention_mask.dtype == torch.bool:
        mask = attention_mask
    else:  # an additive float mask (0 / large negative), from a model that builds its own
        mask_bias = attention_mask.to(query.dtype)
        bias = mask_bias if bias is None else bias + mask_bias
    want = _weights_requested(kwargs)
    res = attention(query, key, value, mask=mask, bias=bias, scale=scaling,
                    dropout_p=dropout if module.training else 0.0, return_weights=want, backend=backend)
    out, weights = res if want else (res, None)
    return out.transpose(1, 2).contiguous(), weights  # (B, N, H, D)


def _weights_requested(kwargs: dict) -> bool:
    """Whether the model wants the attention weights of this call.

    Some models pass ``output_attentions`` down to the attention function; others (GPT-2)
    keep it and collect the weights with hooks that transformers switches on for the
    forward (its output collector), so a weightless return would leave them empty.
    """
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # transformers without output capturing passes output_attentions instead
        return False
    collected = _active_collector.get()
    return bool(collected) and ("attentions" in collected or "cross_attentions" in collected)


def _mask_builder():
    from transformers.masking_utils import sdpa_mask

    def build(*args, **kwargs):
        """transformers' boolean SDPA mask (True = may attend), or None where none is needed."""
        return sdpa_mask(*args, **kwargs)

    return build


def register(backend: str = "auto", name: str = "attnlab") -> str:
    """Enroll attnlab under ``name`` in transformers' attention and mask registries.

    Args:
        backend: the attnlab backend this name runs (``"auto"``, ``"math"``, ``"sdpa"``,
            ``"chunked"``, ...); register several names to compare them.
        name: the ``attn_implementation`` string that selects it.

    Returns:
        ``name``.

    Raises:
        ValueError: for an unknown backend or an empty name.
        ImportError: when transformers is missing (with the pip line).
    """
    _check_backend(backend)
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    tf = _transformers()

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                 backend=backend, **kwargs)

    forward.__doc__ = f"attnlab exact attention, backend {backend!r} (attnlab.integrations.hf.attention_forward)"
    tf.AttentionInterface.register(name, forward)
    tf.AttentionMaskInterface.register(name, _mask_builder())
    return name


#: the models attnlab can run inside, as the errors name them
SUPPORTED = (f"supported are models with _supports_attention_backend (tested: {', '.join(TESTED_MODELS)}; "
             f"also e.g. qwen2, gemma, phi3)")


def _check_class(cls: type, model_type: str, name: str) -> None:
    if not getattr(cls, "_supports_attention_backend", False):
        raise ValueError(f"{cls.__name__} (model_type {model_type!r}) does not route its attention through "
                         f"transformers' AttentionInterface, so attn_implementation={name!r} would not reach it; "
                         f"{SUPPORTED}")


def _check_folder(tf, auto_class, path: str | Path, name: str) -> None:
    """Refuse a local folder whose model cannot run attnlab before its weights are read.

    A hub id (no local ``config.json``) is left to transformers, and :func:`check_model`
    judges the loaded model.
    """
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"{config_file} must be a JSON object with a model_type: {e}") from e
    if model_type not in tf.CONFIG_MAPPING:
        raise ValueError(f"{config_file} has model_type {model_type!r}, which transformers {tf.__version__} does "
                         f"not know; {SUPPORTED}")
    try:
        cls = auto_class._model_mapping[tf.CONFIG_MAPPING[model_type]]
    except (KeyError, AttributeError):
        return  # no class of this auto class for it: transformers' own error says so
    _check_class(cls, model_type, name)


def check_model(model: nn.Module, name: str = "attnlab") -> nn.Module:
    """Raise unless ``model`` (a transformers model) really runs its attention through ``name``.

    Raises:
        ValueError: when the model's attention classes do not call transformers'
            attention interface (it would silently keep its own attention), naming the
            supported models; or when the model was loaded with another implementation.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", "?")
    _check_class(type(model), model_type, name)
    used = getattr(model.config, "_attn_implementation", None)
    if used != name:
        raise ValueError(f"{type(model).__name__} runs attn_implementation={used!r}, not {name!r}: load it with "
                         f"attn_implementation={name!r} after register()")
    return model


def from_pretrained(path: str | Path, *, backend: str = "auto", auto_class: str = "AutoModel", **kwargs: Any):
    """Load a transformers model folder with attnlab as its attention.

    Args:
        path: the model folder (``config.json`` + weights), or a hub id already cached.
        backend: the attnlab backend (see :func:`register`).
        auto_class: the transformers auto class (``"AutoModel"``, ``"AutoModelForCausalLM"``, ...).
        kwargs: passed to ``from_pretrained``.

    Raises:
        ValueError: for a model that cannot use attnlab (see :func:`check_model`; a local
            folder is checked from its ``config.json`` before the weights are read), naming
            the supported models.
        ImportError: when transformers is missing.
    """
    tf = _transformers()
    name = register(backend, "attnlab" if backend == "auto" else f"attnlab_{backend}")
    cls = getattr(tf, auto_class, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise ValueError(f"auto_class must name a transformers auto class such as 'AutoModel', got {auto_class!r}")
    _check_folder(tf, cls, path, name)
    model = cls.from_pretrained(str(path), attn_implementation=name, **kwargs)
    return check_model(model, name).eval()


#: the files of which a model folder's tokenizer is made, one of them at least
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "tokenizer.model")


def load_tokenizer(path: str | Path):
    """The transformers tokenizer (``AutoTokenizer``) of a model folder, or None when it has none.

    Raises:
        ImportError: when transformers is missing.
    """
    tf = _transformers()
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        return None
    return tf.AutoTokenizer.from_pretrained(str(path))
