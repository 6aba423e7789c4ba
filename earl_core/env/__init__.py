"""Connect Four environment: rules, a batched numpy stepper, an exact solver and scripted opponents."""

from __future__ import annotations

from earl_core.env.batch import BoardBatch, StepResult
from earl_core.env.connect_four import CELLS, HEIGHT, WIDTH, Board
from earl_core.env.opponents import (
    HeuristicOpponent,
    Opponent,
    RandomOpponent,
    SolverOpponent,
    make_opponent,
)
from earl_core.env.solver import Solver, best_moves, solve, solve_depth_limited

__all__ = [
    "CELLS",
    "HEIGHT",
    "WIDTH",
    "Board",
    "BoardBatch",
    "HeuristicOpponent",
    "Opponent",
    "RandomOpponent",
    "Solver",
    "SolverOpponent",
    "StepResult",
    "best_moves",
    "make_opponent",
    "solve",
    "solve_depth_limited",
]
