"""Rules of the Connect Four board: wins in every direction, full columns, draws, move strings, text output."""

from __future__ import annotations

import copy
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.env.connect_four import COLUMN_MASKS, Board, playable_cells
from earl_core.errors import IllegalMove

# Full-board games found by seeded random play and checked by hand against the printed grid.
DRAW_GAME = "442761225377252342545563474175371666631311"
SECOND_WINS_ON_42 = "473725347123341712511124675567466466235235"


def grid_winner(grid: list[list[int]]) -> int:
    """Plain four-in-a-row scan over a [row][col] grid, written apart from the bitboard code."""
    for row in range(6):
        for col in range(7):
            player = grid[row][col]
            if not player:
                continue
            for d_row, d_col in ((0, 1), (1, 0), (1, 1), (1, -1)):
                cells = [(row + k * d_row, col + k * d_col) for k in range(4)]
                if all(0 <= r < 6 and 0 <= c < 7 and grid[r][c] == player for r, c in cells):
                    return player
    return 0


def grid_of(board: Board) -> list[list[int]]:
    return [[board.cell(row, col) for col in range(7)] for row in range(6)]


def ends_exactly_at_last_move(moves: str, winner: int) -> None:
    before = Board.from_moves(moves[:-1])
    after = Board.from_moves(moves)
    assert before.winner() == 0 and not before.is_terminal()
    assert after.winner() == winner
    assert after.is_terminal() and not after.is_draw()
    assert grid_winner(grid_of(after)) == winner


def test_empty_board() -> None:
    board = Board()
    assert board.legal_columns() == [0, 1, 2, 3, 4, 5, 6]
    assert (board.to_move, board.moves_played, board.moves, board.winner()) == (1, 0, "", 0)
    assert not board.is_terminal() and not board.is_draw()


@pytest.mark.parametrize(
    ("moves", "winner"),
    [
        ("1122334", 1),  # horizontal, bottom row
        ("1212121", 1),  # vertical
        ("12233434474", 1),  # diagonal rising to the right
        ("76655454414", 1),  # diagonal rising to the left (mirror of the one above)
        ("71122334", 2),  # horizontal for the second player
        ("6767676", 1),
        ("67676757", 2),  # vertical for the second player
    ],
)
def test_four_in_a_row_in_every_direction(moves: str, winner: int) -> None:
    ends_exactly_at_last_move(moves, winner)


def test_three_in_a_row_is_not_a_win() -> None:
    assert Board.from_moves("112233").winner() == 0
    assert Board.from_moves("121212").winner() == 0


def test_full_column_is_refused() -> None:
    board = Board.from_moves("111111")
    assert 0 not in board.legal_columns()
    with pytest.raises(IllegalMove, match="full"):
        board.drop(0)
    with pytest.raises(IllegalMove, match="full"):
        Board.from_moves("1111111")


def test_drop_returns_a_new_board_and_leaves_the_old_one() -> None:
    board = Board.from_moves("4")
    after = board.drop(3)
    assert board.moves == "4" and after.moves == "44"
    with pytest.raises(AttributeError):
        board._mask = 0  # type: ignore[misc]


@pytest.mark.parametrize("column", [-1, 7, 3.0, "3", None, True])
def test_drop_refuses_columns_off_the_board(column: object) -> None:
    with pytest.raises(IllegalMove, match="off the board"):
        Board().drop(column)  # type: ignore[arg-type]


def test_boards_survive_pickle_and_copy() -> None:
    board = Board.from_moves("1212121")
    for clone in (pickle.loads(pickle.dumps(board)), copy.deepcopy(board), copy.copy(board)):
        assert clone == board and clone.moves == board.moves and clone.winner() == 1


def test_draw_detection() -> None:
    board = Board.from_moves(DRAW_GAME)
    assert board.is_draw() and board.is_terminal() and board.winner() == 0
    assert board.legal_columns() == []
    assert grid_winner(grid_of(board)) == 0
    assert not Board.from_moves(DRAW_GAME[:-1]).is_draw()


def test_second_player_winning_with_the_42nd_stone_is_a_win_not_a_draw() -> None:
    board = Board.from_moves(SECOND_WINS_ON_42)
    assert board.moves_played == 42
    assert board.winner() == 2 and not board.is_draw() and board.is_terminal()
    ends_exactly_at_last_move(SECOND_WINS_ON_42, 2)


def test_no_moves_after_the_game_is_won() -> None:
    board = Board.from_moves("1212121")
    assert board.legal_columns() == []
    with pytest.raises(IllegalMove, match="already won"):
        board.drop(2)
    with pytest.raises(IllegalMove, match="move 8"):
        Board.from_moves("12121213")
    with pytest.raises(IllegalMove, match="full"):
        Board.from_moves(DRAW_GAME).drop(0)


@pytest.mark.parametrize(("moves", "index"), [("0", 1), ("448", 3), ("44a", 3), ("4 4", 2), ("4-", 2)])
def test_from_moves_rejects_bad_characters(moves: str, index: int) -> None:
    with pytest.raises(IllegalMove, match=f"move {index} of"):
        Board.from_moves(moves)


def test_to_text_exact_format() -> None:
    assert Board().to_text() == "\n".join(["0 1 2 3 4 5 6"] + [". . . . . . ."] * 6)
    assert Board.from_moves("4").to_text().splitlines()[-1] == ". . . X . . ."
    text = Board.from_moves("44554").to_text()
    assert text == "\n".join(
        [
            "0 1 2 3 4 5 6",
            ". . . . . . .",
            ". . . . . . .",
            ". . . . . . .",
            ". . . X . . .",
            ". . . O O . .",
            ". . . X X . .",
        ]
    )
    assert not text.endswith("\n")


def test_cells_moves_and_side_to_move() -> None:
    board = Board.from_moves("443")
    assert board.moves == "443" and board.moves_played == 3 and board.to_move == 2
    assert (board.cell(0, 3), board.cell(1, 3), board.cell(0, 2), board.cell(0, 0)) == (1, 2, 1, 0)
    with pytest.raises(IndexError):
        board.cell(6, 0)


def test_can_win_with() -> None:
    board = Board.from_moves("112233")
    assert [c for c in range(7) if board.can_win_with(c)] == [3]
    assert not Board.from_moves("1212121").can_win_with(0)  # game over


def test_equality_is_by_position() -> None:
    assert Board.from_moves("1234") == Board.from_moves("3214")
    assert hash(Board.from_moves("1234")) == hash(Board.from_moves("3214"))
    assert Board.from_moves("1234") != Board.from_moves("1243")
    assert len({Board(), Board.from_moves(""), Board.from_moves("4")}) == 2


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=6), max_size=60))
def test_board_agrees_with_a_plain_grid(columns: list[int]) -> None:
    board = Board()
    grid = [[0] * 7 for _ in range(6)]
    for column in columns:
        if board.is_terminal():
            with pytest.raises(IllegalMove):
                board.drop(column)
            break
        height = sum(1 for row in range(6) if grid[row][column])
        if height == 6:
            with pytest.raises(IllegalMove):
                board.drop(column)
            continue
        grid[height][column] = board.to_move
        board = board.drop(column)
        assert grid_of(board) == grid
        assert board.winner() == grid_winner(grid)
        full = all(grid[5][c] for c in range(7))
        assert board.is_draw() == (full and board.winner() == 0)
        assert board.legal_columns() == ([] if board.is_terminal() else [c for c in range(7) if not grid[5][c]])
        assert Board.from_moves(board.moves) == board
        assert [board.height(c) for c in range(7)] == [sum(1 for row in range(6) if grid[row][c]) for c in range(7)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=6), max_size=42))
def test_winning_and_threatened_moves_agree_with_dropping_a_stone(columns: list[int]) -> None:
    """The cached bitboards of wins (side to move) and threats (its opponent) name exactly the columns where that
    side's stone would make four, found here by dropping one."""
    board = Board()
    for column in columns:
        if board.is_terminal():
            break
        if column in board.legal_columns():
            board = board.drop(column)
    if board.is_terminal():
        return
    # The opponent's view of the same stones: pass its turn by swapping sides (a board with the same mask).
    swapped = Board._make(board.position ^ board.mask, board.mask, board.moves + "0", 0)
    for c in board.legal_columns():
        assert board.can_win_with(c) == (board.drop(c).winner() != 0)
        assert bool(board.threatened_moves() & COLUMN_MASKS[c]) == (swapped.drop(c).winner() != 0)
    # Only landing cells: a win the side to move cannot play now (a cell above an empty one) is not a move.
    assert board.winning_moves() & ~playable_cells(board.mask) == 0
    assert board.threatened_moves() & ~playable_cells(board.mask) == 0


def test_random_play_statistics_match_the_anchor() -> None:
    """ANCHORS: random vs random, first player wins ~55.8%, second ~44.0%, draws ~0.3%."""
    rng = random.Random(1234)
    games = 3000
    wins = [0, 0, 0]
    for _ in range(games):
        board = Board()
        while not board.is_terminal():
            board = board.drop(rng.choice(board.legal_columns()))
        wins[board.winner()] += 1
    first, second, draws = (wins[1] / games, wins[2] / games, wins[0] / games)
    assert 0.52 < first < 0.60
    assert 0.40 < second < 0.48
    assert draws < 0.015
