"""Scripted players speaking the agent protocol: warm-start teachers and positions, the tokenizer's corpus."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, NamedTuple

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import Policy
from earl_core.engines.base import Generation
from earl_core.env.connect_four import Board
from earl_core.env.opponents import Opponent, RandomOpponent, opponent_wins_at


# A mixed game has ~20 turns (both sides counted) and ~4 tactical ones: one game per 8 positions drawn keeps
# nearly every tactical draw distinct (80,000 positions: 10,000 games, ~39,000 distinct tactical boards, ~10 s).
MIXED_POSITIONS_PER_GAME = 8


class Turn(NamedTuple):
    """One position to imitate."""

    side: int  # the side to move (1 or 2)
    board: Board
    column: int  # the teacher's column there (0-based)
    last: int | None  # the opponent's move that led here (None on an empty board)


def answer_ids(encoder: ChatEncoder, column: int, board: Board | None = None, board_format: str = "rows") -> list[int]:
    """Token ids of the canonical answer naming `column` on `board`, closed with <|im_end|> (what a taught turn ends
    with)."""
    text = protocol.answer_text(column, board, board_format)
    return encoder.tokenizer.encode(text, add_special_tokens=False) + [encoder.im_end]


def mistake_column(board: Board, previous: int | None) -> int | None:
    """The full column an imitator names by mistake on `board`: the one its previous answer named, where that
    column is full now (a trained agent repeats its last answer into a column that just filled, and again on the
    retry), else the most central full column; None where no column is full."""
    legal = board.legal_columns()
    full = [c for c in range(7) if c not in legal]
    if not full:
        return None
    return previous if previous in full else min(full, key=lambda c: abs(3 - c))


def teacher_policy(teacher: Opponent, encoder: ChatEncoder, *, seed: int = 0, mistake_rate: float = 0.0,
                   board_format: str = "rows") -> Policy:
    """A policy that answers every turn with the teacher's move in the canonical format.

    With `mistake_rate`, a turn where some column is full first names a full column (`mistake_column`), marked
    not trainable; the retry then gets the teacher's move.
    """
    rng = random.Random(seed)

    def answer(board: Board, column: int, *, trainable: bool) -> Generation:
        ids = answer_ids(encoder, column, board, board_format)
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", trainable=trainable)

    def act(episodes: list[Episode]) -> list[Generation]:
        out = []
        for ep in episodes:
            previous = next((m.column for m in reversed(ep.moves) if m.player == "agent"), None)
            wrong = mistake_column(ep.board, previous)
            if wrong is not None and ep.retries_left > 0 and rng.random() < mistake_rate:
                out.append(answer(ep.board, wrong, trainable=False))
            else:
                out.append(answer(ep.board, teacher.choose(ep.board, rng), trainable=True))
        return out

    return act


def protocol_corpus(games: int = 200, *, seed: int = 0, board_format: str = "rows",
                    board_view: str = "absolute") -> list[str]:
    """Text of whole conversations (random players, some invalid answers) for training a tokenizer, with the
    board written as the runs will write it."""
    rng = random.Random(seed)
    player = RandomOpponent()
    texts: list[str] = []
    for g in range(games):
        side = 1 + g % 2
        parts = [protocol.system_prompt(side, board_format, board_view)]
        board = Board()
        last: int | None = None
        while not board.is_terminal():
            column = player.choose(board, rng)
            if board.to_move == side:
                parts.append(protocol.turn_prompt(board, last, board_format, board_view))
                if rng.random() < 0.05:
                    parts.append(f"I think column {column} is good.")
                    parts.append(protocol.retry_prompt(board, "no [col N] found in your answer.", board_format,
                                                       board_view))
                parts.append(protocol.answer_text(column, board, board_format))
            last = column
            board = board.drop(column)
        texts.append("\n".join(parts))
    return texts


def game_turns(records: Sequence[dict[str, Any]]) -> list[Turn]:
    """The agent turns of teacher games (`Episode.record()`s), each with the column the teacher played there."""
    turns: list[Turn] = []
    for r in records:
        board, last = Board(), None
        for ch in r["board_moves"]:
            column = int(ch) - 1
            if board.to_move == r["agent_side"]:
                turns.append(Turn(r["agent_side"], board, column, last))
            board, last = board.drop(column), column
    return turns


def mixed_play_turns(teacher: Opponent, games: int, *, seed: int = 0, random_share: float = 0.5) -> list[Turn]:
    """Every turn, for both sides, of `games` games in which each move is uniformly random with probability
    `random_share` and the teacher's otherwise; each turn is labelled with the teacher's move.

    Why: a teacher game against random has one immediate win (the last move: the teacher takes it at once), so
    its win positions are few and alike. Where both sides sometimes play at random, wins are left open, threats
    are left unblocked and boards look like the ones a learning agent and a random opponent make -- many more,
    and more varied, positions of the tactics the agent must learn."""
    rng = random.Random(seed)
    player = RandomOpponent()
    turns: list[Turn] = []
    for _ in range(games):
        board, last = Board(), None
        while not board.is_terminal():
            best = teacher.choose(board, rng)
            turns.append(Turn(board.to_move, board, best, last))
            last = player.choose(board, rng) if rng.random() < random_share else best
            board = board.drop(last)
    return turns


def is_tactical(board: Board) -> bool:
    """Whether a column wins now for either side (the turns where taking or blocking a four decides the game)."""
    return any(board.can_win_with(c) or opponent_wins_at(board, c) for c in board.legal_columns())


def one_turn_positions(turns: Sequence[Turn], encoder: ChatEncoder, count: int, *, seed: int = 0,
                       board_format: str = "rows", board_view: str = "absolute", tactical_share: float = 0.7,
                       per_conversation: int = 1, mistake_rate: float = 0.0) -> list[dict[str, Any]]:
    """`count` positions drawn from `turns`, each a user turn (the opponent's move, the board, the legal columns)
    answered with the teacher's column, packed `per_conversation` to a conversation of one side (one system
    prompt), in the trainer's record form (token_ids, action_mask: 1 on the answers).

    A whole game is one optimiser example of ~20 turns and ~1,200 tokens; a position is one turn of ~100 tokens
    after a ~150-token system prompt, so the same minutes give many more positions, and `tactical_share` of them
    are positions where a column wins for either side -- the rare turns the tactics are learned from. Packing
    pays the system prompt once per conversation, and the unrelated boards in a row teach what a game needs
    too: answer the latest board of a growing conversation.

    With `mistake_rate`, that share of the positions with a full column first get a wrong answer naming one
    (`mistake_column`, the previous position's answer where that column is full), then the runner's feedback,
    then the teacher's answer: the retry is the target, the wrong answer only context."""
    pools: dict[int, tuple[list[Turn], list[Turn]]] = {}
    for turn in turns:
        tactical, quiet = pools.setdefault(turn.side, ([], []))
        (tactical if is_tactical(turn.board) else quiet).append(turn)
    sides = sorted(pools)
    rng = random.Random(seed)
    mistakes = random.Random(seed + 1)  # draws of their own: without mistakes the positions stay as they were
    out: list[dict[str, Any]] = []
    system = {side: encoder.message("system", protocol.system_prompt(side, board_format, board_view)) for side in sides}
    left = count if sides else 0
    while left > 0:
        side = rng.choice(sides)
        tactical, quiet = pools[side]
        chunk = [rng.choice(tactical if tactical and (not quiet or rng.random() < tactical_share) else quiet)
                 for _ in range(min(per_conversation, left))]
        ids = list(system[side])
        mask = [0] * len(ids)
        previous: int | None = None
        for k, turn in enumerate(chunk):
            prompt = (encoder.message("user", protocol.turn_prompt(turn.board, turn.last, board_format, board_view))
                      + encoder.generation_prompt())
            wrong = mistake_column(turn.board, previous) if mistake_rate else None
            if wrong is not None and mistakes.random() < mistake_rate:
                prompt += _wrong_answer_and_feedback(encoder, turn.board, wrong, board_format, board_view)
            answer = answer_ids(encoder, turn.column, turn.board, board_format)
            after = encoder.close_answer(answer) if k < len(chunk) - 1 else []  # as the runner closes a turn
            ids += prompt + answer + after
            mask += [0] * len(prompt) + [1] * len(answer) + [0] * len(after)
            previous = turn.column
        left -= per_conversation
        out.append({"token_ids": ids, "action_mask": mask})
    return out


def _wrong_answer_and_feedback(encoder: ChatEncoder, board: Board, column: int, board_format: str,
                               board_view: str) -> list[int]:
    """A wrong answer naming full `column`, closed, then the feedback turn a game gives it (as the runner writes
    them), up to the retry's generation prompt."""
    wrong = answer_ids(encoder, column, board, board_format)
    problem = protocol.parse_answer(protocol.answer_text(column, board, board_format), board).problem or ""
    feedback = encoder.message("user", protocol.retry_prompt(board, problem, board_format, board_view))
    return wrong + encoder.close_answer(wrong) + feedback + encoder.generation_prompt()
