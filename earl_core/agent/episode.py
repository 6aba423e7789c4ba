"""One game between the LLM agent and an opponent, recorded as a conversation plus its moves."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from earl_core.agent.chat import Conversation
from earl_core.env.connect_four import Board
from earl_core.env.opponents import Opponent


@dataclass(frozen=True)
class MoveRecord:
    """A move (or an invalid agent answer, column None) with the board after it."""

    ply: int
    player: str  # agent | opponent
    column: int | None
    board: str
    text: str = ""
    context_tokens: int = 0


@dataclass
class Episode:
    """A game in progress or finished: board, conversation, moves, result."""

    index: int
    group: int
    agent_side: int  # 1 = first player (X), 2 = second (O)
    opponent: Opponent
    rng: random.Random
    board: Board = field(default_factory=Board)
    conversation: Conversation = field(default_factory=Conversation)
    moves: list[MoveRecord] = field(default_factory=list)
    turn_context: list[int] = field(default_factory=list)  # prompt length at each agent turn
    invalid_kinds: list[str] = field(default_factory=list)  # protocol.INVALID_KINDS, one per invalid answer
    retries_left: int = 1
    result: str | None = None  # win | loss | draw once finished
    end_reason: str = ""
    reward: float = 0.0

    @property
    def invalid(self) -> int:
        """Invalid answers so far, retried ones included."""
        return len(self.invalid_kinds)

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def agent_to_move(self) -> bool:
        return not self.done and self.board.to_move == self.agent_side

    def finish(self, result: str, reason: str, *, format_penalty: float) -> None:
        self.result = result
        self.end_reason = reason
        self.reward = {"win": 1.0, "loss": -1.0, "draw": 0.0}[result] - format_penalty * self.invalid

    def settle_if_over(self, *, format_penalty: float) -> bool:
        """Finish the episode if the board is terminal; True when it is over."""
        winner = self.board.winner()
        if winner:
            self.finish("win" if winner == self.agent_side else "loss", "four in a row", format_penalty=format_penalty)
        elif self.board.is_draw():
            self.finish("draw", "board full", format_penalty=format_penalty)
        return self.done

    def record(self) -> dict[str, Any]:
        """Plain data of a finished episode: what crosses process boundaries and feeds training."""
        conv = self.conversation
        return {
            "index": self.index,
            "group": self.group,
            "agent_side": self.agent_side,
            "opponent": self.opponent.name,
            "tokens": len(conv.token_ids),
            "token_ids": list(conv.token_ids),
            "action_mask": list(conv.action_mask),
            "logprobs": list(conv.logprobs),
            "turn_context": list(self.turn_context),
            "moves": [m.__dict__ for m in self.moves],
            "board_moves": self.board.moves,
            "invalid": self.invalid,
            "result": self.result,
            "end_reason": self.end_reason,
            "reward": self.reward,
        }
