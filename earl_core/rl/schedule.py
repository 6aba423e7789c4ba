"""Learning-rate schedules of the SFT warm start: constant, or cosine decay to zero over all its steps."""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "cosine")


def scheduled_lr(base: float, schedule: str, step: int, total: int) -> float:
    """The learning rate of step ``step`` (0-based) of ``total``: ``base`` throughout (constant), or ``base`` at the
    first step falling along half a cosine towards zero, which it would reach one step after the last (cosine)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r} (allowed: {', '.join(LR_SCHEDULES)})")
    if total < 1 or not 0 <= step < total:
        raise ValueError(f"step {step} is outside 0..{total - 1}")
    if schedule == "constant":
        return base
    return base * 0.5 * (1.0 + math.cos(math.pi * step / total))
