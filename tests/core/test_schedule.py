"""The warm start's learning-rate schedules, against values computed by hand."""

from __future__ import annotations

import pytest

from earl_core.rl.schedule import scheduled_lr


def test_constant_keeps_the_base_rate() -> None:
    assert [scheduled_lr(1e-3, "constant", s, 4) for s in range(4)] == [1e-3] * 4


def test_cosine_starts_at_the_base_halves_midway_and_falls_to_near_zero() -> None:
    # total 4: base * (1 + cos(pi * s / 4)) / 2 for s = 0..3
    assert [scheduled_lr(1.0, "cosine", s, 4) for s in range(4)] == pytest.approx(
        [1.0, 0.8535534, 0.5, 0.1464466], abs=1e-6)
    rates = [scheduled_lr(2e-3, "cosine", s, 1000) for s in range(1000)]
    assert rates[0] == 2e-3 and all(a > b for a, b in zip(rates, rates[1:])) and 0 < rates[-1] < 1e-7


def test_a_single_step_runs_at_the_base_rate() -> None:
    assert scheduled_lr(5e-4, "cosine", 0, 1) == 5e-4


@pytest.mark.parametrize(("schedule", "step", "total", "message"), [
    ("linear", 0, 10, "allowed: constant, cosine"),
    ("cosine", 10, 10, "outside 0..9"),
    ("cosine", -1, 10, "outside 0..9"),
    ("constant", 0, 0, "outside"),
])
def test_bad_arguments_are_refused(schedule: str, step: int, total: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scheduled_lr(1e-3, schedule, step, total)
