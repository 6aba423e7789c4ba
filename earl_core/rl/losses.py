"""Token-level policy-gradient losses: PPO-clipped surrogate and KL to the reference policy, on agent tokens only."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    """Sums over the masked tokens of a micro-batch (divided by the global token count by the caller)."""

    policy: torch.Tensor
    kl: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO surrogate summed over masked tokens. Shapes: (B, T) log-probs and mask, (B,) advantages.

    Returns (loss_sum, clipped_token_count, ratio_sum).
    """
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    adv = advantages[:, None]  # (B, 1): one advantage per episode, shared by its tokens
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    m = mask.to(per_token.dtype)
    was_clipped = ((clipped < unclipped).to(m.dtype) * m).sum()
    return (per_token * m).sum(), was_clipped.detach(), (ratio.detach() * m).sum()


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || ref), exp(ref - pi) - (ref - pi) - 1 >= 0, summed over masked tokens."""
    delta = ref_logprobs - logprobs
    per_token = torch.exp(delta) - delta - 1.0
    return (per_token * mask.to(per_token.dtype)).sum()


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: logits (B, T, V), ids (B, T) -> (B, T-1) for positions 1..T-1."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    return torch.gather(logp, 2, input_ids[:, 1:, None]).squeeze(2)
