"""Evaluation plays by the rules a checkpoint was trained under (read from the run config it records) and says why\ngames were lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import RunnerLimits
from earl_core.checkpoints import STATE_FILE
from earl_core.config import CHECKS_NEW_TOKENS, RunConfig
from earl_core.engines.base import Generation
from earl_core.errors import ConfigError
from earl_core.evaluate import checkpoint_limits, evaluate_policy, run_limits


def _checkpoint(folder: Path, config: dict) -> str:
    folder.mkdir()
    (folder / STATE_FILE).write_text(json.dumps({"iteration": 3, "config": config}))
    return str(folder)


def test_a_checkpoint_keeps_its_runs_protocol(tmp_path: Path) -> None:
    cfg = RunConfig.from_dict({"game": {"board_format": "cells", "board_view": "relative", "max_invalid": 2,
                                        "format_penalty": 0.25},
                               "rollout": {"max_new_tokens": 12, "max_context": 2048}})
    limits = checkpoint_limits(_checkpoint(tmp_path / "iter_000003", cfg.to_dict()))
    assert limits == run_limits(cfg)
    assert limits == RunnerLimits(max_invalid=2, format_penalty=0.25, max_context=2048, max_new_tokens=12,
                                  board_format="cells", board_view="relative")


def test_a_model_from_elsewhere_gets_the_defaults(tmp_path: Path) -> None:
    assert checkpoint_limits(str(tmp_path)) == RunnerLimits()
    assert checkpoint_limits("Qwen/Qwen2.5-0.5B-Instruct") == RunnerLimits()  # a hub id: no local state file


def test_an_older_checkpoint_without_the_field_plays_rows(tmp_path: Path) -> None:
    old = {"version": 1, "game": {"max_invalid": 3, "retired_option": True}, "removed_section": {"x": 1}}
    limits = checkpoint_limits(_checkpoint(tmp_path / "old", old))
    assert limits.board_format == "rows" and limits.board_view == "absolute" and limits.max_invalid == 3


def test_the_board_format_can_be_overridden_and_is_checked(tmp_path: Path) -> None:
    assert checkpoint_limits(str(tmp_path), board_format="cells").board_format == "cells"
    assert checkpoint_limits(str(tmp_path), board_view="relative").board_view == "relative"
    with pytest.raises(ConfigError) as info:
        checkpoint_limits(str(tmp_path), board_format="grid")
    assert info.value.field == "game.board_format" and "cells" in str(info.value.allowed)
    # A checked answer needs more new tokens than the default, whichever way the format was chosen.
    assert checkpoint_limits(str(tmp_path), board_format="cells_checks").max_new_tokens == CHECKS_NEW_TOKENS
    cfg = RunConfig.from_dict({"game": {"board_format": "cells_checks"}, "rollout": {"max_new_tokens": 40}})
    assert checkpoint_limits(_checkpoint(tmp_path / "iter_000001", cfg.to_dict())).max_new_tokens == 40


def test_losses_are_counted_by_cause(protocol_tokenizer) -> None:  # noqa: ANN001
    """A scripted agent: in game 0 it names a column that does not exist (twice: a loss), in game 1 it answers
    nonsense, then a valid move, then nonsense twice, in the others it plays the first legal column and the
    board decides."""
    encoder = ChatEncoder(protocol_tokenizer)

    def answer(text: str) -> Generation:
        ids = encoder.tokenizer.encode(text, add_special_tokens=False) + [encoder.im_end]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    calls: dict[tuple[int, int], int] = {}

    def policy(waiting: list[Episode]) -> list[Generation]:
        out = []
        for ep in waiting:
            call = calls[(ep.agent_side, ep.index)] = calls.get((ep.agent_side, ep.index), -1) + 1
            if ep.index == 0:
                out.append(answer("[col 9]"))
            elif ep.index == 1:
                out.append(answer(protocol.answer_text(ep.board.legal_columns()[0]) if call == 1 else "hmm"))
            else:
                out.append(answer(protocol.answer_text(ep.board.legal_columns()[0])))
        return out

    limits = RunnerLimits(max_invalid=1)
    results = evaluate_policy(policy, encoder, opponent="heuristic", games=4, seed=5, limits=limits)
    for side in results.values():
        assert side.games == 4 and side.wins + side.draws + side.losses == 4
        assert sum(side.loss_causes.values()) == side.losses
        assert side.invalid_kinds == {protocol.NO_SUCH_COLUMN: 2, protocol.UNREADABLE: 3}
        assert side.invalid_answers == 5
        assert side.loss_causes["invalid answer (no such column)"] == 1
        assert side.loss_causes["invalid answer (unreadable)"] == 1
        assert side.loss_causes.get("four in a row", 0) == side.losses - 2
        assert side.as_dict()["loss_causes"] == side.loss_causes
