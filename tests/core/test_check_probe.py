"""bench/check_probe.py's scoring: a model's checks against the true ones, its columns against its own checks."""

from __future__ import annotations

import sys
from pathlib import Path

from earl_core.agent import protocol
from earl_core.env.connect_four import Board

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the bench's modules are scripts, not a package
from check_probe import score_answers  # noqa: E402


def test_checks_and_moves_are_scored_against_the_board_and_against_the_check() -> None:
    wins = Board.from_moves("445566")  # X to move: columns 2 and 6 win
    blocks = Board.from_moves("44556")  # O to move: columns 2 and 6 must be blocked
    answers = [
        (wins, protocol.answer_text(2, wins, "cells_checks")),  # the true check, the win taken
        (wins, "aae bae cae dce ece fce gae [col 3]"),  # no marks, the win missed
        (blocks, "aae bae cae block dce ece fce gae [col 3]"),  # a true block mark, not played
        (blocks, "aae bae cae dce block ece fce gae block [col 3]"),  # one true mark, one false one, followed
    ]
    assert score_answers(answers) == {
        "answers": 4,
        "check_exact": 0.25,
        "win": {"turns": 2, "marked": 0.5, "played": 0.5, "own_marks": 1, "own_true": 1.0, "follows": 1.0},
        "block": {"turns": 2, "marked": 1.0, "played": 0.0, "own_marks": 2, "own_true": 0.5, "follows": 0.5},
    }
