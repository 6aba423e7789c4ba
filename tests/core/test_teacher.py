"""Warm-start data: one-turn positions are turns of the teacher's games (or of mixed teacher/random play), answered
with the teacher's move."""

from __future__ import annotations

import random

import pytest

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder, answer_spans
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import (Turn, answer_ids, game_turns, is_tactical, mistake_column, mixed_play_turns,
                                     one_turn_positions, protocol_corpus, teacher_policy)
from earl_core.env.connect_four import Board
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent, opponent_wins_at


@pytest.fixture(scope="module")
def encoder(protocol_tokenizer) -> ChatEncoder:  # noqa: ANN001
    return ChatEncoder(protocol_tokenizer)


@pytest.fixture(scope="module")
def records(encoder: ChatEncoder) -> list[dict]:
    specs = [GameSpec(index=i, group=i, agent_side=1 + i % 2, opponent=RandomOpponent(), seed=i) for i in range(40)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), encoder, seed=3), encoder,
                        limits=RunnerLimits(board_format="cells"))
    return [e.record() for e in eps]


def _turns(records: list[dict]) -> dict[str, tuple[set[int], bool]]:
    """Hand replay of the games: each agent turn's (system prompt + turn prompt) -> (the teacher's columns there,
    tactical?)."""
    out: dict[str, tuple[set[int], bool]] = {}
    for r in records:
        board, last = Board(), None
        for ch in r["board_moves"]:
            column = int(ch) - 1
            if board.to_move == r["agent_side"]:
                prompt = protocol.system_prompt(r["agent_side"], "cells") + protocol.turn_prompt(board, last, "cells")
                tactical = any(board.can_win_with(c) or opponent_wins_at(board, c) for c in board.legal_columns())
                out.setdefault(prompt, (set(), tactical))[0].add(column)
            board, last = board.drop(column), column
    return out


def _messages(encoder: ChatEncoder, ids: list[int]) -> list[tuple[str, str]]:
    """A conversation's (role, text) messages, checking the chat framing on the way."""
    text = encoder.tokenizer.decode(ids)
    parts = text.split("<|im_start|>")
    assert parts[0] == ""
    out = []
    for i, part in enumerate(parts[1:]):
        role, _, body = part.partition("\n")
        last = i == len(parts) - 2
        assert body.endswith("<|im_end|>" if last else "<|im_end|>\n"), body
        out.append((role, body.removesuffix("\n").removesuffix("<|im_end|>")))
    return out


@pytest.mark.parametrize("per_conversation", [1, 8])
def test_positions_are_teacher_turns_with_the_teacher_answer(encoder: ChatEncoder, records: list[dict],
                                                             per_conversation: int) -> None:
    turns = _turns(records)
    conversations = one_turn_positions(game_turns(records), encoder, 400, seed=5, board_format="cells",
                                       per_conversation=per_conversation)
    assert len(conversations) == 400 // per_conversation
    tactical = positions = 0
    for conv in conversations:
        ids, mask = conv["token_ids"], conv["action_mask"]
        assert len(ids) == len(mask)
        messages = _messages(encoder, ids)
        roles = [role for role, _ in messages]
        assert roles == ["system"] + ["user", "assistant"] * per_conversation, "one side's system prompt, then turns"
        # The targets are exactly the answers, each with its closing <|im_end|>.
        targets = encoder.tokenizer.decode([t for t, m in zip(ids, mask) if m])
        answers = [text for role, text in messages if role == "assistant"]
        assert targets == "".join(a + "<|im_end|>" for a in answers)
        for (_, user), answer in zip(messages[1::2], answers):
            key = messages[0][1] + user
            assert key in turns, "a position of the games, with the opponent's move that led to it"
            columns, is_tactical = turns[key]
            assert protocol.parse_answer(answer, Board()).column in columns
            tactical += is_tactical
            positions += 1
    assert positions == 400
    # 70% drawn from the turns where a column wins for either side (400 draws: +-0.07 is over 3 sigma).
    assert abs(tactical / positions - 0.7) < 0.07


def test_packing_leaves_the_last_conversation_short(encoder: ChatEncoder, records: list[dict]) -> None:
    conversations = one_turn_positions(game_turns(records), encoder, 20, seed=1, board_format="cells",
                                       per_conversation=8)
    assert [sum(1 for role, _ in _messages(encoder, c["token_ids"]) if role == "assistant") for c in conversations] \
        == [8, 8, 4]


def test_positions_are_reproducible_and_optional(encoder: ChatEncoder, records: list[dict]) -> None:
    a = one_turn_positions(game_turns(records), encoder, 20, seed=1, board_format="cells")
    assert a == one_turn_positions(game_turns(records), encoder, 20, seed=1, board_format="cells")
    assert a != one_turn_positions(game_turns(records), encoder, 20, seed=2, board_format="cells")
    assert one_turn_positions(game_turns(records), encoder, 0) == []


def test_the_mistaken_column_is_the_previous_answer_where_it_filled_else_the_most_central_full_one() -> None:
    board = Board.from_moves("444444")  # the centre column (index 3) is full
    assert mistake_column(Board(), 3) is None and mistake_column(Board.from_moves("4444"), 3) is None
    assert mistake_column(board, None) == 3 and mistake_column(board, 5) == 3  # column 5 is not full
    both = Board.from_moves("444444111111")  # columns 0 and 3 are full
    assert mistake_column(both, 0) == 0 and mistake_column(both, 3) == 3 and mistake_column(both, 6) == 3
    assert mistake_column(Board.from_moves("111111777777"), None) == 0  # 0 and 6 tie on distance; the lower


def test_positions_with_mistakes_train_the_retry_and_leave_the_rest_as_it_was(encoder: ChatEncoder) -> None:
    turns = mixed_play_turns(HeuristicOpponent(), 40, seed=2)
    plain = one_turn_positions(turns, encoder, 200, seed=3, board_format="cells_landing", per_conversation=8)
    assert plain == one_turn_positions(turns, encoder, 200, seed=3, board_format="cells_landing",
                                       per_conversation=8, mistake_rate=0.0)
    mixed = one_turn_positions(turns, encoder, 200, seed=3, board_format="cells_landing", per_conversation=8,
                               mistake_rate=1.0)
    assert len(mixed) == len(plain)
    retried = 0
    for before, after in zip(plain, mixed):
        # The targets are the same answers, in the same order: only context was added.
        targets = lambda c: [t for t, m in zip(c["token_ids"], c["action_mask"]) if m]  # noqa: E731
        assert targets(before) == targets(after)
        messages = _messages(encoder, after["token_ids"])
        previous = None
        for i, (role, text) in enumerate(messages):
            if role != "user" or text.startswith("Invalid move"):
                continue
            board = _board_of(turns, text)
            wrong = mistake_column(board, previous)
            if wrong is None:  # no full column: answered at once
                assert messages[i + 1][0] == "assistant"
                assert i + 2 >= len(messages) or not messages[i + 2][1].startswith("Invalid move")
            else:  # every position with a full column (rate 1): the wrong answer, the feedback, the retry
                assert messages[i + 1] == ("assistant", protocol.answer_text(wrong))
                assert messages[i + 2] == ("user", protocol.retry_prompt(board, f"column {wrong} is full.",
                                                                         "cells_landing"))
                retried += 1
            previous = protocol.parse_answer(messages[i + 3 if wrong is not None else i + 1][1], Board()).column
    assert retried > 50  # mixed play fills the centre column in about half of its turns


def _board_of(turns: list[Turn], user_text: str) -> Board:
    """The board of the position whose turn prompt is `user_text`."""
    return next(t.board for t in turns if protocol.turn_prompt(t.board, t.last, "cells_landing") == user_text)


def test_game_turns_are_the_agent_moves_of_each_game(records: list[dict]) -> None:
    turns = game_turns(records)
    assert len(turns) == sum(sum(1 for i in range(len(r["board_moves"])) if i % 2 == r["agent_side"] - 1) for r in records)
    first = records[1]  # agent second: its first turn follows the opponent's first move
    opening = int(first["board_moves"][0]) - 1
    assert turns[len(game_turns(records[:1]))] == Turn(2, Board().drop(opening), int(first["board_moves"][1]) - 1,
                                                         opening)
    assert turns[0].last is None and turns[0].board == Board()


def test_answer_ids_end_the_turn_and_parse_back(encoder: ChatEncoder) -> None:
    for column in range(7):
        ids = answer_ids(encoder, column)
        assert ids[-1] == encoder.im_end
        assert protocol.parse_answer(encoder.tokenizer.decode(ids[:-1]), Board()).column == column


class _Recorder:
    """A teacher that notes every board it is asked about (to check that each turn carries its answer)."""

    def __init__(self) -> None:
        self.inner = HeuristicOpponent()
        self.asked: list[tuple[Board, int]] = []

    def choose(self, board: Board, rng: random.Random) -> int:
        column = self.inner.choose(board, rng)
        self.asked.append((board, column))
        return column


def test_mixed_play_turns_cover_both_sides_and_carry_the_teacher_answer() -> None:
    teacher = _Recorder()
    turns = mixed_play_turns(teacher, 60, seed=4)
    assert [(t.board, t.column) for t in turns] == teacher.asked, "every turn, labelled with what the teacher said"
    assert {t.side for t in turns} == {1, 2}
    assert all(t.side == t.board.to_move for t in turns)
    assert sum(1 for t in turns if not t.board.mask) == 60, "one empty board per game"
    # Each next turn's board is this one with `last` dropped: the move played, the teacher's or a random one. In
    # games of the pure teacher every move would be the teacher's; here about half are not.
    nexts = [(t, n) for t, n in zip(turns, turns[1:]) if n.board.mask]
    assert all(t.board.drop(n.last) == n.board for t, n in nexts)
    followed = sum(1 for t, n in nexts if n.last == t.column)
    assert 0.3 < followed / len(nexts) < 0.9
    wins = [(t.board, t.column) for t in turns if any(t.board.can_win_with(x) for x in t.board.legal_columns())]
    assert wins and all(b.can_win_with(c) for b, c in wins), "where a column wins, the label takes it"
    assert mixed_play_turns(HeuristicOpponent(), 5, seed=1) == mixed_play_turns(HeuristicOpponent(), 5, seed=1)


def test_mixed_play_holds_many_more_distinct_tactics_than_teacher_games(records: list[dict]) -> None:
    from_games = {t.board for t in game_turns(records) if is_tactical(t.board)}
    mixed = {t.board for t in mixed_play_turns(HeuristicOpponent(), len(records), seed=0) if is_tactical(t.board)}
    # Same number of games; the teacher beats random quickly (one open win per game), mixed play leaves tactics open.
    assert len(mixed) > 2 * len(from_games)  # 165 against 49 with these seeds



def test_the_heuristic_move_is_read_off_its_check() -> None:
    """What a cells_checks answer promises: the teacher's column carries the best mark of the check (a win where
    there is one, else a block, else no gift where a column without one is left)."""
    rng, teacher = random.Random(5), HeuristicOpponent()
    kinds = set()
    for _ in range(300):
        board = Board()
        while not board.is_terminal():
            marks = {c: protocol.check_mark(board, c) for c in board.legal_columns()}
            column = teacher.choose(board, rng)
            best = next((m for m in ("win", "block") if m in marks.values()), None)
            if best:
                assert marks[column] == best, (board.to_text(), marks, column)
            elif any(m is None for m in marks.values()):
                assert marks[column] is None, (board.to_text(), marks, column)
            kinds.add(marks[column])
            board = board.drop(rng.choice(board.legal_columns()) if rng.random() < 0.5 else column)
    assert kinds == {"win", "block", "gift", None}


def test_a_checks_answer_fits_the_new_tokens_the_config_asks_for() -> None:
    """rollout.max_new_tokens >= CHECKS_NEW_TOKENS with cells_checks: the longest teacher answer, <|im_end|>
    included, fits a tokenizer built for that format with room to spare."""
    from earl_core.config import CHECKS_NEW_TOKENS
    from earl_core.models.tokenizer import train_tokenizer

    tok = train_tokenizer(protocol_corpus(400, seed=0, board_format="cells_checks"), vocab_size=512)
    encoder = ChatEncoder(tok)
    rng, longest = random.Random(2), 0
    for _ in range(200):
        board = Board()
        while not board.is_terminal():
            column = rng.choice(board.legal_columns())
            ids = answer_ids(encoder, column, board, "cells_checks")
            assert protocol.parse_answer(tok.decode(ids[:-1]), board).column == column
            longest = max(longest, len(ids))
            board = board.drop(column)
    assert 10 < longest <= CHECKS_NEW_TOKENS - 8, longest


def test_cells_checks_teacher_games_and_positions_carry_the_check(encoder: ChatEncoder) -> None:
    specs = [GameSpec(index=i, group=i, agent_side=1 + i % 2, opponent=RandomOpponent(), seed=i) for i in range(6)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), encoder, seed=3, board_format="cells_checks"),
                        encoder, limits=RunnerLimits(board_format="cells_checks"))
    records = [e.record() for e in eps]

    def taught(record: dict) -> list[str]:
        return [encoder.tokenizer.decode(record["token_ids"][s:e]).removesuffix("<|im_end|>")
                for s, e in answer_spans(record["action_mask"])]

    turns = game_turns(records)
    expected = [protocol.answer_text(t.column, t.board, "cells_checks") for t in turns]
    assert [a for r in records for a in taught(r)] == expected
    positions = one_turn_positions(turns, encoder, 16, board_format="cells_checks", per_conversation=4)
    assert [len(taught(r)) for r in positions] == [4] * 4
    assert all(a in expected for r in positions for a in taught(r))
