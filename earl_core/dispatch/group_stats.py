"""Advantages where the data lives: per-group scalars (count, sum, sum of squares) merged across workers.

Each worker that holds rewards summarises them per GRPO group; the driver only merges these scalars and hands the
merged table to the ranks that train, which compute their own samples' advantages. Sums are exact (rationals), so
the merge gives the same bits in any order and on any split: the centralised baseline, which computes the table from
all rewards at once, produces identical advantages.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch


@dataclass(frozen=True)
class GroupStats:
    """Count, sum and sum of squares of one group's rewards (exact)."""

    count: int = 0
    total: Fraction = Fraction(0)
    squares: Fraction = Fraction(0)

    def __add__(self, other: GroupStats) -> GroupStats:
        return GroupStats(self.count + other.count, self.total + other.total, self.squares + other.squares)

    @property
    def mean(self) -> Fraction:
        return self.total / self.count

    @property
    def std(self) -> float:
        """Population standard deviation (ddof = 0)."""
        var = self.squares / self.count - self.mean**2
        return math.sqrt(float(var)) if var > 0 else 0.0

    def to_wire(self) -> tuple[int, int, int, int, int]:
        """Plain integers for messages (count, sum numerator/denominator, squares numerator/denominator)."""
        return (self.count, self.total.numerator, self.total.denominator, self.squares.numerator,
                self.squares.denominator)

    @classmethod
    def from_wire(cls, wire: Sequence[int]) -> GroupStats:
        count, tn, td, sn, sd = wire
        return cls(int(count), Fraction(tn, td), Fraction(sn, sd))


GroupTable = dict[int, GroupStats]


def summarise(rewards: Sequence[float], groups: Sequence[int]) -> GroupTable:
    """Per-group stats of the rewards a worker holds."""
    if len(rewards) != len(groups):
        raise ValueError(f"rewards ({len(rewards)}) and groups ({len(groups)}) differ in length")
    table: GroupTable = {}
    for r, g in zip(rewards, groups):
        x = Fraction(float(r))
        table[int(g)] = table.get(int(g), GroupStats()) + GroupStats(1, x, x * x)
    return table


def merge(tables: Iterable[Mapping[int, GroupStats]]) -> GroupTable:
    """One table from every worker's: the scalars add up (exactly, in any order)."""
    out: GroupTable = {}
    for table in tables:
        for g, stats in table.items():
            out[g] = out.get(g, GroupStats()) + stats
    return out


def table_to_wire(table: Mapping[int, GroupStats]) -> dict[int, tuple[int, int, int, int, int]]:
    return {g: s.to_wire() for g, s in table.items()}


def table_from_wire(wire: Mapping[int, Sequence[int]]) -> GroupTable:
    return {int(g): GroupStats.from_wire(w) for g, w in wire.items()}


def grpo_from_table(rewards: Sequence[float], groups: Sequence[int], table: Mapping[int, GroupStats], *,
                    normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages of some samples given the merged table of their groups: (r - group mean) / (group std + eps).
    A group whose rewards are all equal carries no signal and gets 0 (as in earl_core.rl.advantages)."""
    out = []
    for r, g in zip(rewards, groups):
        stats = table.get(int(g))
        if stats is None:
            raise KeyError(f"group {g} is missing from the merged group table")
        std = stats.std
        if std == 0:
            out.append(0.0)
            continue
        centred = float(Fraction(float(r)) - stats.mean)
        out.append(centred / (std + eps) if normalize_std else centred)
    return torch.tensor(out, dtype=torch.float32)


def batch_mean(table: Mapping[int, GroupStats]) -> float:
    """Mean reward over every group (the REINFORCE baseline's batch mean), from the same scalars."""
    whole = sum(table.values(), GroupStats())
    return float(whole.mean) if whole.count else 0.0


def baseline_advantages(rewards: Sequence[float], baseline: float) -> torch.Tensor:
    """REINFORCE advantages of some samples: reward minus the batch's baseline (one scalar for every rank)."""
    return torch.tensor([float(r) for r in rewards], dtype=torch.float32) - baseline
