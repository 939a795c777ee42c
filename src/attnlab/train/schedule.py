"""Learning-rate schedules: linear warm-up, then cosine decay, inverse square root, constant or warm-up-stable-decay.

* ``cosine`` (Loshchilov and Hutter, 2017, "SGDR", without restarts): after the warm-up
  the rate falls from ``lr`` to ``min_lr`` along half a cosine, reaching ``min_lr`` at
  ``total`` steps and staying there.
* ``inverse_sqrt`` (Vaswani et al., 2017, "Attention Is All You Need", section 5.3): the
  rate rises linearly for ``warmup`` steps, then decays as ``step^-1/2``. The paper
  writes it as ``dim^-0.5 * min(step^-0.5, step * warmup^-1.5)``; here ``lr`` is the peak
  it reaches at the end of the warm-up, so ``lr = dim^-0.5 * warmup^-0.5`` gives the
  paper's curve exactly.
* ``constant``: warm-up, then ``lr``.
* ``wsd`` (warm-up, stable, decay: Hu et al., 2024, "MiniCPM"): ``lr`` after the
  warm-up until the last ``decay`` steps before ``total``, over which it falls linearly to
  ``min_lr`` (the last step takes ``min_lr``). Every step before the decay has the rate of
  ``constant``, so a longer run continues a shorter one's checkpoint taken before its decay;
  the decay settles a run whose constant rate leaves its score jumping from one evaluation
  to the next.

A schedule is a pure function of the step (no state to save beyond the step count), so
a resumed run computes exactly the rates of an uninterrupted one. Time and memory O(1).
"""

from __future__ import annotations

import math

__all__ = ["SCHEDULES", "lr_at"]

#: accepted schedule names
SCHEDULES = ("cosine", "inverse_sqrt", "constant", "wsd")


def lr_at(step: int, *, lr: float, schedule: str = "cosine", warmup: int = 0, total: int = 1,
          min_lr: float = 0.0, decay: int = 0) -> float:
    """The learning rate of optimizer step ``step`` (0-based).

    Args:
        step: the step about to be taken, 0 for the first.
        lr: peak learning rate (reached at the end of the warm-up).
        schedule: one of :data:`SCHEDULES`.
        warmup: steps of linear warm-up (step ``s < warmup`` gets ``lr * (s + 1) / warmup``).
        total: the step at which ``cosine`` reaches ``min_lr``; ``wsd``: the run's steps.
        min_lr: the floor of ``cosine`` and the last rate of ``wsd``.
        decay: ``wsd``: the final steps over which the rate falls to ``min_lr`` (``0 < decay <= total``).

    Raises:
        ValueError: for an unknown schedule, negative step/warm-up, or a ``wsd`` decay outside ``[1, total]``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if step < 0 or warmup < 0:
        raise ValueError(f"step and warmup must be >= 0, got step={step} warmup={warmup}")
    if schedule == "wsd" and not 0 < decay <= total:
        raise ValueError(f"decay of the wsd schedule must be in [1, total={total}], got {decay}")
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    if schedule == "wsd":
        start = total - decay
        return lr if step < start else lr + (min_lr - lr) * min((step - start + 1) / decay, 1.0)
    if schedule == "inverse_sqrt":
        return lr * math.sqrt(max(warmup, 1) / (step + 1))
    span = max(total - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
