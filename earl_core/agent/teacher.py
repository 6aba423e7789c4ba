"""Scripted players speaking the agent protocol: warm-start teachers and the tokenizer's training text."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import Policy
from earl_core.engines.base import Generation
from earl_core.env.connect_four import Board
from earl_core.env.opponents import Opponent, RandomOpponent, opponent_wins_at


def teacher_policy(teacher: Opponent, encoder: ChatEncoder, *, seed: int = 0, mistake_rate: float = 0.0) -> Policy:
    """A policy that answers every turn with the teacher's move in the canonical format.

    With `mistake_rate`, a turn where some column is full first names the most central full column (the
    mistake a centre-loving imitator makes), marked not trainable; the retry then gets the teacher's move.
    """
    rng = random.Random(seed)

    def answer(column: int, *, trainable: bool) -> Generation:
        ids = encoder.tokenizer.encode(protocol.answer_text(column), add_special_tokens=False) + [encoder.im_end]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", trainable=trainable)

    def act(episodes: list[Episode]) -> list[Generation]:
        out = []
        for ep in episodes:
            full = [c for c in range(7) if c not in ep.board.legal_columns()]
            if full and ep.retries_left > 0 and rng.random() < mistake_rate:
                out.append(answer(min(full, key=lambda c: abs(3 - c)), trainable=False))
            else:
                out.append(answer(teacher.choose(ep.board, rng), trainable=True))
        return out

    return act


def protocol_corpus(games: int = 200, *, seed: int = 0, board_format: str = "rows") -> list[str]:
    """Text of whole conversations (random players, some invalid answers) for training a tokenizer, with the
    board written as the runs will write it."""
    rng = random.Random(seed)
    player = RandomOpponent()
    texts: list[str] = []
    for g in range(games):
        side = 1 + g % 2
        parts = [protocol.system_prompt(side, board_format)]
        board = Board()
        last: int | None = None
        while not board.is_terminal():
            column = player.choose(board, rng)
            if board.to_move == side:
                parts.append(protocol.turn_prompt(board, last, board_format))
                if rng.random() < 0.05:
                    parts.append(f"I think column {column} is good.")
                    parts.append(protocol.retry_prompt(board, "no [col N] found in your answer.", board_format))
                parts.append(protocol.answer_text(column))
            last = column
            board = board.drop(column)
        texts.append("\n".join(parts))
    return texts


def one_turn_positions(records: Sequence[dict[str, Any]], encoder: ChatEncoder, count: int, *, seed: int = 0,
                       board_format: str = "rows", tactical_share: float = 0.7) -> list[dict[str, Any]]:
    """`count` one-turn conversations (system prompt, one position, the teacher's answer) drawn from the agent
    turns of teacher games (`Episode.record()`s), in the trainer's record form (token_ids, action_mask).

    A whole game is one optimiser example of ~20 turns and ~1,200 tokens; a position is one turn of ~150, so the
    same minutes give many more steps, and `tactical_share` of them are positions where a column wins for either
    side -- the rare turns the tactics are learned from. The opponent's last move is not kept with a position:
    its prompt is a first turn's ("Your move." and the board)."""
    tactical: list[tuple[int, Board, int]] = []
    quiet: list[tuple[int, Board, int]] = []
    for r in records:
        board = Board()
        for ch in r["board_moves"]:
            column = int(ch) - 1
            if board.to_move == r["agent_side"]:
                wins = any(board.can_win_with(c) or opponent_wins_at(board, c) for c in board.legal_columns())
                (tactical if wins else quiet).append((r["agent_side"], board, column))
            board = board.drop(column)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(count if tactical or quiet else 0):
        pool = tactical if tactical and (not quiet or rng.random() < tactical_share) else quiet
        side, board, column = rng.choice(pool)
        prompt = (encoder.message("system", protocol.system_prompt(side, board_format))
                  + encoder.message("user", protocol.turn_prompt(board, None, board_format))
                  + encoder.generation_prompt())
        answer = encoder.tokenizer.encode(protocol.answer_text(column), add_special_tokens=False) + [encoder.im_end]
        out.append({"token_ids": prompt + answer, "action_mask": [0] * len(prompt) + [1] * len(answer)})
    return out
