"""Evaluation plays by the rules a checkpoint was trained under (read from the run config it records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from earl_core.agent.runner import RunnerLimits
from earl_core.checkpoints import STATE_FILE
from earl_core.config import RunConfig
from earl_core.errors import ConfigError
from earl_core.evaluate import checkpoint_limits, run_limits


def _checkpoint(folder: Path, config: dict) -> str:
    folder.mkdir()
    (folder / STATE_FILE).write_text(json.dumps({"iteration": 3, "config": config}))
    return str(folder)


def test_a_checkpoint_keeps_its_runs_protocol(tmp_path: Path) -> None:
    cfg = RunConfig.from_dict({"game": {"board_format": "cells", "max_invalid": 2, "format_penalty": 0.25},
                               "rollout": {"max_new_tokens": 12, "max_context": 2048}})
    limits = checkpoint_limits(_checkpoint(tmp_path / "iter_000003", cfg.to_dict()))
    assert limits == run_limits(cfg)
    assert limits == RunnerLimits(max_invalid=2, format_penalty=0.25, max_context=2048, max_new_tokens=12,
                                  board_format="cells")


def test_a_model_from_elsewhere_gets_the_defaults(tmp_path: Path) -> None:
    assert checkpoint_limits(str(tmp_path)) == RunnerLimits()
    assert checkpoint_limits("Qwen/Qwen2.5-0.5B-Instruct") == RunnerLimits()  # a hub id: no local state file


def test_an_older_checkpoint_without_the_field_plays_rows(tmp_path: Path) -> None:
    old = {"version": 1, "game": {"max_invalid": 3, "retired_option": True}, "removed_section": {"x": 1}}
    limits = checkpoint_limits(_checkpoint(tmp_path / "old", old))
    assert limits.board_format == "rows" and limits.max_invalid == 3


def test_the_board_format_can_be_overridden_and_is_checked(tmp_path: Path) -> None:
    assert checkpoint_limits(str(tmp_path), board_format="cells").board_format == "cells"
    with pytest.raises(ConfigError) as info:
        checkpoint_limits(str(tmp_path), board_format="grid")
    assert info.value.field == "game.board_format" and "cells" in str(info.value.allowed)
