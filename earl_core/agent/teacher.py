"""Scripted players speaking the agent protocol: warm-start teachers and the tokenizer's training text."""

from __future__ import annotations

import random

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import Policy
from earl_core.engines.base import Generation
from earl_core.env.connect_four import Board
from earl_core.env.opponents import Opponent, RandomOpponent


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


def protocol_corpus(games: int = 200, *, seed: int = 0) -> list[str]:
    """Text of whole conversations (random players, some invalid answers) for training a tokenizer."""
    rng = random.Random(seed)
    player = RandomOpponent()
    texts: list[str] = []
    for g in range(games):
        side = 1 + g % 2
        parts = [protocol.system_prompt(side)]
        board = Board()
        last: int | None = None
        while not board.is_terminal():
            column = player.choose(board, rng)
            if board.to_move == side:
                parts.append(protocol.turn_prompt(board, last))
                if rng.random() < 0.05:
                    parts.append(f"I think column {column} is good.")
                    parts.append(protocol.retry_prompt(board, "no [col N] found in your answer."))
                parts.append(protocol.answer_text(column))
            last = column
            board = board.drop(column)
        texts.append("\n".join(parts))
    return texts
