"""Connect Four solver after Pascal Pons: bitboard negamax with alpha-beta, transposition table, null-window bisection.

Scores follow Pons' convention, from the side to move: winning with your k-th stone scores 22 - k, a draw 0, losing
to the opponent's k-th stone -(22 - k); reachable scores lie in -18..18 (-21..21 counting finished games).
A finished board is scored as it ended: 0 for a draw, -(22 - k) when the opponent has just won with its k-th stone.

The same search runs depth-limited (for the ``solver:D`` opponents): past the horizon a position scores 0, but
forced wins and losses seen by the move filter still count, and once the horizon reaches the end of the game the
result is the exact score.
"""

from __future__ import annotations

from earl_core.env.connect_four import (
    BOARD_MASK,
    BOTTOM_MASK,
    CELLS,
    COLUMN_MASKS,
    Board,
    winning_cells,
)
from earl_core.errors import IllegalMove

# Centre columns take part in more lines, so searching them first finds cut-offs sooner.
CENTRE_FIRST = (3, 2, 4, 1, 5, 0, 6)
MIN_SCORE = -(CELLS // 2) + 3
MAX_SCORE = (CELLS + 1) // 2 - 3
EXACT = CELLS  # a depth that always reaches the end of the game
_DEPTH_BITS = 6  # transposition keys carry the depth so depth-limited bounds never mix with exact ones


def _win_now_score(moves: int) -> int:
    """Score of winning with the next stone after ``moves`` stones were played."""
    return (CELLS + 1 - moves) // 2


def _loss_next_score(moves: int) -> int:
    """Score of losing to the opponent's next stone after ``moves`` stones were played."""
    return -((CELLS - moves) // 2)


def finished_score(board: Board) -> int:
    """Score of a finished game from the side to move (0 for a draw, negative for the loser)."""
    if not board.is_terminal():
        raise IllegalMove("the game is not over")
    if board.winner() == 0:
        return 0
    winner_stones = (board.moves_played + 1) // 2
    return -(CELLS // 2 + 1 - winner_stones)


class Solver:
    """Holds the transposition table so repeated searches (a game, a move list) reuse earlier work."""

    def __init__(self, *, max_entries: int = 1_000_000) -> None:
        self.max_entries = max_entries
        self.nodes = 0
        self._upper: dict[int, int] = {}
        self._lower: dict[int, int] = {}

    def clear(self) -> None:
        self._upper.clear()
        self._lower.clear()

    def _negamax(self, position: int, mask: int, moves: int, alpha: int, beta: int, depth: int) -> int:
        """Bound on the score: true score <= result when result <= alpha, >= result when result >= beta.

        Requires that the side to move cannot win at once (callers check; the move filter keeps it true below).
        """
        self.nodes += 1
        possible = (mask + BOTTOM_MASK) & BOARD_MASK
        opponent_wins = winning_cells(position ^ mask, mask)
        forced = possible & opponent_wins
        if forced:
            if forced & (forced - 1):  # two threats to block: lost whatever we play
                return -((CELLS - moves) // 2)
            possible = forced
        # Never play right below a cell where the opponent would complete four.
        candidates = possible & ~(opponent_wins >> 1)
        if not candidates:
            return -((CELLS - moves) // 2)
        if moves >= CELLS - 2:
            return 0  # neither side can win any more (checked above)
        if depth <= 0:
            return 0  # horizon of a depth-limited search
        low = -((CELLS - 2 - moves) // 2)  # the opponent cannot win with its next stone
        if alpha < low:
            alpha = low
            if alpha >= beta:
                return alpha
        high = (CELLS - 1 - moves) // 2  # we cannot win with our next stone
        key = ((position + mask) << _DEPTH_BITS) | min(depth, CELLS - moves)
        upper = self._upper.get(key)
        if upper is not None and upper < high:
            high = upper
        if beta > high:
            beta = high
            if alpha >= beta:
                return beta
        lower = self._lower.get(key)
        if lower is not None and lower > alpha:
            alpha = lower
            if alpha >= beta:
                return alpha

        # Order: cells that open the most threats first, centre first among equals.
        ordered: list[tuple[int, int, int]] = []
        for rank, column in enumerate(CENTRE_FIRST):
            move = candidates & COLUMN_MASKS[column]
            if move:
                threats = winning_cells(position | move, mask).bit_count()
                ordered.append((-threats, rank, move))
        ordered.sort()

        child_position = position ^ mask
        for _, _, move in ordered:
            score = -self._negamax(child_position, mask | move, moves + 1, -beta, -alpha, depth - 1)
            if score >= beta:
                if len(self._lower) >= self.max_entries:
                    self._lower.clear()
                self._lower[key] = score
                return score
            if score > alpha:
                alpha = score
        if len(self._upper) >= self.max_entries:
            self._upper.clear()
        self._upper[key] = alpha
        return alpha

    def _search(self, board: Board, low: int, high: int, depth: int) -> int:
        """Narrow [low, high] with null-window searches until it pins the score (the MTD-style bisection)."""
        while low < high:
            mid = low + (high - low) // 2
            # Lean towards 0 first: most positions score near it, and small windows there are cheap to refute.
            if mid <= 0 and int(low / 2) < mid:
                mid = int(low / 2)
            elif mid >= 0 and int(high / 2) > mid:
                mid = int(high / 2)
            result = self._negamax(board.position, board.mask, board.moves_played, mid, mid + 1, depth)
            if result <= mid:
                high = result
            else:
                low = result
        return low

    def score(self, board: Board, *, depth: int = EXACT) -> int:
        """Score of ``board`` for the side to move; exact unless ``depth`` (plies) stops short of the end."""
        if board.is_terminal():
            return finished_score(board)
        n = board.moves_played
        if board.winning_moves():
            return _win_now_score(n)
        return self._search(board, _loss_next_score(n), _win_now_score(n), depth)

    def move_scores(self, board: Board, *, depth: int = EXACT) -> dict[int, int]:
        """Score of every legal column (0-based) for the side to move, each searched ``depth`` plies."""
        return {column: self._after(board, column, depth) for column in board.legal_columns()}

    def _after(self, board: Board, column: int, depth: int) -> int:
        if board.can_win_with(column):
            return _win_now_score(board.moves_played)
        return -self.score(board.drop(column), depth=depth - 1)

    def best_moves(self, board: Board, *, depth: int = EXACT) -> list[int]:
        """0-based columns that reach the best score, ascending; one null-window test per column."""
        if board.is_terminal():
            return []
        best = self.score(board, depth=depth)
        n = board.moves_played
        chosen: list[int] = []
        for column in board.legal_columns():
            if board.can_win_with(column):
                if best == _win_now_score(n):
                    chosen.append(column)
                continue
            child = board.drop(column)
            if child.is_terminal() or child.winning_moves():
                value = -self.score(child, depth=depth - 1)
                if value == best:
                    chosen.append(column)
                continue
            # The child's score is <= -best exactly when this column reaches best (it cannot beat it).
            result = self._negamax(child.position, child.mask, n + 1, -best, -best + 1, depth - 1)
            if result <= -best:
                chosen.append(column)
        return chosen


def solve(board: Board) -> int:
    """Exact score of ``board`` for the side to move (see the module docstring for finished boards)."""
    return Solver().score(board)


def best_moves(board: Board) -> list[int]:
    """0-based columns achieving the exact optimal score, ascending (empty for a finished board)."""
    return Solver().best_moves(board)


def solve_depth_limited(board: Board, depth: int) -> int:
    """Score of ``board`` searched ``depth`` plies deep (0 past the horizon); exact once depth covers the game."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    return Solver().score(board, depth=depth)
