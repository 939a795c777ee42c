"""Generation: :func:`generate` (greedy, beam search, sampling with the KV cache).

The search itself lives in :mod:`attnlab.models.search` and drives models through the
:class:`~attnlab.models.search.Generative` protocol, importing no model class, so the
model classes can use it. This module is the public home of the search. Its benchmark
(tokens per second with and without the KV cache) is the bench's ``generate`` suite
(``attnlab bench generate``).
"""

from __future__ import annotations

from .search import Generative, filter_logits, generate

__all__ = ["Generative", "filter_logits", "generate"]
