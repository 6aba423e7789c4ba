"""The text protocol between the game and the LLM agent: prompts, the answer format and its parser.

Answer format (documented in the system prompt): ``[col N]`` with N the 0-based column (0-6).
The parser is lenient about case, spaces and surrounding text (the last ``[col N]`` counts) and,
failing that, accepts an answer that is only a single digit. Anything else is an invalid answer.

Board formats (``game.board_format``; the system prompt explains the one in use):

- ``rows``: ``Board.to_text()`` -- a column header, then the rows top to bottom with X, O and ``.``;
- ``cells``: one word per cell, rows top to bottom -- column letter a-g (a = column 0), row letter a-f
  (a = bottom row), content x, o or e (empty): ``dax`` is an X in column 3 on the bottom row. A byte-level
  BPE tokenizer trained on this text makes every (cell, content) one token, so a stone's place is in its
  identity rather than in its position in the text; small models learn the tactics from it far sooner
  (bench/README.md, imitation_probe);
- ``cells_landing``: ``cells``, and each legal column is followed by the word of the empty cell its stone would land
  in (``Legal columns: 0 aae, 3 dbe, ...``): the same token as that cell of the board, so the cell a move fills
  is named rather than left to be worked out from the column's height;
- ``cells_checks``: ``cells_landing``, and the answer goes through the legal columns before the move (``check_text``):
  the landing cell of each, marked ``win`` where the agent's stone there connects four, ``block`` where the
  opponent's would, ``gift`` where it lets the opponent win on top: ``aae cbe block dce [col 2]``.
  A move is then read off its own line of the check; only the last ``[col N]`` counts, as always;
- ``cells_stack``: ``cells_landing``, and each landing cell is followed by the unbroken run of like stones right
  under it, the top of its column's stack, at most three (``Legal columns: 0 aae, 3 dde oo, 5 fbe x.``): a
  copy of up to three cells of the board, so a column's top stones sit next to the move that would cover them;
- ``cells_stack_checks``: ``cells_stack``, with the answer of ``cells_checks`` (the check, then the move).

Board views (``game.board_view``): ``absolute`` writes X for the first player's stones and O for the second's;
``relative`` writes the agent's own stones as X whichever side it plays (the system prompt then calls the agent X
and says who moves first). A prompt is always written for the side to move, the agent, so the view needs no more
than the board.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from earl_core.config import BOARD_FORMATS, BOARD_VIEWS, CHECK_FORMATS
from earl_core.env.connect_four import Board
from earl_core.env.opponents import opponent_wins_at

MARKS = {1: "X", 2: "O"}

_SYSTEM = (
    "You are playing Connect Four as {mark}. The board has 7 columns (0-6) and 6 rows; a stone dropped in a "
    "column falls to the lowest empty cell. Connect four of your stones in a row, column or diagonal to win. "
    "{first} Each turn you see the board {legend} and the legal columns. Answer with your move as [col N], "
    "for example [col 3]."
)
_LEGEND = {
    "rows": "({mine} = yours, {theirs} = your opponent's, . = empty)",
    "cells": ("(one word per cell, top row first: column letter a-g for columns 0-6, row letter a-f from the bottom, "
              "then {mine_lc} = yours, {theirs_lc} = your opponent's, e = empty)"),
}
# The cells formats that add words to the legal columns: each legal column's landing cell, and for the stack
# formats the stones under it.
_LANDING_FORMATS = ("cells_landing", "cells_checks", "cells_stack", "cells_stack_checks")
_STACK_FORMATS = ("cells_stack", "cells_stack_checks")
for _format in _LANDING_FORMATS:
    _LEGEND[_format] = _LEGEND["cells"]
_LANDING_NOTE = " Each legal column is followed by the cell its stone would land in."
_STACK_NOTE = (" Each legal column is followed by the cell its stone would land in and the stones right under that "
               "cell while they are alike, at most three, for example 3 dde oo.")
_CHECK_NOTE = (" Before your move, go through the legal columns: write the landing cell of each, followed by win if "
               "your stone there connects four, block if your opponent's would, gift if it lets your opponent win on "
               "top of it. Then answer, for example: aae cbe block dce [col 2]")
_LEGAL_NOTE = {
    "cells_landing": _LANDING_NOTE,
    "cells_checks": _LANDING_NOTE + _CHECK_NOTE,
    "cells_stack": _STACK_NOTE,
    "cells_stack_checks": _STACK_NOTE + _CHECK_NOTE,
}
_CELL_CONTENT = "exo"  # Board.cell values 0 (empty), 1 (X), 2 (O)
_SWAP_MARKS = str.maketrans("XO", "OX")  # a rows board in the relative view, second player to move
_CELL_WORD_RE = re.compile(r"^[a-g][a-f]e$")  # an empty cell's word: what a check names
CHECK_MARKS = ("win", "block", "gift")
# At most 3 digits: a long run of digits is no column, and int() of thousands of digits would raise.
_ANSWER_RE = re.compile(r"\[\s*col(?:umn)?\s*[:=]?\s*(-?\d{1,3})\s*\]", re.IGNORECASE)
_BARE_DIGIT_RE = re.compile(r"^\s*(\d)\s*$")


def _check_board_format(board_format: str, board_view: str = "absolute") -> None:
    if board_format not in BOARD_FORMATS:
        raise ValueError(f"unknown board format {board_format!r}; allowed: {', '.join(BOARD_FORMATS)}")
    if board_view not in BOARD_VIEWS:
        raise ValueError(f"unknown board view {board_view!r}; allowed: {', '.join(BOARD_VIEWS)}")


def system_prompt(agent_side: int, board_format: str = "rows", board_view: str = "absolute") -> str:
    """Rules for the agent playing side 1 (moves first) or 2, with the legend of the board format. The agent is X
    as first player and O as second, or X either way in the relative view."""
    _check_board_format(board_format, board_view)
    shown_as = 1 if board_view == "relative" else agent_side  # the side whose letter the agent's stones get
    mine, theirs = MARKS[shown_as], MARKS[3 - shown_as]
    first = "You move first." if agent_side == 1 else "Your opponent moves first."
    legend = _LEGEND[board_format].format(mine=mine, theirs=theirs, mine_lc=mine.lower(), theirs_lc=theirs.lower())
    return _SYSTEM.format(mark=mine, first=first, legend=legend) + _LEGAL_NOTE.get(board_format, "")


def board_text(board: Board, board_format: str = "rows", board_view: str = "absolute") -> str:
    """The board as the agent, the side to move, reads it: one of BOARD_FORMATS in one of BOARD_VIEWS (see the
    module docstring)."""
    _check_board_format(board_format, board_view)
    if board_format == "rows":
        return board.to_text().translate(_SWAP_MARKS) if _swapped(board, board_view) else board.to_text()
    return "\n".join(" ".join(_cell_word(board, row, c, board_view) for c in range(7)) for row in range(5, -1, -1))


def _swapped(board: Board, board_view: str) -> bool:
    """Whether the view writes X for O and O for X: in the relative view, when the second player is to move."""
    return board_view == "relative" and board.to_move == 2


def _content(board: Board, row: int, column: int, board_view: str) -> int:
    """A cell as the view writes it: 0 empty, 1 X, 2 O."""
    value = board.cell(row, column)
    return 3 - value if value and _swapped(board, board_view) else value


def _cell_word(board: Board, row: int, column: int, board_view: str = "absolute") -> str:
    return "abcdefg"[column] + "abcdef"[row] + _CELL_CONTENT[_content(board, row, column, board_view)]


def _landing_word(board: Board, column: int) -> str:
    """The word of the empty cell a stone dropped in (legal) `column` lands in."""
    return _cell_word(board, board.height(column), column)


def _stack_top(board: Board, column: int, board_view: str) -> str:
    """The unbroken run of like stones on top of `column`, at most three, as content letters (``oo``); '' if empty."""
    height = board.height(column)
    top = _content(board, height - 1, column, board_view) if height else 0
    run = 0
    # A run of three is all a move can complete or must stop; a fourth like stone below would have ended the game.
    while run < min(3, height) and _content(board, height - 1 - run, column, board_view) == top:
        run += 1
    return _CELL_CONTENT[top] * run


def _legal_entry(board: Board, column: int, board_format: str, board_view: str) -> str:
    """One legal column as the legal line writes it: its number, then the words its format adds."""
    words = [str(column)]
    if board_format in _LANDING_FORMATS:
        words.append(_landing_word(board, column))
    if board_format in _STACK_FORMATS:
        words.append(_stack_top(board, column, board_view))
    return " ".join(word for word in words if word)


def _legal_text(board: Board, board_format: str, board_view: str) -> str:
    entries = (_legal_entry(board, c, board_format, board_view) for c in board.legal_columns())
    return "Legal columns: " + ", ".join(entries) + "."


def turn_prompt(board: Board, opponent_column: int | None, board_format: str = "rows",
                board_view: str = "absolute") -> str:
    """The user message opening an agent turn: the opponent's move, the board, the legal columns."""
    # The opponent's move is phrased unlike an answer ("column N", not "[col N]") so that copying it is not
    # the easiest thing for a small model to learn.
    head = "Your move." if opponent_column is None else f"Opponent dropped a stone in column {opponent_column}."
    return f"{head}\n{board_text(board, board_format, board_view)}\n{_legal_text(board, board_format, board_view)}"


def retry_prompt(board: Board, problem: str, board_format: str = "rows", board_view: str = "absolute") -> str:
    """Feedback after an invalid answer; the agent gets one more try (configurable)."""
    return (f"Invalid move: {problem} Answer with [col N].\n{board_text(board, board_format, board_view)}\n"
            f"{_legal_text(board, board_format, board_view)}")


def check_mark(board: Board, column: int) -> str | None:
    """What dropping into legal `column` does for the side to move: win (connects four), block (the opponent would
    connect four there), gift (the opponent can then win on top of it), or None. The first that holds counts:
    the heuristic's own order (earl_core.env.opponents.HeuristicOpponent)."""
    if board.can_win_with(column):
        return "win"
    if opponent_wins_at(board, column):
        return "block"
    if board.drop(column).can_win_with(column):
        return "gift"
    return None


def check_text(board: Board) -> str:
    """The check a ``cells_checks`` answer opens with: the landing cell of every legal column, each with its mark."""
    words = []
    for column in board.legal_columns():
        mark = check_mark(board, column)
        # The landing cell alone names the column (its letter); a digit beside it would cost two more tokens.
        words.append(_landing_word(board, column) + (f" {mark}" if mark else ""))
    return " ".join(words)


def read_check(text: str) -> dict[int, str | None]:
    """The marks an answer's check gives the columns it names (column -> win / block / gift / None): each landing
    cell word and the mark after it, up to the answer's last ``[col``. The inverse of ``check_text``, lenient: words
    it does not know are skipped, so a model's garbled check still shows what it did write."""
    words = text.rsplit("[col", 1)[0].split()  # the whole text where there is no [col
    marks: dict[int, str | None] = {}
    for k, word in enumerate(words):
        if _CELL_WORD_RE.match(word):
            after = words[k + 1] if k + 1 < len(words) else None
            marks["abcdefg".index(word[0])] = after if after in CHECK_MARKS else None
    return marks


def answer_text(column: int, board: Board | None = None, board_format: str = "rows") -> str:
    """The canonical answer for a column (what a teacher writes in the warm start); with a check format
    (``cells_checks``, ``cells_stack_checks``) it opens with the check of `board`."""
    if board_format in CHECK_FORMATS:
        if board is None:
            raise ValueError(f"a {board_format} answer checks the board: pass it")
        return f"{check_text(board)} [col {column}]"
    return f"[col {column}]"


# Kinds of invalid answer (``ParsedAnswer.kind``): what evaluation counts, so a breakdown says whether a model
# lost the format or misread the board.
UNREADABLE = "unreadable"
NO_SUCH_COLUMN = "no such column"
FULL_COLUMN = "full column"
INVALID_KINDS = (UNREADABLE, NO_SUCH_COLUMN, FULL_COLUMN)


@dataclass(frozen=True)
class ParsedAnswer:
    """Result of reading an agent's answer: a column, or a problem to report back and its kind."""

    column: int | None
    problem: str | None = None
    kind: str | None = None  # one of INVALID_KINDS when the answer is invalid

    @property
    def ok(self) -> bool:
        return self.column is not None


def parse_answer(text: str, board: Board) -> ParsedAnswer:
    """Read the agent's column from free text and check it against the board."""
    matches = _ANSWER_RE.findall(text)
    if matches:
        raw = matches[-1]
    else:
        bare = _BARE_DIGIT_RE.match(text)
        if bare is None:
            return ParsedAnswer(None, "no [col N] found in your answer.", UNREADABLE)
        raw = bare.group(1)
    column = int(raw)
    if not 0 <= column <= 6:
        return ParsedAnswer(None, f"column {column} does not exist (columns are 0-6).", NO_SUCH_COLUMN)
    if column not in board.legal_columns():
        return ParsedAnswer(None, f"column {column} is full.", FULL_COLUMN)
    return ParsedAnswer(column)
