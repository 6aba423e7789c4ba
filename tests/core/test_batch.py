"""The batched numpy stepper must agree with ``Board`` move for move, including illegal and finished games."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.env.batch import BoardBatch
from earl_core.env.connect_four import Board
from earl_core.errors import IllegalMove

SECOND_WINS_ON_42 = "473725347123341712511124675567466466235235"


def reference_step(board: Board, column: int) -> tuple[Board, bool]:
    """What one game of the batch should do: (new board, illegal?)."""
    if board.is_terminal():
        return board, False
    try:
        return board.drop(column), False
    except IllegalMove:
        return board, True


def assert_agrees(batch: BoardBatch, boards: list[Board]) -> None:
    legal = batch.legal_mask()
    cells = batch.cells()
    for i, board in enumerate(boards):
        assert batch.board(i) == board and batch.board(i).moves == board.moves
        assert list(np.flatnonzero(legal[i])) == board.legal_columns()
        assert cells[i].tolist() == [[board.cell(r, c) for c in range(7)] for r in range(6)]
        assert batch.moves_played[i] == board.moves_played and batch.to_move[i] == board.to_move


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=6),
    turns=st.lists(st.lists(st.integers(min_value=-1, max_value=7), min_size=6, max_size=6), max_size=50),
)
def test_batch_agrees_with_board(n: int, turns: list[list[int]]) -> None:
    batch = BoardBatch(n)
    boards = [Board() for _ in range(n)]
    for turn in turns:
        columns = np.array(turn[:n])
        result = batch.step(columns)
        for i in range(n):
            boards[i], illegal = reference_step(boards[i], int(columns[i]))
            assert bool(result.illegal[i]) == illegal
            assert int(result.winner[i]) == boards[i].winner()
            assert bool(result.done[i]) == boards[i].is_terminal()
    assert_agrees(batch, boards)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_batch_agrees_on_random_legal_games(data: st.DataObject) -> None:
    """Legal moves only, so games run to their end (wins in every direction, full boards)."""
    n = 4
    batch = BoardBatch(n)
    boards = [Board() for _ in range(n)]
    for _ in range(42):
        columns = []
        for board in boards:
            legal = board.legal_columns() or [0]
            columns.append(data.draw(st.sampled_from(legal)))
        result = batch.step(np.array(columns))
        boards = [reference_step(b, c)[0] for b, c in zip(boards, columns)]
        assert result.winner.tolist() == [b.winner() for b in boards]
        assert result.done.tolist() == [b.is_terminal() for b in boards]
        assert not result.illegal.any()
    assert all(b.is_terminal() for b in boards)
    assert_agrees(batch, boards)


def test_win_on_the_42nd_move_and_a_finished_game_ignores_later_columns() -> None:
    batch = BoardBatch(2)
    for char in SECOND_WINS_ON_42:
        result = batch.step(np.array([int(char) - 1, 3]))
    assert result.winner.tolist()[0] == 2 and result.done[0]
    assert batch.board(0) == Board.from_moves(SECOND_WINS_ON_42)
    again = batch.step(np.array([0, 3]))
    assert not again.illegal[0] and again.winner[0] == 2
    assert batch.board(0).moves == SECOND_WINS_ON_42


def test_reset_clears_only_the_given_games() -> None:
    batch = BoardBatch(3)
    for column in (0, 1, 0, 1, 0, 1, 0):
        batch.step(np.array([column, 3, 6]))
    assert batch.done.tolist() == [True, False, False]
    batch.reset([0, 2])
    assert batch.board(0) == Board() and batch.board(2) == Board()
    assert batch.board(1).moves == "444444"  # the 7th stone did not fit
    assert batch.legal_mask()[0].all()
    batch.reset()
    assert batch.moves_played.tolist() == [0, 0, 0]


def test_step_checks_the_shape_and_size() -> None:
    with pytest.raises(ValueError):
        BoardBatch(2).step(np.array([1, 2, 3]))
    with pytest.raises(ValueError):
        BoardBatch(0)
