"""Config validation: every bad value names its field and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.config import RunConfig, apply_overrides, load_config
from earl_core.games import iteration_specs
from earl_core.config_doc import config_reference
from earl_core.errors import ConfigError


def test_defaults_round_trip() -> None:
    cfg = RunConfig()
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.games_per_iteration == 64


@pytest.mark.parametrize(
    ("data", "field", "allowed_part"),
    [
        ({"rollout": {"temperature": -1}}, "rollout.temperature", "0.0..2.0"),
        ({"rollout": {"engine": "tgi"}}, "rollout.engine", "vllm"),
        ({"game": {"opponent": "solver:99"}}, "game.opponent", "solver:D"),
        ({"game": {"opponent": "random,,heuristic"}}, "game.opponent", "comma-separated"),
        ({"sft": {"opponents": "random,chess"}}, "sft.opponents", "heuristic"),
        ({"algo": {"name": "dpo"}}, "algo.name", "grpo"),
        ({"rollout": {"groupz": 3}}, "rollout.groupz", "group_size"),
        ({"iterations": "ten"}, "iterations", "integer"),
        ({"model": 3}, "model", "preset"),
        ({"name": "bad name!"}, "name", "letters"),
        ({"sft": {"teacher": "random"}}, "sft.teacher", "heuristic"),
        ({"trainer_workers": 8, "rollout": {"groups": 1, "group_size": 4}}, "trainer_workers", "1..4"),
        ({"trainer_workers": 2, "rollout": {"groups": 2, "group_size": 4}, "algo": {"mini_batches": 5}},
         "algo.mini_batches", "1..4"),
        ({"algo": {"mini_batches": 0}}, "algo.mini_batches", "1"),
        ({"trainer_workers": 4, "parallelism": {"train_tp": 3}}, "parallelism.train_tp", "1, 2, 4"),
        ({"parallelism": {"train_tp": 0}}, "parallelism.train_tp", "1..1024"),
        ({"parallelism": {"train_fsdp": "yes"}}, "parallelism.train_fsdp", "true, false"),
        ({"parallelism": {"train_fsdp": True}}, "parallelism.train_fsdp", "trainer_workers >= 2"),
        ({"trainer_workers": 2, "parallelism": {"train_fsdp": True, "train_tp": 2}}, "parallelism.train_fsdp",
         "train_tp <= 1 (at least 2 data-parallel ranks)"),
        ({"version": 7}, "version", "1"),
        ({"dispatch": {"mode": "broadcast"}}, "dispatch.mode", "layout_aware"),
        ({"dispatch": {"mode": "central"}}, "dispatch.mode", "centralized"),
        ({"game": {"board_format": "grid"}}, "game.board_format", "cells"),
        ({"game": {"board_view": "mine"}}, "game.board_view", "absolute, relative"),
        ({"game": {"board_format": "cells_checks"}, "rollout": {"max_new_tokens": 16}}, "rollout.max_new_tokens",
         "32..4096 with cells_checks"),
        ({"game": {"board_format": "cells_stack_checks"}, "rollout": {"max_new_tokens": 8}}, "rollout.max_new_tokens",
         "32..4096 with cells_stack_checks"),
        ({"sft": {"positions": -1}}, "sft.positions", "0..10000000"),
        ({"sft": {"position_source": "solver"}}, "sft.position_source", "games, mixed"),
        ({"sft": {"lr_schedule": "linear"}}, "sft.lr_schedule", "constant, cosine"),
        ({"algo": {"turn_discount": 1.5}}, "algo.turn_discount", "0.0"),
    ],
)
def test_bad_values_name_field_and_allowed(data: dict, field: str, allowed_part: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(data)
    assert info.value.field == field
    assert allowed_part in str(info.value.allowed)
    assert field in str(info.value)


def test_fsdp_with_tp_is_accepted_while_two_data_parallel_ranks_remain() -> None:
    cfg = RunConfig.from_dict({"trainer_workers": 4, "rollout": {"groups": 2, "group_size": 4},
                               "parallelism": {"train_fsdp": True, "train_tp": 2}})
    assert cfg.parallelism.train_fsdp and cfg.parallelism.train_tp == 2
    with pytest.raises(ConfigError, match="train_tp <= 2"):
        RunConfig.from_dict({"trainer_workers": 4, "rollout": {"groups": 2, "group_size": 4},
                             "parallelism": {"train_fsdp": True, "train_tp": 4}})


def test_ints_accepted_for_floats_and_overrides() -> None:
    data = apply_overrides({"rollout": {"temperature": 1}}, ["algo.lr=0.01", "game.opponent=solver:3"])
    cfg = RunConfig.from_dict(data)
    assert cfg.rollout.temperature == 1.0 and cfg.algo.lr == 0.01 and cfg.game.opponent == "solver:3"


def test_load_config_errors(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["iterations", "seed", "rollout", "algo", "game", "name", "junk"]),
                       st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=5), st.none(),
                                 st.dictionaries(st.text(max_size=8), st.integers(-3, 3), max_size=2)),
                       max_size=4))
def test_fuzzed_configs_fail_only_with_config_error(data: dict) -> None:
    try:
        RunConfig.from_dict(data)
    except ConfigError as exc:
        assert exc.field


def test_reference_lists_every_field_with_help() -> None:
    ref = config_reference()
    for line in ref.splitlines()[2:]:
        assert line.rstrip(" |").split("|")[-1].strip(), f"field without help: {line}"
    assert "`rollout.group_size`" in ref and "`algo.kl_coef`" in ref


def test_opponent_lists_rotate_over_groups() -> None:
    cfg = RunConfig.from_dict({"game": {"opponent": "random, heuristic"}, "rollout": {"groups": 4, "group_size": 2}})
    specs = iteration_specs(cfg, 0)
    pairs = [(s["agent_side"], s["opponent"]) for s in specs[::2]]
    assert sorted(pairs) == [(1, "heuristic"), (1, "random"), (2, "heuristic"), (2, "random")]
    assert len({s["seed"] for s in specs}) == 4 and specs[0]["seed"] == specs[1]["seed"]
    one_side = RunConfig.from_dict({"game": {"opponent": "random,heuristic", "agent_side": "second"},
                                    "rollout": {"groups": 2, "group_size": 1}})
    assert [(s["agent_side"], s["opponent"]) for s in iteration_specs(one_side, 0)] == [(2, "random"), (2, "heuristic")]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"algo": {"lr": float("nan")}}, "algo.lr"),
        ({"rollout": {"temperature": 0.005}}, "rollout.temperature"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature"),  # greedy GRPO groups carry no signal
        ({"rollout": {"max_new_tokens": 2000, "max_context": 4096}}, "rollout.max_new_tokens"),
        ({"rollout": {"max_context": 32768}}, "rollout.max_context"),
        ({"trainer_workers": 4, "sft": {"enabled": True, "batch": 2}}, "sft.batch"),
    ],
)
def test_cross_field_checks(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(data)
    assert info.value.field == field


def test_bad_override_and_file_shapes(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict(apply_overrides({}, ["name=a: b: c"]))
    assert info.value.field == "name"
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listy, ["seed=1"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)


def test_readme_config_table_is_current() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert config_reference() in readme, "regenerate the README table with `python -m earl_core config-doc`"
