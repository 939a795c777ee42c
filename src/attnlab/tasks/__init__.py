"""Tasks that make or read their own data: ``attnlab train NAME``.

========================  =====================  ===========================================
name                      model                  data
========================  =====================  ===========================================
``copy``                  CausalLM               generated (``length``, ``vocab``)
``reverse``               CausalLM               generated
``sort``                  CausalLM               generated
``associative-recall``    CausalLM               generated (``pairs``, ``keys``, ``values``)
``mqar``                  CausalLM               generated (``length``, ``pairs``: recall at length)
``listops``               SequenceClassifier     generated (Long Range Arena rules)
``chars``                 CausalLM               ``--data`` any text file
``passkey``               CausalLM               ``--data`` a text file: a key hidden in a passage
``translation``           EncoderDecoder         ``--data`` aligned files (Multi30k)
``sentiment``             SequenceClassifier     ``--data`` ``sentence<TAB>label`` files
``digits``                ViT                    scikit-learn's bundled 8x8 digits
``cora``                  GAT                    ``--data`` the Planetoid folder (node classification)
``citeseer``              GAT                    ``--data`` the Planetoid folder
``moving-digits``         VideoTransformer       generated videos of those digits (direction of motion)
``icl-linear``            InContextRegressor     generated prompts of a random linear function
``cluttered-digits``      RecurrentAttention     generated canvases: one digit among fragments of others
                          (or ConvClassifier)
========================  =====================  ===========================================

``create_task(name, data=None, seed=0, **options)`` builds one; ``tasks()`` lists them.
"""

from __future__ import annotations

from typing import Any

# each task module registers its classes (@register_task) when imported here
from . import (  # noqa: F401
    chars,
    cluttered_digits,
    digits,
    icl,
    listops,
    moving_digits,
    node_classification,
    passkey,
    sentiment,
    synthetic,
    translation,
)
from .base import REGISTRY, MissingDataError, Task, register_task

__all__ = ["REGISTRY", "Task", "MissingDataError", "tasks", "create_task", "register_task"]


def tasks() -> dict[str, type[Task]]:
    """Registered task classes by name."""
    return REGISTRY.entries()


def create_task(name: str, data: str | None = None, seed: int = 0, **options: Any) -> Task:
    """Build the task registered as ``name``.

    Raises:
        ValueError: for an unknown name (listing the known ones) or unknown options.
    """
    return REGISTRY.create(name, data=data, seed=seed, **options)
