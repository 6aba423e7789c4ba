"""Warm-start data: one-turn positions are turns of the teacher's games, answered with the teacher's move."""

from __future__ import annotations

import pytest

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import one_turn_positions, teacher_policy
from earl_core.env.connect_four import Board
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent, opponent_wins_at


@pytest.fixture(scope="module")
def encoder(protocol_tokenizer) -> ChatEncoder:  # noqa: ANN001
    return ChatEncoder(protocol_tokenizer)


@pytest.fixture(scope="module")
def records(encoder: ChatEncoder) -> list[dict]:
    specs = [GameSpec(index=i, group=i, agent_side=1 + i % 2, opponent=RandomOpponent(), seed=i) for i in range(40)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), encoder, seed=3), encoder,
                        limits=RunnerLimits(board_format="cells"))
    return [e.record() for e in eps]


def _turns(records: list[dict]) -> dict[str, tuple[set[int], bool]]:
    """Hand replay of the games: each agent turn's first-turn prompt -> (the teacher's columns there, tactical?)."""
    out: dict[str, tuple[set[int], bool]] = {}
    for r in records:
        board = Board()
        for ch in r["board_moves"]:
            column = int(ch) - 1
            if board.to_move == r["agent_side"]:
                prompt = protocol.system_prompt(r["agent_side"], "cells") + protocol.turn_prompt(board, None, "cells")
                tactical = any(board.can_win_with(c) or opponent_wins_at(board, c) for c in board.legal_columns())
                out.setdefault(prompt, (set(), tactical))[0].add(column)
            board = board.drop(column)
    return out


def test_positions_are_teacher_turns_with_the_teacher_answer(encoder: ChatEncoder, records: list[dict]) -> None:
    turns = _turns(records)
    positions = one_turn_positions(records, encoder, 400, seed=5, board_format="cells")
    assert len(positions) == 400
    tactical = 0
    for p in positions:
        ids, mask = p["token_ids"], p["action_mask"]
        assert len(ids) == len(mask)
        cut = mask.index(1)
        assert all(m == 0 for m in mask[:cut]) and all(m == 1 for m in mask[cut:]), "only the answer is a target"
        answer = encoder.tokenizer.decode(ids[cut:])
        assert answer.endswith("<|im_end|>")
        column = protocol.parse_answer(answer.removesuffix("<|im_end|>"), Board()).column
        system, user = encoder.tokenizer.decode(ids[:cut]).split("<|im_end|>")[:2]
        key = system.removeprefix("<|im_start|>system\n") + user.removeprefix("\n<|im_start|>user\n")
        assert key in turns, "a position of the games, written as a first turn"
        columns, is_tactical = turns[key]
        assert column in columns
        tactical += is_tactical
    # 70% drawn from the turns where a column wins for either side (400 draws: +-0.07 is over 3 sigma).
    assert abs(tactical / len(positions) - 0.7) < 0.07


def test_positions_are_reproducible_and_optional(encoder: ChatEncoder, records: list[dict]) -> None:
    a = one_turn_positions(records, encoder, 20, seed=1, board_format="cells")
    assert a == one_turn_positions(records, encoder, 20, seed=1, board_format="cells")
    assert a != one_turn_positions(records, encoder, 20, seed=2, board_format="cells")
    assert one_turn_positions(records, encoder, 0) == []
