"""Solver scores against published anchors, an independent brute force, symmetry and the depth-limited search."""

from __future__ import annotations

import random

import pytest

from earl_core.env.connect_four import Board
from earl_core.env.solver import Solver, best_moves, solve, solve_depth_limited

# First lines of Pascal Pons' public end-game benchmark (Test_L3_R1): "<moves> <score>", columns 1-7.
PONS_END_GAME = [
    ("2252576253462244111563365343671351441", -1),
    ("7422341735647741166133573473242566", 1),
    ("23163416124767223154467471272416755633", 0),
    ("71255763773133525731261364622167124446454", 0),
    ("65214673556155731566316327373221417", -1),
    ("52677675164321472411331752454", 0),
    ("3135151421347443544172316522225776773566", 0),
    ("562154564361751726662253737734213275114", 0),
    ("233377345754465174223731671122611552", 1),
    ("6763525635134453444361412671365712", -1),
    ("211376455663355325112113664364524722", 0),
    ("3146762114467714356347741621375222", -1),
    ("67152117737262713366376314254", 6),
    ("2762751722231276466633475674533", 5),
    ("3642756176227637211322113551637574556", 2),
    ("22647455554314246733661634615122372377511", 0),
    ("427566236745127177115664464254", 2),
    ("7172212567451542223676134464437761515", 0),
    ("641154574541323641152467137655232232366", 0),
    ("5775265212657176476365522624313714333", 2),
    ("3575316255751336464276636772271112", -3),
]


def brute_force(grid: list[list[int]], heights: list[int], player: int, stones: int) -> int:
    """Exhaustive negamax on a [col][row] grid, no pruning and no table; ``stones`` = stones already played."""
    best = None
    for col in range(7):
        row = heights[col]
        if row == 6:
            continue
        grid[col][row] = player
        heights[col] += 1
        if wins_through(grid, col, row, player):
            value = 22 - (stones // 2 + 1)  # our (stones // 2 + 1)-th stone completes four
        elif stones + 1 == 42:
            value = 0
        else:
            value = -brute_force(grid, heights, 3 - player, stones + 1)
        grid[col][row] = 0
        heights[col] -= 1
        best = value if best is None else max(best, value)
    assert best is not None
    return best


def wins_through(grid: list[list[int]], col: int, row: int, player: int) -> bool:
    for d_col, d_row in ((1, 0), (0, 1), (1, 1), (1, -1)):
        run = 1
        for sign in (1, -1):
            c, r = col + sign * d_col, row + sign * d_row
            while 0 <= c < 7 and 0 <= r < 6 and grid[c][r] == player:
                run += 1
                c, r = c + sign * d_col, r + sign * d_row
        if run >= 4:
            return True
    return False


def brute_force_board(board: Board) -> int:
    grid = [[board.cell(row, col) for row in range(6)] for col in range(7)]
    heights = [sum(1 for v in column if v) for column in grid]
    return brute_force(grid, heights, board.to_move, board.moves_played)


def random_open_position(rng: random.Random, empty: int) -> Board:
    """A random-play position with ``empty`` empty cells where the game is still running."""
    while True:
        board = Board()
        while board.moves_played < 42 - empty and not board.is_terminal():
            board = board.drop(rng.choice(board.legal_columns()))
        if not board.is_terminal():
            return board


def mirror(board: Board) -> Board:
    return Board.from_moves("".join(str(8 - int(m)) for m in board.moves))


def test_anchor_4455() -> None:
    assert solve(Board.from_moves("4455")) == 18


@pytest.mark.parametrize(("moves", "score"), PONS_END_GAME)
def test_pons_end_game_benchmark(moves: str, score: int) -> None:
    assert solve(Board.from_moves(moves)) == score


def test_matches_exhaustive_minimax_on_random_end_games() -> None:
    rng = random.Random(2024)
    checked = 0
    for empty in [4, 5, 6, 7, 8, 9, 10, 11, 12] * 8:
        board = random_open_position(rng, empty)
        assert solve(board) == brute_force_board(board), board
        checked += 1
    assert checked == 72


def test_best_moves_match_exhaustive_minimax() -> None:
    rng = random.Random(7)
    for empty in [5, 6, 7, 8, 9, 10] * 4:
        board = random_open_position(rng, empty)
        scores = {}
        for column in board.legal_columns():
            child = board.drop(column)
            if child.winner():
                scores[column] = 22 - (board.moves_played // 2 + 1)
            elif child.is_draw():
                scores[column] = 0
            else:
                scores[column] = -brute_force_board(child)
        top = max(scores.values())
        assert best_moves(board) == [c for c, v in scores.items() if v == top], board


def test_mirror_symmetry() -> None:
    rng = random.Random(11)
    for empty in [10, 12, 14, 16] * 5:
        board = random_open_position(rng, empty)
        assert solve(board) == solve(mirror(board))
        assert best_moves(mirror(board)) == sorted(6 - c for c in best_moves(board))


def test_immediate_win_scores_the_next_stone() -> None:
    board = Board.from_moves("112233")  # first player's 4th stone wins
    assert solve(board) == 22 - 4
    assert best_moves(board) == [3]
    second = Board.from_moves("7112233")  # second player to move, its 4th stone wins in column 4
    assert solve(second) == 22 - 4


def test_double_threat_is_a_loss_for_the_side_to_move() -> None:
    board = Board.from_moves("334455")  # X holds the bottom of columns 3-5 with both ends open, X to move
    assert solve(board) == 18
    assert best_moves(board) == [1, 5]
    # X wastes a move in column 1: O blocks one end, X wins at the other with its 5th stone.
    assert solve(board.drop(0)) == -(22 - 5)


def test_finished_boards_are_scored_as_they_ended() -> None:
    assert solve(Board.from_moves("442761225377252342545563474175371666631311")) == 0
    won = Board.from_moves("1212121")  # first player's 4th stone won
    assert solve(won) == -(22 - 4)
    assert best_moves(won) == []


def test_scores_stay_in_range() -> None:
    rng = random.Random(5)
    for empty in range(8, 22, 2):
        assert -18 <= solve(random_open_position(rng, empty)) <= 18


def test_depth_limited_search_is_exact_once_it_reaches_the_end() -> None:
    rng = random.Random(3)
    for empty in [6, 9, 12]:
        board = random_open_position(rng, empty)
        assert solve_depth_limited(board, empty) == solve(board)
        assert Solver().best_moves(board, depth=empty) == best_moves(board)


def test_depth_limited_best_moves_agree_with_move_scores() -> None:
    rng = random.Random(9)
    for depth in [1, 2, 3, 5, 7]:
        board = random_open_position(rng, rng.randint(18, 36))
        scores = Solver().move_scores(board, depth=depth)
        top = max(scores.values())
        assert Solver().best_moves(board, depth=depth) == [c for c, v in scores.items() if v == top]
        assert solve_depth_limited(board, depth) == top


def test_depth_limited_sees_a_forced_win() -> None:
    board = Board.from_moves("4455")  # X plays 3 or 6 and wins with its 4th stone whatever O does
    assert solve_depth_limited(board, 4) == 18
    assert set(Solver().best_moves(board, depth=4)) == {2, 5}
    with pytest.raises(ValueError):
        solve_depth_limited(board, 0)
