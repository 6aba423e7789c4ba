"""Connect Four rules on an immutable 7x6 bitboard (Pons layout: 7 bits per column, the top one a sentinel)."""

from __future__ import annotations

import operator
from typing import Any

from earl_core.errors import IllegalMove

WIDTH = 7
HEIGHT = 6
CELLS = WIDTH * HEIGHT
# Each column takes HEIGHT + 1 bits; the spare top bit keeps shifted lines from wrapping into the next column.
COLUMN_BITS = HEIGHT + 1

BOTTOM_MASK = sum(1 << (c * COLUMN_BITS) for c in range(WIDTH))
BOARD_MASK = BOTTOM_MASK * ((1 << HEIGHT) - 1)
COLUMN_MASKS = tuple(((1 << HEIGHT) - 1) << (c * COLUMN_BITS) for c in range(WIDTH))
BOTTOM_CELLS = tuple(1 << (c * COLUMN_BITS) for c in range(WIDTH))
TOP_CELLS = tuple(1 << (HEIGHT - 1 + c * COLUMN_BITS) for c in range(WIDTH))

_SYMBOLS = (".", "X", "O")


def alignment_bits(stones: Any) -> Any:
    """Non-zero where ``stones`` hold four in a row; works on Python ints and numpy uint64 arrays alike."""
    found = stones & 0  # zero of the same type (int or array)
    # Shifts: 1 = vertical, COLUMN_BITS = horizontal, HEIGHT and HEIGHT + 2 = the two diagonals.
    for shift in (1, COLUMN_BITS, HEIGHT, HEIGHT + 2):
        pairs = stones & (stones >> shift)
        found = found | (pairs & (pairs >> (2 * shift)))
    return found


def winning_cells(stones: int, mask: int) -> int:
    """Empty cells (playable or not) that would complete four in a row for ``stones``."""
    r = (stones << 1) & (stones << 2) & (stones << 3)  # vertical: three stones right below
    for shift in (COLUMN_BITS, HEIGHT, HEIGHT + 2):
        p = (stones << shift) & (stones << (2 * shift))
        r |= p & (stones << (3 * shift))
        r |= p & (stones >> shift)
        p = (stones >> shift) & (stones >> (2 * shift))
        r |= p & (stones << shift)
        r |= p & (stones >> (3 * shift))
    return r & (BOARD_MASK ^ mask)


def playable_cells(mask: int) -> int:
    """The lowest empty cell of every column that is not full."""
    return (mask + BOTTOM_MASK) & BOARD_MASK


class Board:
    """A Connect Four position; every move returns a new board.

    ``position`` holds the stones of the side to move and ``mask`` all stones (Pons' encoding), so the
    solver can work on the two ints directly. Equality is by position, not by the order of the moves.
    """

    # _wins / _threats: the playable cells that win now for the side to move / its opponent, found on first use
    # (None until then): the heuristic and the agent's prompts ask this of one board for every column.
    __slots__ = ("_position", "_mask", "_moves", "_winner", "_wins", "_threats")

    def __init__(self) -> None:
        object.__setattr__(self, "_position", 0)
        object.__setattr__(self, "_mask", 0)
        object.__setattr__(self, "_moves", "")
        object.__setattr__(self, "_winner", 0)
        object.__setattr__(self, "_wins", None)
        object.__setattr__(self, "_threats", None)

    @classmethod
    def _make(cls, position: int, mask: int, moves: str, winner: int) -> Board:
        board = cls.__new__(cls)
        object.__setattr__(board, "_position", position)
        object.__setattr__(board, "_mask", mask)
        object.__setattr__(board, "_moves", moves)
        object.__setattr__(board, "_winner", winner)
        object.__setattr__(board, "_wins", None)
        object.__setattr__(board, "_threats", None)
        return board

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Board is immutable; use drop() to get a new board")

    def __reduce__(self) -> tuple[Any, tuple[int, int, str, int]]:
        # Default pickling restores slots through __setattr__, which is closed; Ray and copy need this path. A plain
        # function, not the bound classmethod: Twisted (loaded with the web stack) re-registers how bound methods
        # pickle, and its version cannot find a classmethod again.
        return (_restore_board, (self._position, self._mask, self._moves, self._winner))

    @classmethod
    def from_moves(cls, moves: str) -> Board:
        """Replay ``moves``: digits 1-7 (1 = leftmost column), first player first, as in Pons' test files."""
        board = cls()
        for index, char in enumerate(moves):
            if char not in "1234567":
                raise IllegalMove(
                    f"move {index + 1} of {moves!r} is {char!r}: expected a column digit 1-7 (1 = leftmost)"
                )
            try:
                board = board.drop(int(char) - 1)
            except IllegalMove as err:
                raise IllegalMove(f"move {index + 1} of {moves!r} (column {char}): {err}") from err
        return board

    # --- state -----------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Bitboard of the side to move's stones."""
        return self._position

    @property
    def mask(self) -> int:
        """Bitboard of all stones."""
        return self._mask

    @property
    def moves(self) -> str:
        """Move history as 1-7 digits."""
        return self._moves

    @property
    def moves_played(self) -> int:
        return len(self._moves)

    @property
    def to_move(self) -> int:
        """1 when the first player is to move, else 2."""
        return 1 + (len(self._moves) & 1)

    def winner(self) -> int:
        """0 while nobody has four in a row, else the player (1 or 2) who made it."""
        return self._winner

    def is_draw(self) -> bool:
        """Board full without a winner; a four made with the 42nd stone is a win."""
        return self._winner == 0 and len(self._moves) == CELLS

    def is_terminal(self) -> bool:
        return self._winner != 0 or len(self._moves) == CELLS

    def legal_columns(self) -> list[int]:
        """0-based columns that accept a stone, ascending; empty once the game is over."""
        if self.is_terminal():
            return []
        return [c for c in range(WIDTH) if not self._mask & TOP_CELLS[c]]

    def height(self, column: int) -> int:
        """Stones in 0-based ``column``: the row a stone dropped there lands in (6 when full)."""
        return (self._mask & COLUMN_MASKS[self._column_index(column)]).bit_count()

    def cell(self, row: int, col: int) -> int:
        """0 empty, 1 first player, 2 second player; row 0 is the bottom."""
        if not (0 <= row < HEIGHT and 0 <= col < WIDTH):
            raise IndexError(f"cell ({row}, {col}) is off the 6x7 board")
        bit = 1 << (col * COLUMN_BITS + row)
        if not self._mask & bit:
            return 0
        mover = self.to_move
        return mover if self._position & bit else 3 - mover

    # --- moves -----------------------------------------------------------------------------------

    @staticmethod
    def _column_index(column: int) -> int:
        # operator.index lets numpy integers through while refusing floats and strings.
        try:
            index = operator.index(column)
        except TypeError:
            index = -1
        if isinstance(column, bool) or not 0 <= index < WIDTH:
            raise IllegalMove(f"column {column!r} is off the board (0-based columns 0-6)")
        return index

    def drop(self, column: int) -> Board:
        """Drop a stone of the side to move into 0-based ``column``."""
        column = self._column_index(column)
        if self._winner:
            raise IllegalMove(f"game is over: player {self._winner} has already won")
        if len(self._moves) == CELLS:
            raise IllegalMove("game is over: the board is full")
        mask = self._mask
        if mask & TOP_CELLS[column]:
            raise IllegalMove(f"column {column} (0-based) is full")
        new_mask = mask | (mask + BOTTOM_CELLS[column])
        mover_stones = self._position | (new_mask ^ mask)
        winner = self.to_move if alignment_bits(mover_stones) else 0
        # The opponent becomes the side to move: its stones are everything but the mover's.
        return Board._make(mover_stones ^ new_mask, new_mask, self._moves + str(column + 1), winner)

    def can_win_with(self, column: int) -> bool:
        """Whether the side to move wins at once by dropping into ``column``."""
        column = self._column_index(column)
        if self.is_terminal():
            return False
        return bool(self.winning_moves() & COLUMN_MASKS[column])

    def winning_moves(self) -> int:
        """Bitboard of the playable cells where the side to move would complete four in a row."""
        if self._wins is None:
            object.__setattr__(self, "_wins", winning_cells(self._position, self._mask) & playable_cells(self._mask))
        return self._wins

    def threatened_moves(self) -> int:
        """Bitboard of the playable cells where the opponent would complete four in a row if it were its turn."""
        if self._threats is None:
            # The opponent's stones are every stone that is not the side to move's.
            threats = winning_cells(self._position ^ self._mask, self._mask) & playable_cells(self._mask)
            object.__setattr__(self, "_threats", threats)
        return self._threats

    # --- presentation ----------------------------------------------------------------------------

    def to_text(self) -> str:
        """Header ``0 1 2 3 4 5 6``, then rows top to bottom with ``.``, ``X`` (first player), ``O``."""
        lines = [" ".join(str(c) for c in range(WIDTH))]
        for row in range(HEIGHT - 1, -1, -1):
            lines.append(" ".join(_SYMBOLS[self.cell(row, col)] for col in range(WIDTH)))
        return "\n".join(lines)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Board):
            return NotImplemented
        return self._position == other._position and self._mask == other._mask

    def __hash__(self) -> int:
        return hash((self._position, self._mask))

    def __repr__(self) -> str:
        return f"Board.from_moves({self._moves!r})"


def _restore_board(position: int, mask: int, moves: str, winner: int) -> Board:
    """Unpickling entry point of Board (see Board.__reduce__)."""
    return Board._make(position, mask, moves, winner)
