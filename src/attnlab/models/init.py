"""Weight initialisation schemes, applied to a built model by name.

:func:`init_weights` is the one entry: ``init_weights(model, "gpt2", embed_std=1.0)``.
Schemes are looked up in :data:`INIT_SCHEMES`:

* ``default`` - keep what the model's constructor wrote: PyTorch's default linear init
  and the token embeddings of :func:`~attnlab.models.blocks.init_token_embeddings`
  (GPT-2's ``N(0, 0.02)``, or Vaswani et al.'s ``N(0, dim**-0.5)`` when the config sets
  ``scale_embeddings``).
* ``xavier`` - :func:`xavier_init`, Glorot-uniform linear weights (Glorot and Bengio, 2010).
* ``gpt2`` - :func:`gpt2_init` (Radford et al., 2019).

``embed_std > 0`` then redraws every ``nn.Embedding`` as ``N(0, embed_std)``. The
default linear init writes O(1) into the residual stream, so 0.02-scale embeddings are
drowned after one layer; the synthetic tasks set ``embed_std=1`` for that reason (see
``tasks.synthetic``). Note that this covers every ``nn.Embedding`` in the model, which
includes T5's relative-position bias table, not only the token embeddings.

``scale_embeddings`` stays a model config field rather than a scheme here: besides the
init it multiplies the embeddings by ``sqrt(dim)`` in the forward, so it is part of the
architecture and is saved with the model.

Every scheme draws from torch's global RNG in ``model.modules()`` order, so the same seed
gives the same weights. Time O(parameters), no extra memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

__all__ = ["INIT_SCHEMES", "init_weights", "xavier_init", "gpt2_init"]


def xavier_init(model: nn.Module) -> None:
    """Glorot-uniform weights and zero biases for every ``nn.Linear`` (Glorot and Bengio, 2010)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def gpt2_init(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialization (Radford et al., 2019): every linear and embedding weight
    ``N(0, std)``, biases zero, and the projections that write into the residual stream
    (attention ``out_proj``, feed-forward ``fc2``) scaled by ``1/sqrt(2 * layers)``.

    It keeps the embeddings on the scale of what each layer adds to the residual stream;
    with PyTorch's default linear init (about 4x larger at width 64) the token identity is
    drowned after the first layer, which stalls content-based tasks such as associative recall.
    """
    layers = sum(1 for name, _ in model.named_modules() if name.endswith("out_proj")) or 1
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            scale = 1.0 / math.sqrt(2 * layers) if name.endswith(("out_proj", "fc2")) else 1.0
            nn.init.normal_(m.weight, std=std * scale)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def _keep(model: nn.Module) -> None:
    """The ``default`` scheme: the model's constructor already initialised it."""


#: scheme name -> function that initialises a model in place (``TrainConfig.init`` takes these names)
INIT_SCHEMES: dict[str, Callable[[nn.Module], None]] = {"default": _keep, "xavier": xavier_init, "gpt2": gpt2_init}


def init_weights(model: nn.Module, scheme: str, embed_std: float = 0.0) -> None:
    """Initialise ``model`` in place with ``scheme``, then its embeddings with ``embed_std``.

    Args:
        model: a built model (any ``nn.Module``).
        scheme: a name in :data:`INIT_SCHEMES` (``default``, ``xavier``, ``gpt2``).
        embed_std: if > 0, redraw every ``nn.Embedding`` weight as ``N(0, embed_std)``
            after the scheme; 0 keeps what the scheme left.

    Raises:
        ValueError: for an unknown ``scheme`` or a negative ``embed_std``.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init_weights: scheme must be one of {list(INIT_SCHEMES)}, got {scheme!r}")
    if not embed_std >= 0:
        raise ValueError(f"init_weights: embed_std must be >= 0 (0 keeps the scheme's embeddings), got {embed_std}")
    INIT_SCHEMES[scheme](model)
    if embed_std > 0:
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=embed_std)
