"""A person plays the agent in the terminal."""

from __future__ import annotations

from transformers import AutoTokenizer

from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, RunnerLimits, engine_policy, play_episodes
from earl_core.engines.base import Generation, SamplingSpec, make_engine
from earl_core.env.connect_four import Board


class HumanOpponent:
    """Reads the person's column (0-6) from standard input."""

    name = "human"

    def choose(self, board: Board, rng: object) -> int:
        while True:
            print(board.to_text())  # a person reads the rows, whatever the agent is shown
            raw = input(f"your move {board.legal_columns()}: ").strip()
            if raw.isdigit() and int(raw) in board.legal_columns():
                return int(raw)
            print(f"not a legal column: {raw!r}")


def play_in_terminal(checkpoint: str, *, human_side: int, engine: str, seed: int,
                     limits: RunnerLimits | None = None) -> int:
    """One game against the checkpoint, under the protocol limits it was trained with (see checkpoint_limits)."""
    limits = limits or RunnerLimits()
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(checkpoint))
    eng = make_engine(engine, checkpoint)
    spec = SamplingSpec(max_new_tokens=limits.max_new_tokens, temperature=0.0, stop_token_ids=(encoder.im_end,),
                        seed=seed)

    generate = engine_policy(eng, spec)

    def policy(episodes: list[Episode]) -> list[Generation]:
        gens = generate(episodes)
        for g in gens:
            print("agent:", encoder.decode_answer(list(g.token_ids)))
        return gens

    try:
        game = GameSpec(index=0, group=0, agent_side=3 - human_side, opponent=HumanOpponent(), seed=seed)
        (ep,) = play_episodes([game], policy, encoder, limits=limits)
    finally:
        eng.close()
    print(ep.board.to_text())
    verdict = {"win": "the agent wins", "loss": "you win", "draw": "draw"}[ep.result or "draw"]
    print(f"{verdict} ({ep.end_reason})")
    return 0
