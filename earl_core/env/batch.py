"""Many Connect Four games stepped at once on numpy uint64 bitboards (same encoding and rules as ``Board``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from earl_core.env.connect_four import (
    BOTTOM_CELLS,
    CELLS,
    COLUMN_BITS,
    HEIGHT,
    TOP_CELLS,
    WIDTH,
    Board,
    alignment_bits,
)

_BOTTOM = np.array(BOTTOM_CELLS, dtype=np.uint64)
_TOP = np.array(TOP_CELLS, dtype=np.uint64)


@dataclass(frozen=True)
class StepResult:
    """Per-game outcome of one ``BoardBatch.step``; every array has shape (N,)."""

    winner: np.ndarray  # int8: 0 none, 1 first player, 2 second player
    done: np.ndarray  # bool: won or full (also true for games that were already over)
    illegal: np.ndarray  # bool: the column was off the board or full; that game was left as it was


class BoardBatch:
    """N games side by side; ``step`` plays one column in each game that is still running.

    An illegal column leaves its game unchanged and sets ``illegal`` for it; what that costs the player is the
    caller's rule. Finished games ignore their column until ``reset``.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batch needs at least one game, got n={n}")
        self.n = n
        self._position = np.zeros(n, dtype=np.uint64)  # stones of the side to move
        self._mask = np.zeros(n, dtype=np.uint64)  # all stones
        self._count = np.zeros(n, dtype=np.int64)  # stones played
        self._winner = np.zeros(n, dtype=np.int8)
        self._history = np.zeros((n, CELLS), dtype=np.int8)  # 0-based columns, for board(i)

    @property
    def winner(self) -> np.ndarray:
        return self._winner.copy()

    @property
    def done(self) -> np.ndarray:
        return (self._winner != 0) | (self._count == CELLS)

    @property
    def moves_played(self) -> np.ndarray:
        return self._count.copy()

    @property
    def to_move(self) -> np.ndarray:
        """1 where the first player moves next, else 2; shape (N,)."""
        return (1 + (self._count & 1)).astype(np.int8)

    def legal_mask(self) -> np.ndarray:
        """(N, 7) bool: columns that accept a stone; all false in finished games."""
        open_columns = (self._mask[:, None] & _TOP[None, :]) == 0  # (N, 7)
        return open_columns & ~self.done[:, None]

    def reset(self, indices: Sequence[int] | np.ndarray | None = None) -> None:
        """Empty the boards at ``indices`` (all of them when None)."""
        rows = slice(None) if indices is None else np.asarray(indices, dtype=np.int64)
        self._position[rows] = 0
        self._mask[rows] = 0
        self._count[rows] = 0
        self._winner[rows] = 0
        self._history[rows] = 0

    def step(self, columns: np.ndarray | Sequence[int]) -> StepResult:
        """Play 0-based ``columns`` (shape (N,)) in every running game."""
        cols = np.asarray(columns)
        if cols.shape != (self.n,):
            raise ValueError(f"columns must have shape ({self.n},), got {cols.shape}")
        cols = cols.astype(np.int64)
        running = ~self.done
        on_board = (cols >= 0) & (cols < WIDTH)
        safe_cols = np.where(on_board, cols, 0)
        free = (self._mask & _TOP[safe_cols]) == 0
        legal = running & on_board & free
        illegal = running & ~legal

        idx = np.flatnonzero(legal)
        if idx.size:
            mask = self._mask[idx]
            col = safe_cols[idx]
            new_mask = mask | (mask + _BOTTOM[col])
            mover = self._position[idx] | (new_mask ^ mask)
            won = alignment_bits(mover) != 0
            count = self._count[idx]
            self._winner[idx] = np.where(won, 1 + (count & 1), 0).astype(np.int8)
            self._history[idx, count] = col
            # The opponent becomes the side to move: its stones are everything but the mover's.
            self._position[idx] = mover ^ new_mask
            self._mask[idx] = new_mask
            self._count[idx] = count + 1
        return StepResult(winner=self._winner.copy(), done=self.done, illegal=illegal)

    def board(self, i: int) -> Board:
        """Game ``i`` as an immutable ``Board`` (replayed from its history)."""
        played = self._history[i, : self._count[i]]
        return Board.from_moves("".join(str(int(c) + 1) for c in played))

    def cells(self) -> np.ndarray:
        """(N, 6, 7) int8 grid, row 0 at the bottom: 0 empty, 1 first player, 2 second player."""
        bits = (np.arange(HEIGHT)[:, None] + COLUMN_BITS * np.arange(WIDTH)[None, :]).astype(np.uint64)  # (6, 7)
        stone = (self._mask[:, None, None] >> bits) & np.uint64(1)
        mine = (self._position[:, None, None] >> bits) & np.uint64(1)
        to_move = self.to_move[:, None, None]
        return np.where(stone == 0, 0, np.where(mine == 1, to_move, 3 - to_move)).astype(np.int8)
