"""Scripted opponents: legality, tactics, relative strength, and the ``opponent`` spec parser."""

from __future__ import annotations

import random

import pytest

from earl_core.env.connect_four import Board
from earl_core.env.opponents import (
    ALLOWED_SPECS,
    NoisyOpponent,
    DEFAULT_SOLVER_DEPTH,
    HeuristicOpponent,
    Opponent,
    RandomOpponent,
    SolverOpponent,
    make_opponent,
)
from earl_core.env.solver import best_moves
from earl_core.errors import ConfigError, IllegalMove


def play(first: Opponent, second: Opponent, rng: random.Random) -> int:
    """Play one game and return the winner (0 for a draw)."""
    board = Board()
    players = (first, second)
    while not board.is_terminal():
        column = players[board.moves_played % 2].choose(board, rng)
        assert column in board.legal_columns()
        board = board.drop(column)
    return board.winner()


def results(first: Opponent, second: Opponent, *, games: int, seed: int) -> list[int]:
    """[draws, first player wins, second player wins] over seeded games."""
    rng = random.Random(seed)
    tally = [0, 0, 0]
    for _ in range(games):
        tally[play(first, second, rng)] += 1
    return tally


def test_every_opponent_satisfies_the_protocol_and_plays_legal_moves() -> None:
    rng = random.Random(0)
    for opponent in (RandomOpponent(), HeuristicOpponent(), SolverOpponent(3)):
        assert isinstance(opponent, Opponent)
        for _ in range(3):
            play(opponent, opponent, rng)  # play() checks every column is legal
        with pytest.raises(IllegalMove):
            opponent.choose(Board.from_moves("1212121"), rng)


def test_random_opponent_is_reproducible_from_the_seed() -> None:
    board = Board.from_moves("4")
    picks = [RandomOpponent().choose(board, random.Random(42)) for _ in range(5)]
    assert len(set(picks)) == 1
    spread = {RandomOpponent().choose(board, random.Random(seed)) for seed in range(50)}
    assert spread == set(range(7))


def test_heuristic_beats_random_as_first_player() -> None:
    draws, wins, losses = results(HeuristicOpponent(), RandomOpponent(), games=200, seed=1)
    assert wins / 200 >= 0.9


def test_heuristic_takes_an_immediate_win() -> None:
    board = Board.from_moves("112233")  # X holds columns 1-3 of the bottom row and is to move
    for seed in range(20):
        assert HeuristicOpponent().choose(board, random.Random(seed)) == 3


def test_heuristic_blocks_an_immediate_threat() -> None:
    board = Board.from_moves("17273")  # X threatens column 4 (0-based 3); O to move
    for seed in range(20):
        assert HeuristicOpponent().choose(board, random.Random(seed)) == 3


def test_heuristic_prefers_winning_to_blocking() -> None:
    board = Board.from_moves("1727376")  # X threatens column 4, O can complete column 7 first
    assert board.to_move == 2 and board.can_win_with(6)
    for seed in range(20):
        assert HeuristicOpponent().choose(board, random.Random(seed)) == 6


def test_heuristic_does_not_play_under_the_opponents_winning_cell() -> None:
    # X holds row 2 in columns 3, 5, 6; an O stone in the centre column would let X complete the row on top.
    board = Board.from_moves("5653673")
    assert board.to_move == 2 and board.drop(3).can_win_with(3)
    for seed in range(20):
        assert HeuristicOpponent().choose(board, random.Random(seed)) != 3


def test_heuristic_opens_in_the_centre() -> None:
    assert HeuristicOpponent().choose(Board(), random.Random(0)) == 3


def test_solver_opponent_beats_heuristic_more_often_than_heuristic_beats_itself() -> None:
    _, heuristic_wins, _ = results(HeuristicOpponent(), HeuristicOpponent(), games=100, seed=3)
    _, solver_wins, solver_losses = results(SolverOpponent(4), HeuristicOpponent(), games=60, seed=3)
    assert solver_wins / 60 > heuristic_wins / 100
    assert solver_losses < solver_wins
    # Second player too: the solver loses less than heuristic does in the same seat.
    _, heuristic_first_wins, _ = results(HeuristicOpponent(), HeuristicOpponent(), games=100, seed=4)
    _, beats_solver, _ = results(HeuristicOpponent(), SolverOpponent(4), games=60, seed=4)
    assert beats_solver / 60 < heuristic_first_wins / 100


def test_deep_solver_opponent_plays_a_perfect_move() -> None:
    rng = random.Random(8)
    for _ in range(15):
        board = Board()
        while board.moves_played < 30 and not board.is_terminal():
            board = board.drop(rng.choice(board.legal_columns()))
        if board.is_terminal():
            continue
        assert SolverOpponent(42).choose(board, rng) in best_moves(board)


@pytest.mark.parametrize(
    ("spec", "kind", "name"),
    [
        ("random", RandomOpponent, "random"),
        ("heuristic", HeuristicOpponent, "heuristic"),
        ("solver", SolverOpponent, f"solver:{DEFAULT_SOLVER_DEPTH}"),
        ("solver:1", SolverOpponent, "solver:1"),
        ("solver:42", SolverOpponent, "solver:42"),
        (" Solver:6 ", SolverOpponent, "solver:6"),
        ("heuristic:30", NoisyOpponent, "heuristic:30"),
        ("heuristic:0", NoisyOpponent, "heuristic:0"),
    ],
)
def test_make_opponent_parses_specs(spec: str, kind: type, name: str) -> None:
    opponent = make_opponent(spec)
    assert isinstance(opponent, kind) and opponent.name == name


@pytest.mark.parametrize(
    "spec", ["", "minimax", "solver:0", "solver:43", "solver:", "solver:x", "solver:-1", "solver:²", "solver:4.5",
             "heuristic:101", "heuristic:", "heuristic:-5", "heuristic:x"]
)
def test_make_opponent_rejects_unknown_specs(spec: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_opponent(spec)
    assert caught.value.field == "opponent"
    assert caught.value.allowed == ALLOWED_SPECS


def test_noisy_heuristic_sits_between_random_and_heuristic() -> None:
    heuristic, noisy, rand = HeuristicOpponent(), make_opponent("heuristic:50"), RandomOpponent()
    pure = results(heuristic, heuristic, games=200, seed=5)[1]
    vs_noisy = results(heuristic, noisy, games=200, seed=5)[1]
    vs_random = results(heuristic, rand, games=200, seed=5)[1]
    assert vs_random >= vs_noisy > pure  # the heuristic beats its noisy self more often than itself
    assert results(heuristic, make_opponent("heuristic:0"), games=50, seed=1) == results(heuristic, heuristic, games=50, seed=1)


def test_solver_opponent_refuses_a_bad_depth() -> None:
    with pytest.raises(ConfigError):
        SolverOpponent(0)
