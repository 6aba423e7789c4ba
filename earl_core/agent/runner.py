"""Plays many Connect Four episodes at once: every agent turn of every live game goes to the policy as one batch."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode, MoveRecord
from earl_core.engines.base import Generation, RolloutEngine, SamplingSpec
from earl_core.env.opponents import Opponent

# The policy sees the live episodes that wait for an agent answer and returns one generation each.
Policy = Callable[[list[Episode]], list[Generation]]


def engine_policy(engine: RolloutEngine, spec: SamplingSpec) -> Policy:
    """A policy that asks a rollout engine to continue every waiting conversation, as one batch.

    A seeded sampling spec gets a seed of its own for each call, derived from the spec's: prompt i of a call
    samples with seed + i, so with one seed for all calls every turn of a game would reuse its first turn's draws."""
    calls = itertools.count()

    def policy(episodes: list[Episode]) -> list[Generation]:
        call_spec = spec
        if spec.seed is not None and not spec.greedy:
            call_spec = replace(spec, seed=random.Random(f"{spec.seed}/{next(calls)}").getrandbits(31))
        return engine.generate([ep.conversation.token_ids for ep in episodes], call_spec)

    return policy


@dataclass(frozen=True)
class GameSpec:
    """How one episode starts: the agent's side, the opponent and the seed of its randomness."""

    index: int
    group: int
    agent_side: int
    opponent: Opponent
    seed: int


@dataclass(frozen=True)
class RunnerLimits:
    """Protocol limits and settings shared by all episodes of a batch."""

    max_invalid: int = 1
    format_penalty: float = 0.0
    max_context: int = 4096
    max_new_tokens: int = 16
    board_format: str = "rows"  # one of config.BOARD_FORMATS
    board_view: str = "absolute"  # one of config.BOARD_VIEWS


def start_episode(spec: GameSpec, encoder: ChatEncoder, limits: RunnerLimits) -> Episode:
    ep = Episode(
        index=spec.index,
        group=spec.group,
        agent_side=spec.agent_side,
        opponent=spec.opponent,
        rng=random.Random(spec.seed),
        retries_left=limits.max_invalid,
    )
    rules = protocol.system_prompt(spec.agent_side, limits.board_format, limits.board_view)
    ep.conversation.extend_context(encoder.message("system", rules))
    opponent_column = _opponent_moves(ep) if spec.agent_side == 2 else None
    _open_turn(ep, encoder, protocol.turn_prompt(ep.board, opponent_column, limits.board_format, limits.board_view))
    return ep


def play_episodes(
    specs: Sequence[GameSpec],
    policy: Policy,
    encoder: ChatEncoder,
    *,
    limits: RunnerLimits,
) -> list[Episode]:
    """Play every spec to the end; returns the finished episodes in spec order."""
    episodes = [start_episode(s, encoder, limits) for s in specs]
    while True:
        waiting = [ep for ep in episodes if ep.agent_to_move]
        if not waiting:
            return episodes
        for ep, gen in zip(waiting, policy(waiting), strict=True):
            _apply_answer(ep, gen, encoder, limits)


def _open_turn(ep: Episode, encoder: ChatEncoder, user_text: str) -> None:
    ep.conversation.extend_context(encoder.message("user", user_text))
    ep.conversation.extend_context(encoder.generation_prompt())
    ep.turn_context.append(len(ep.conversation))


def _opponent_moves(ep: Episode) -> int:
    column = ep.opponent.choose(ep.board, ep.rng)
    ep.board = ep.board.drop(column)
    ep.moves.append(MoveRecord(len(ep.moves), "opponent", column, ep.board.to_text()))
    return column


def _apply_answer(ep: Episode, gen: Generation, encoder: ChatEncoder, limits: RunnerLimits) -> None:
    conv = ep.conversation
    conv.extend_action(list(gen.token_ids), list(gen.logprobs), trainable=gen.trainable)
    conv.extend_context(encoder.close_answer(list(gen.token_ids)))
    text = encoder.decode_answer(list(gen.token_ids))
    answer = protocol.parse_answer(text, ep.board)
    if not answer.ok:
        ep.invalid_kinds.append(answer.kind or protocol.UNREADABLE)
        ep.moves.append(MoveRecord(len(ep.moves), "agent", None, ep.board.to_text(), text, len(conv)))
        if ep.retries_left <= 0:
            ep.finish("loss", f"invalid answer: {answer.problem}", format_penalty=limits.format_penalty)
            return
        ep.retries_left -= 1
        next_prompt = protocol.retry_prompt(ep.board, answer.problem or "", limits.board_format, limits.board_view)
    else:
        assert answer.column is not None
        ep.board = ep.board.drop(answer.column)
        ep.moves.append(MoveRecord(len(ep.moves), "agent", answer.column, ep.board.to_text(), text, len(conv)))
        if ep.settle_if_over(format_penalty=limits.format_penalty):
            return
        opponent_column = _opponent_moves(ep)
        if ep.settle_if_over(format_penalty=limits.format_penalty):
            return
        ep.retries_left = limits.max_invalid  # the retry allowance is per turn
        next_prompt = protocol.turn_prompt(ep.board, opponent_column, limits.board_format, limits.board_view)
    _open_turn(ep, encoder, next_prompt)
    # The next answer must fit: a game whose conversation outgrows the context ends as a loss.
    if len(conv) + limits.max_new_tokens > limits.max_context:
        ep.turn_context.pop()  # this turn is never answered: it is not an agent turn
        ep.finish("loss", "context limit reached", format_penalty=limits.format_penalty)
