"""Evaluation of a checkpoint against a fixed opponent: win/draw/loss as first and second player, 95% intervals."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, Policy, RunnerLimits, engine_policy, play_episodes
from earl_core.checkpoints import STATE_FILE
from earl_core.config import CHECK_FORMATS, CHECKS_NEW_TOKENS, GameConfig, RolloutConfig, RunConfig
from earl_core.engines.base import SamplingSpec, make_engine
from earl_core.env.opponents import make_opponent


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sane at 0% and 100%, unlike the normal approximation)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class SideResult:
    """Outcome counts of the games played from one side."""

    side: str
    games: int
    wins: int
    draws: int
    losses: int
    invalid_answers: int
    # Why games were lost ("four in a row", "invalid answer (full column)", "context limit reached", ...) and
    # every invalid answer by kind (protocol.INVALID_KINDS), retried ones included: a model that misreads the
    # board and one that forgot the format lose the same game for different reasons.
    loss_causes: dict[str, int] = field(default_factory=dict)
    invalid_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def win_rate(self) -> float:
        return self.wins / self.games if self.games else 0.0

    def as_dict(self) -> dict[str, Any]:
        lo, hi = wilson_interval(self.wins, self.games)
        return {**asdict(self), "win_rate": self.win_rate, "win_rate_ci95": [lo, hi]}


def evaluate_policy(policy: Policy, encoder: ChatEncoder, *, opponent: str, games: int, seed: int = 0,
                    limits: RunnerLimits | None = None) -> dict[str, SideResult]:
    """Play `games` games as first player and `games` as second; each opponent game has its own seed."""
    limits = limits or RunnerLimits()
    rng = random.Random(seed)
    out: dict[str, SideResult] = {}
    for side, label in ((1, "first"), (2, "second")):
        specs = [GameSpec(index=i, group=i, agent_side=side, opponent=make_opponent(opponent), seed=rng.getrandbits(31))
                 for i in range(games)]
        eps = play_episodes(specs, policy, encoder, limits=limits)
        out[label] = side_result(label, eps)
    return out


def side_result(side: str, episodes: list[Episode]) -> SideResult:
    """Counts of finished episodes played from one side."""
    results = [e.result for e in episodes]
    causes = Counter(loss_cause(e) for e in episodes if e.result == "loss")
    kinds = Counter(kind for e in episodes for kind in e.invalid_kinds)
    return SideResult(side, len(episodes), results.count("win"), results.count("draw"), results.count("loss"),
                      sum(e.invalid for e in episodes), dict(causes.most_common()), dict(kinds.most_common()))


def loss_cause(ep: Episode) -> str:
    """Why a lost game ended, without the per-game details (which column was full)."""
    if ep.end_reason.startswith("invalid answer") and ep.invalid_kinds:
        return f"invalid answer ({ep.invalid_kinds[-1]})"
    return ep.end_reason


def evaluate_checkpoint(model_dir: str, *, opponent: str, games: int, engine: str = "vllm", seed: int = 0,
                        limits: RunnerLimits | None = None, temperature: float = 0.0,
                        engine_opts: dict[str, Any] | None = None) -> dict[str, SideResult]:
    """Play of a saved model (local folder or hub id) through a rollout engine, under the run's limits: greedy by
    default, or sampled at `temperature` (the policy RL trains; against a nearly deterministic opponent greedy
    play repeats a handful of games, so its win rate jumps between 0 and 1)."""
    limits = limits or RunnerLimits()
    # Checked before the engine starts: a bad value is a clear error, not a minute's wait for one.
    spec = SamplingSpec(max_new_tokens=limits.max_new_tokens, temperature=temperature, seed=seed)
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(model_dir))
    eng = make_engine(engine, model_dir, **(engine_opts or {}))
    try:
        spec = replace(spec, stop_token_ids=(encoder.im_end,))
        return evaluate_policy(engine_policy(eng, spec), encoder, opponent=opponent, games=games, seed=seed,
                               limits=limits)
    finally:
        eng.close()


def run_limits(cfg: RunConfig) -> RunnerLimits:
    """The protocol limits a run was trained under (evaluation should play by the same rules)."""
    return _limits(cfg.game, cfg.rollout)


def _limits(game: GameConfig, rollout: RolloutConfig) -> RunnerLimits:
    return RunnerLimits(max_invalid=game.max_invalid, format_penalty=game.format_penalty,
                        max_context=rollout.max_context, max_new_tokens=rollout.max_new_tokens,
                        board_format=game.board_format, board_view=game.board_view)


def checkpoint_limits(model_dir: str, *, board_format: str | None = None,
                      board_view: str | None = None) -> RunnerLimits:
    """The protocol a checkpoint was trained under, from the run config its earl_state.json records (a model
    from elsewhere -- a hub id, a folder without that file -- gets the defaults); `board_format` and `board_view`
    override them (a check format also raises max_new_tokens to the CHECKS_NEW_TOKENS its answers need).

    Only the game and rollout sections are read, each field falling back to its default: a checkpoint of an
    older version of this library (fewer or other fields elsewhere in its config) still evaluates."""
    saved: dict[str, Any] = {}
    state = Path(model_dir) / STATE_FILE
    if state.is_file():
        saved = json.loads(state.read_text()).get("config") or {}

    def section(cls: type, name: str) -> Any:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (saved.get(name) or {}).items() if k in known})

    limits = _limits(section(GameConfig, "game"), section(RolloutConfig, "rollout"))
    if board_format is not None:
        limits = replace(limits, board_format=GameConfig(board_format=board_format).board_format)
    if board_view is not None:
        limits = replace(limits, board_view=GameConfig(board_view=board_view).board_view)
    if limits.board_format in CHECK_FORMATS:
        # An override (or a model from elsewhere) keeps the default token budget, too short for a checked answer.
        limits = replace(limits, max_new_tokens=max(limits.max_new_tokens, CHECKS_NEW_TOKENS))
    return limits
