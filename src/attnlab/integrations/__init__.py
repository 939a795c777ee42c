"""attnlab inside other libraries.

* :mod:`attnlab.integrations.hf` - attnlab's exact op as an ``attn_implementation`` of
  Hugging Face ``transformers`` models (``register()``, ``from_pretrained()``).

Nothing here imports the other library until a function is called, so ``import attnlab``
never imports transformers.
"""

from . import hf

__all__ = ["hf"]
