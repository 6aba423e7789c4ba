"""Episode-level advantages for multi-turn games: GRPO (group-relative) and REINFORCE with a running baseline.

A game yields one reward at its end; every agent token of the game shares the episode's advantage, weighted (where
configured) by how near the end of the game its answer is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from earl_core.dispatch.group_stats import baseline_advantages, batch_mean, grpo_from_table, summarise


def grpo_advantages(
    rewards: Sequence[float],
    groups: Sequence[int],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + eps); std is the population std (ddof=0).

    A group whose games all got the same reward carries no signal and gets advantage 0. Computed from the batch's
    per-group scalars (earl_core.dispatch.group_stats): the same code the trainer ranks run on their own share.
    """
    return grpo_from_table(rewards, groups, summarise(rewards, groups), normalize_std=normalize_std, eps=eps)


class RunningBaseline:
    """Exponential moving average of the batch mean reward (REINFORCE baseline)."""

    def __init__(self, decay: float = 0.9, value: float | None = None) -> None:
        self.decay = decay
        self.value = value

    def take(self, batch_mean: float) -> float:
        """The baseline for a batch whose mean reward is ``batch_mean`` (the value before it; the batch mean
        itself for the first batch), then fold the batch mean into the average."""
        base = batch_mean if self.value is None else self.value
        self.value = batch_mean if self.value is None else self.decay * self.value + (1 - self.decay) * batch_mean
        return base

    def advantages(self, rewards: Sequence[float]) -> torch.Tensor:
        """r - baseline (baseline taken before this batch), then fold this batch's mean into it."""
        return baseline_advantages(rewards, self.take(batch_mean(summarise(rewards, [0] * len(rewards)))))


def answer_weights(action_mask: torch.Tensor, discount: float) -> torch.Tensor:
    """Per-token credit of each answer in its game's outcome: the k-th answer from the end weighs discount**k.

    `action_mask` is (B, T) with 1 on agent tokens; an answer is a run of consecutive agent tokens (a retry after an
    invalid answer is an answer of its own). Why: against a weak opponent a game is mostly decided by its last
    answers (a four not blocked, a win not taken), yet every answer shares the episode's advantage equally; a
    discount puts the blame and the credit where the outcome was decided. discount=1 returns the mask itself.
    """
    mask = action_mask.to(torch.float32)
    if discount == 1.0:
        return mask
    on = mask > 0
    before = torch.zeros_like(on)
    before[:, 1:] = on[:, :-1]
    starts = (on & ~before).to(torch.float32)  # first token of every answer
    after = starts.sum(dim=1, keepdim=True) - starts.cumsum(dim=1)  # answers starting after this token
    return mask * torch.pow(torch.tensor(discount, dtype=torch.float32), after)
