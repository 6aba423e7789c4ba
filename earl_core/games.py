"""Which games an iteration plays (sides, opponents, seeds in GRPO groups) and what they add up to."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Any

from earl_core.config import RunConfig, opponent_list


def iteration_specs(cfg: RunConfig, iteration: int) -> list[dict[str, Any]]:
    """Game specs of one iteration. Games of a group share the agent's side, the opponent and its seed,
    so GRPO compares answers to the same situations; groups cycle through sides and opponents."""
    specs = []
    opponents = opponent_list(cfg.game.opponent, "game.opponent")
    both_sides = cfg.game.agent_side == "both"
    for g in range(cfg.rollout.groups):
        side = {"first": 1, "second": 2}.get(cfg.game.agent_side, 1 + g % 2)
        # Sides alternate fastest, then opponents, so every (side, opponent) pair gets groups.
        opponent = opponents[(g // 2 if both_sides else g) % len(opponents)]
        group_seed = hash((cfg.seed, iteration, g)) & 0x7FFFFFFF
        for k in range(cfg.rollout.group_size):
            specs.append({
                "index": g * cfg.rollout.group_size + k,
                "group": g,
                "agent_side": side,
                "opponent": opponent,
                "seed": group_seed,
            })
    return specs


def rollout_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Win/draw/loss rates, reward, protocol errors and context lengths (mean and max per agent turn)."""
    n = max(len(records), 1)
    results = [r["result"] for r in records]
    agent_turns = sum(len(r["turn_context"]) for r in records)
    out = {
        "rollout/win_rate": results.count("win") / n,
        "rollout/draw_rate": results.count("draw") / n,
        "rollout/loss_rate": results.count("loss") / n,
        "rollout/reward_mean": sum(r["reward"] for r in records) / n,
        "rollout/invalid_rate": sum(r["invalid"] for r in records) / max(agent_turns, 1),
        "rollout/game_length": sum(len(r["board_moves"]) for r in records) / n,
        "rollout/agent_turns": agent_turns / n,
    }
    for side, label in ((1, "first"), (2, "second")):
        mine = [r for r in records if r["agent_side"] == side]
        if mine:
            out[f"rollout/win_rate_{label}"] = sum(r["result"] == "win" for r in mine) / len(mine)
    for opponent in sorted({r["opponent"] for r in records}):
        mine = [r for r in records if r["opponent"] == opponent]
        key = re.sub(r"[^a-z0-9_]", "", opponent.replace(":", "_"))
        out[f"rollout/win_rate_vs_{key}"] = sum(r["result"] == "win" for r in mine) / len(mine)
    contexts = [c for r in records for c in r["turn_context"]]
    if contexts:
        out["context/mean"] = statistics.fmean(contexts)
        out["context/max"] = float(max(contexts))
        out["context/final_mean"] = statistics.fmean(r["tokens"] for r in records)
    by_turn: dict[int, list[int]] = {}
    for r in records:
        for turn, c in enumerate(r["turn_context"], start=1):
            by_turn.setdefault(turn, []).append(c)
    for turn, values in sorted(by_turn.items()):
        out[f"context/turn{turn:02d}_mean"] = statistics.fmean(values)
        out[f"context/turn{turn:02d}_max"] = float(max(values))
    return out
