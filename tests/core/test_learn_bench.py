"""bench/learn_bench.py's accounting: where a run's training time went, and the machine's reference step."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the bench's modules are scripts, not a package
from learn_bench import reference_step_seconds, timing  # noqa: E402


def test_training_time_splits_into_warm_start_data_steps_rl_and_the_rest() -> None:
    metrics = [
        {"iteration": 0, "values": {"sft/steps": 10.0, "sft/seconds": 30.0, "sft/prepare_seconds": 6.0}},
        {"iteration": 1, "values": {"sft/steps": 10.0, "sft/seconds": 34.0, "sft/prepare_seconds": 6.0}},
        {"iteration": 1, "values": {"rollout/win_rate": 0.5, "perf/iteration_s": 12.0}},
        {"iteration": 2, "values": {"rollout/win_rate": 0.6, "perf/iteration_s": 18.0}},
    ]
    assert timing(metrics, train_s=110.0, reference_s=0.7) == {
        "warm_start_prepare_s": 6.0, "warm_start_steps_s": 64.0, "warm_start_steps": 20, "s_per_warm_start_step": 3.2,
        "rl_iterations": 2, "rl_iterations_s": 30.0, "s_per_rl_iteration": 15.0,
        "other_s": 110.0 - 6.0 - 64.0 - 30.0, "reference_step_s": 0.7,
    }


def test_a_run_without_warm_start_or_rl_reports_none_per_step() -> None:
    got = timing([], train_s=5.0, reference_s=0.1)
    assert got["warm_start_steps"] == 0 and got["s_per_warm_start_step"] is None
    assert got["rl_iterations"] == 0 and got["s_per_rl_iteration"] is None and got["other_s"] == 5.0


def test_the_reference_step_times_the_model_and_leaves_the_thread_count_as_it_was(protocol_model: Path) -> None:
    before = torch.get_num_threads()
    seconds = reference_step_seconds(protocol_model, 1, batch=2, tokens=64, repeats=3)
    assert 0.0 < seconds < 30.0
    assert torch.get_num_threads() == before


def test_a_longer_reference_step_takes_longer(protocol_model: Path) -> None:
    short = reference_step_seconds(protocol_model, 1, batch=1, tokens=32, repeats=3)
    long = reference_step_seconds(protocol_model, 1, batch=8, tokens=1024, repeats=3)
    assert long > short  # 256 times the tokens
