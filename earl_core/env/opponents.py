"""Scripted Connect Four opponents for the agent to play against, and the ``opponent`` config spec that names them."""

from __future__ import annotations

import random
from typing import Protocol, runtime_checkable

from earl_core.env.connect_four import CELLS, COLUMN_MASKS, Board
from earl_core.env.solver import Solver
from earl_core.errors import ConfigError, IllegalMove

# Plies the plain "solver" spec searches: ~0.2 s per move at worst in pure Python, and exact play from the
# point where 8 or fewer cells are left. Deeper opponents are spelled "solver:D".
DEFAULT_SOLVER_DEPTH = 8
ALLOWED_SPECS = "random, heuristic, heuristic:P with P in 0..100 (% random moves), solver, solver:D with D in 1..42"

# Distance from the centre column; nearer columns join more lines of four.
_CENTRALITY = {column: abs(3 - column) for column in range(7)}


@runtime_checkable
class Opponent(Protocol):
    """Picks a 0-based column for the side to move; all randomness comes from the ``rng`` passed in."""

    name: str

    def choose(self, board: Board, rng: random.Random) -> int: ...


def _require_open(board: Board) -> list[int]:
    columns = board.legal_columns()
    if not columns:
        raise IllegalMove("the game is over; there is no move to choose")
    return columns


def _most_central(columns: list[int], rng: random.Random) -> int:
    """A random one of the columns nearest the centre."""
    nearest = min(_CENTRALITY[c] for c in columns)
    return rng.choice([c for c in columns if _CENTRALITY[c] == nearest])


class RandomOpponent:
    """Uniform over legal columns."""

    name = "random"

    def choose(self, board: Board, rng: random.Random) -> int:
        return rng.choice(_require_open(board))


class HeuristicOpponent:
    """Win now, else block, else avoid gifting a win on top, else the most central column (random among equals)."""

    name = "heuristic"

    def choose(self, board: Board, rng: random.Random) -> int:
        columns = _require_open(board)
        wins = [c for c in columns if board.can_win_with(c)]
        if wins:
            return rng.choice(wins)
        threats = [c for c in columns if opponent_wins_at(board, c)]
        if threats:
            # Two threats cannot both be blocked; blocking one still beats resigning.
            return rng.choice(threats)
        safe = [c for c in columns if not board.drop(c).can_win_with(c)]
        pool = safe or columns
        return _most_central(pool, rng)


def opponent_wins_at(board: Board, column: int) -> bool:
    """Whether the opponent would win by dropping into ``column`` if it were its turn."""
    return bool(board.threatened_moves() & COLUMN_MASKS[column])


class SolverOpponent:
    """Searches ``depth`` plies with the solver and plays one of the best-scoring columns.

    Among columns with the best score the most central ones are kept and one of those is drawn at random: before
    the horizon sees a result every column scores 0, and a random pick there throws away the opening. Plays
    perfectly once ``depth`` covers every empty cell; ``depth=42`` is perfect from the start (and slow in pure
    Python before the middle game).
    """

    def __init__(self, depth: int = DEFAULT_SOLVER_DEPTH) -> None:
        if not 1 <= depth <= CELLS:
            raise ConfigError(
                field="opponent", message=f"solver depth {depth} is out of range", allowed=ALLOWED_SPECS
            )
        self.depth = depth
        self.name = f"solver:{depth}"
        self._solver = Solver(max_entries=200_000)

    def choose(self, board: Board, rng: random.Random) -> int:
        _require_open(board)
        best = self._solver.best_moves(board, depth=self.depth)
        return _most_central(best, rng)


class NoisyOpponent:
    """Plays a uniformly random column `percent`% of the time, else the inner opponent's move.

    A curriculum step: against a strong scripted opponent a fresh agent never wins, so every game of a
    GRPO group scores the same and there is nothing to learn from; some noise makes wins possible.
    """

    def __init__(self, inner: Opponent, percent: int) -> None:
        self.inner = inner
        self.percent = percent
        self.name = f"{inner.name}:{percent}"

    def choose(self, board: Board, rng: random.Random) -> int:
        if self.percent and rng.random() * 100 < self.percent:
            return rng.choice(_require_open(board))
        return self.inner.choose(board, rng)


def make_opponent(spec: str) -> Opponent:
    """Build the opponent a config names: ``random``, ``heuristic``, ``heuristic:P`` (P% random moves),
    ``solver`` or ``solver:D`` (D plies, 1..42)."""
    text = spec.strip().lower() if isinstance(spec, str) else ""
    if text == "random":
        return RandomOpponent()
    if text == "heuristic":
        return HeuristicOpponent()
    if text.startswith("heuristic:"):
        digits = text.removeprefix("heuristic:")
        if digits.isascii() and digits.isdigit() and 0 <= int(digits) <= 100:
            return NoisyOpponent(HeuristicOpponent(), int(digits))
    if text == "solver":
        return SolverOpponent(DEFAULT_SOLVER_DEPTH)
    if text.startswith("solver:"):
        digits = text.removeprefix("solver:")
        if digits.isascii() and digits.isdigit() and 1 <= int(digits) <= CELLS:
            return SolverOpponent(int(digits))
    raise ConfigError(field="opponent", message=f"unknown opponent {spec!r}", allowed=ALLOWED_SPECS)
