"""FSDP2 sharding of the trainer over data-parallel ranks: the same training as one process, and bit-exact switches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.test_tensor_parallel import run_two_ranks


@pytest.fixture(scope="module")
def fsdp2(protocol_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two real processes in a gloo group run tests.core.fsdp_ranks on the session's tiny model."""
    return run_two_ranks("tests.core.fsdp_ranks", protocol_model, tmp_path_factory.mktemp("fsdp") / "result.json",
                         timeout=120)


def test_each_rank_stores_half_of_the_parameters(fsdp2: dict) -> None:
    assert fsdp2["fsdp"] is True
    assert fsdp2["local_parameters"] <= fsdp2["parameters"] // 2 + 1024  # Shard(0) rows, rounded per tensor
    assert fsdp2["relayout"]["whole"] == {"fsdp": False, "local_parameters": fsdp2["parameters"]}


@pytest.mark.parametrize("step", ["sft", "rl", "after_relayout"])
def test_sharded_training_equals_one_process_on_all_games(fsdp2: dict, step: str) -> None:
    # Ranks run different numbers of micro-batches (3 and 1): the idle passes keep them in step.
    sharded, plain = fsdp2[step]["grad_norm"]
    assert sharded == pytest.approx(plain, rel=1e-5)  # gradients summed over ranks, then / all tokens
    worst, share_off = fsdp2[step]["weights"]
    # Only summation order differs (measured: 4e-7 at most). Adam moves a weight by ~lr (1e-3) whatever its
    # gradient's size, so a wrongly scaled or missing gradient shows in the norm above or here.
    assert share_off < 1e-4 and worst < 1e-4


def test_rl_step_counts_every_ranks_tokens(fsdp2: dict) -> None:
    sharded, plain = fsdp2["rl"]["tokens"]
    assert sharded == plain


def test_switching_into_and_out_of_fsdp_is_bit_exact(fsdp2: dict) -> None:
    assert fsdp2["relayout"]["weights_exact"] and fsdp2["relayout"]["optimizer_exact"]


def test_a_sharded_checkpoint_holds_the_full_weights(fsdp2: dict) -> None:
    assert fsdp2["checkpoint_weights"] == [0.0, 0.0]
