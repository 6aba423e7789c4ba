"""Agent protocol: prompts show what the agent needs, the parser is robust and strict where it must be."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.agent import protocol
from earl_core.env.connect_four import Board


def test_system_prompt_names_side_and_format() -> None:
    assert "as X" in protocol.system_prompt(1) and "You move first" in protocol.system_prompt(1)
    assert "as O" in protocol.system_prompt(2) and "opponent moves first" in protocol.system_prompt(2)
    assert "[col N]" in protocol.system_prompt(1)


def test_turn_prompt_has_board_and_legal_columns() -> None:
    board = Board.from_moves("4444441")
    text = protocol.turn_prompt(board, 0)
    assert text.startswith("Opponent dropped a stone in column 0.")
    assert board.to_text() in text
    assert text.endswith("Legal columns: 0, 1, 2, 4, 5, 6.")


def test_parse_accepts_lenient_forms() -> None:
    b = Board()
    for text, col in [("[col 3]", 3), ("I play [COL 5] now", 5), ("[ col:2 ]", 2), ("[column 6]", 6),
                      ("[col 1] no wait [col 4]", 4), ("  0 ", 0)]:
        assert protocol.parse_answer(text, b).column == col, text


def test_parse_rejects_with_reason() -> None:
    full = Board.from_moves("111111")
    assert protocol.parse_answer("[col 0]", full).problem == "column 0 is full."
    assert "does not exist" in (protocol.parse_answer("[col 9]", Board()).problem or "")
    assert "does not exist" in (protocol.parse_answer("[col -1]", Board()).problem or "")
    assert protocol.parse_answer("column three", Board()).problem == "no [col N] found in your answer."
    assert not protocol.parse_answer("", Board()).ok
    assert not protocol.parse_answer("12", Board()).ok


def test_invalid_answers_name_their_kind() -> None:
    full = Board.from_moves("111111")
    kinds = {text: protocol.parse_answer(text, full).kind for text in ("[col 0]", "[col 9]", "[col -1]", "hmm", "")}
    assert kinds == {"[col 0]": protocol.FULL_COLUMN, "[col 9]": protocol.NO_SUCH_COLUMN,
                     "[col -1]": protocol.NO_SUCH_COLUMN, "hmm": protocol.UNREADABLE, "": protocol.UNREADABLE}
    assert protocol.parse_answer("[col 1]", full).kind is None
    assert protocol.parse_answer("[col " + "9" * 5000 + "]", Board()).problem == "no [col N] found in your answer."


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=60))
def test_parser_fuzz_never_crashes_and_is_consistent(text: str) -> None:
    board = Board.from_moves("4455")
    result = protocol.parse_answer(text, board)
    assert result.ok == (result.problem is None)
    if result.ok:
        assert result.column in board.legal_columns()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.text(alphabet=st.characters(blacklist_characters="[]"), max_size=20),
       st.text(alphabet=st.characters(blacklist_characters="[]"), max_size=20))
def test_canonical_answer_survives_surrounding_text(col: int, before: str, after: str) -> None:
    assert protocol.parse_answer(before + protocol.answer_text(col) + after, Board()).column == col


def test_cells_format_writes_one_word_per_cell() -> None:
    board = Board.from_moves("4453")  # X d1, O d2, X e1, O c1 (0-based columns 3, 3, 4, 2)
    lines = protocol.board_text(board, "cells").split("\n")
    assert len(lines) == 6 and all(len(line.split()) == 7 for line in lines)
    assert lines[0] == "afe bfe cfe dfe efe ffe gfe"  # the top row first, all empty
    assert lines[4] == "abe bbe cbe dbo ebe fbe gbe"  # second row from the bottom: O in column 3
    assert lines[5] == "aae bae cao dax eax fae gae"  # bottom row
    assert protocol.board_text(board, "rows") == board.to_text()
    text = protocol.turn_prompt(board, 2, "cells")
    assert "dax" in text and board.to_text() not in text and text.endswith("Legal columns: 0, 1, 2, 3, 4, 5, 6.")
    assert "dax" in protocol.retry_prompt(board, "column 9 does not exist.", "cells")


def test_cells_landing_names_the_cell_each_legal_column_fills() -> None:
    board = Board.from_moves("4453" + "111111")  # column 0 full; X d1, O d2, X e1, O c1 as above
    text = protocol.turn_prompt(board, 0, "cells_landing")
    assert protocol.board_text(board, "cells") in text
    assert text.endswith("Legal columns: 1 bae, 2 cbe, 3 dce, 4 ebe, 5 fae, 6 gae.")
    assert "would land in" in protocol.system_prompt(1, "cells_landing")
    assert "land in" not in protocol.system_prompt(1, "cells")
    assert protocol.retry_prompt(board, "column 0 is full.", "cells_landing").endswith("5 fae, 6 gae.")


def test_cells_stack_follows_each_landing_cell_with_the_run_of_like_stones_under_it() -> None:
    board = Board.from_moves("2424245" + "111111" + "66")
    # Column 0 full; 1: X X X; 3: O O O; 4: X; 5: O X (the X on top, the O below breaks the run); 2 and 6 empty.
    assert [board.cell(r, 5) for r in range(3)] == [2, 1, 0]
    text = protocol.turn_prompt(board, 5, "cells_stack")
    assert protocol.board_text(board, "cells") in text
    assert text.endswith("Legal columns: 1 bde xxx, 2 cae, 3 dde ooo, 4 ebe x, 5 fce x, 6 gae.")
    assert "right under that cell while they are alike" in protocol.system_prompt(1, "cells_stack")
    assert protocol.system_prompt(2, "cells_stack").startswith(protocol.system_prompt(2, "cells"))
    assert protocol.answer_text(3, board, "cells_stack") == "[col 3]"
    # cells_stack_checks: the same prompts, with the answer of cells_checks (here O to move: d wins, b blocks).
    assert protocol.turn_prompt(board, 5, "cells_stack_checks") == text
    both = protocol.system_prompt(1, "cells_stack_checks")
    assert both.startswith(protocol.system_prompt(1, "cells_stack")) and both.endswith(
        protocol.system_prompt(1, "cells_checks").rsplit(". Before your move", 1)[1])
    assert protocol.answer_text(3, board, "cells_stack_checks") == "bde block cae dde win ebe fce gae [col 3]"


def test_system_prompt_explains_the_board_format() -> None:
    assert "X = yours, O = your opponent's, . = empty" in protocol.system_prompt(1, "rows")
    assert protocol.system_prompt(1) == protocol.system_prompt(1, "rows")
    cells = protocol.system_prompt(2, "cells")
    assert "one word per cell" in cells and "o = yours, x = your opponent's, e = empty" in cells


def test_unknown_board_format_is_refused() -> None:
    with pytest.raises(ValueError, match="allowed: rows, cells, cells_landing"):
        protocol.turn_prompt(Board(), None, "columns")


def test_relative_view_writes_the_agents_stones_as_x_for_either_side() -> None:
    o_to_move = Board.from_moves("2424245" + "111111" + "66")  # the stack test's board: O to move
    x_to_move = o_to_move.drop(6)
    for board_format in ("rows", "cells", "cells_stack_checks"):
        # X to move: the relative view is the absolute one.
        assert (protocol.turn_prompt(x_to_move, 6, board_format, "relative")
                == protocol.turn_prompt(x_to_move, 6, board_format))
    # O to move: every stone changes letter, the stack words too; empty cells and landing cells do not.
    assert protocol.board_text(o_to_move, "cells", "relative") == protocol.board_text(
        o_to_move, "cells").replace("x", "_").replace("o", "x").replace("_", "o")
    assert protocol.turn_prompt(o_to_move, 5, "cells_stack", "relative").endswith(
        "Legal columns: 1 bde ooo, 2 cae, 3 dde xxx, 4 ebe o, 5 fce o, 6 gae.")
    assert protocol.board_text(o_to_move, "rows").split("\n")[-1] == "O X . O X O ."
    assert protocol.board_text(o_to_move, "rows", "relative").split("\n")[-1] == "X O . X O X ."
    assert "aax bao cae dax eao fax gae" in protocol.retry_prompt(o_to_move, "column 0 is full.", "cells", "relative")
    # The answer does not depend on the view: it names empty cells and marks (d wins for O, b blocks X's three).
    assert protocol.answer_text(3, o_to_move, "cells_stack_checks") == "bde block cae dde win ebe fce gae [col 3]"


def test_a_colour_swapped_position_reads_the_same_in_the_relative_view() -> None:
    # The same shapes, once with X to move (X's three in column 1) and once with O to move (O's three there, and
    # one more X stone, in column 6: the first player's extra move).
    x_to_move = Board.from_moves("252625")
    o_to_move = Board.from_moves("7252625")
    assert x_to_move.to_move == 1 and o_to_move.to_move == 2
    assert protocol.board_text(x_to_move, "cells", "relative") == protocol.board_text(
        o_to_move, "cells", "relative").replace("gao", "gae")
    assert "bde xxx" in protocol.turn_prompt(o_to_move, 6, "cells_stack", "relative")
    assert "bde ooo" in protocol.turn_prompt(o_to_move, 6, "cells_stack")


def test_relative_view_system_prompt_calls_the_agent_x_and_says_who_moves_first() -> None:
    second = protocol.system_prompt(2, "cells", "relative")
    assert "as X" in second and "Your opponent moves first" in second
    assert "x = yours, o = your opponent's" in second
    assert protocol.system_prompt(1, "cells", "relative") == protocol.system_prompt(1, "cells")
    assert "O = your opponent's" in protocol.system_prompt(2, "rows", "relative")
    with pytest.raises(ValueError, match="allowed: absolute, relative"):
        protocol.system_prompt(1, "cells", "mine")


def test_a_cells_tokenizer_makes_every_cell_one_token() -> None:
    """What the format is for: each (cell, content) is one token of a tokenizer trained on the protocol's text."""
    from earl_core.agent.teacher import protocol_corpus
    from earl_core.models.tokenizer import train_tokenizer

    tok = train_tokenizer(protocol_corpus(400, seed=0, board_format="cells"), vocab_size=512)
    board = Board.from_moves("123456712")
    for line in protocol.board_text(board, "cells").split("\n"):
        assert len(tok.encode(line, add_special_tokens=False)) == 7, line


@pytest.mark.parametrize(("moves", "marks"), [
    ("445566", {2: "win", 6: "win"}),  # X: d1 e1 f1, to move: both ends win (and win outranks O's c2 above c1)
    ("44556", {2: "block", 6: "block"}),  # the same row, O to move: both ends must be blocked
    ("44551676", {2: "gift", 6: "block"}),  # O: d2 e2 f2; g1 is filled (block g2), c1 is not (c1 hands O c2)
    ("3435451", {}),  # nothing decides the move
])
def test_check_marks_what_each_legal_column_does(moves: str, marks: dict[int, str]) -> None:
    board = Board.from_moves(moves)
    assert {c: protocol.check_mark(board, c) for c in board.legal_columns()} == {
        c: marks.get(c) for c in board.legal_columns()}


def test_cells_checks_answers_open_with_the_check_of_every_legal_column() -> None:
    board = Board.from_moves("44551676")
    check = "abe bae cae gift dce ece fce gbe block"
    assert protocol.check_text(board) == check
    assert protocol.answer_text(6, board, "cells_checks") == check + " [col 6]"
    assert protocol.parse_answer(protocol.answer_text(6, board, "cells_checks"), board).column == 6
    # The other formats answer with the column alone, board or no board.
    assert protocol.answer_text(6, board, "cells_landing") == protocol.answer_text(6) == "[col 6]"
    full = Board.from_moves("111111")
    assert protocol.check_text(full).split()[0] == "bae"  # a full column is left out, as in the legal line
    assert protocol.read_check(protocol.answer_text(6, board, "cells_checks")) == {
        c: protocol.check_mark(board, c) for c in board.legal_columns()}
    # A model's garbled check still shows what it wrote; the last [col N] and what follows are not part of it.
    assert protocol.read_check("abe zzz cae block blah gbe [col 6] dce win") == {0: None, 2: "block", 6: None}
    for board_format in ("cells_checks", "cells_stack_checks"):
        with pytest.raises(ValueError, match="checks the board"):
            protocol.answer_text(3, None, board_format)


def test_cells_checks_asks_for_the_check_and_shows_the_landing_cells() -> None:
    board = Board.from_moves("44551676")
    prompt = protocol.system_prompt(1, "cells_checks")
    assert prompt.startswith(protocol.system_prompt(1, "cells_landing"))
    assert "followed by win if your stone there connects four, block if" in prompt
    assert protocol.turn_prompt(board, 5, "cells_checks") == protocol.turn_prompt(board, 5, "cells_landing")
