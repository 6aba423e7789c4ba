"""The rollout-engine contract: sampling spec, generation result, the engine protocol and its factory."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from earl_core.errors import ConfigError

ENGINE_KINDS = ("vllm", "hf")


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample one batch of continuations.

    Generation stops at ``max_new_tokens``, at the model's eos token, or at any of ``stop_token_ids``.
    """

    max_new_tokens: int
    """Upper bound on generated tokens per prompt (>= 1)."""
    temperature: float = 1.0
    """Softmax temperature: 0 means greedy, else 0.01..2 (vLLM's accepted range)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end a generation (kept in the output)."""
    seed: int | None = None
    """Makes sampling reproducible; prompt i of a batch uses seed + i so equal prompts still differ."""

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ConfigError("sampling.max_new_tokens", f"{self.max_new_tokens!r} is not an int >= 1", allowed=">= 1")
        if not _is_number(self.temperature) or not (self.temperature == 0.0 or 0.01 <= self.temperature <= 2.0):
            raise ConfigError("sampling.temperature", f"{self.temperature!r} is out of range", allowed="0 or 0.01..2")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError("sampling.top_p", f"{self.top_p!r} is out of range", allowed="(0, 1]")
        if not isinstance(self.stop_token_ids, tuple) or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ConfigError("sampling.stop_token_ids", "must be a tuple of non-negative ints")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ConfigError("sampling.seed", f"{self.seed!r} is not a non-negative int", allowed=">= 0 or None")

    @property
    def greedy(self) -> bool:
        """True when sampling degenerates to argmax."""
        return self.temperature == 0.0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Generation:
    """One continuation: token ids (stop token included), their raw logprobs and why it ended."""

    token_ids: list[int]
    """Generated ids; ends with the stop token when finish_reason is "stop"."""
    logprobs: list[float]
    """log p(token) under the model's raw distribution (before temperature / top-p), one per id."""
    finish_reason: str
    """"stop" (eos or a stop token) or "length" (max_new_tokens or the context limit)."""
    trainable: bool = True
    """Whether these tokens are learning targets; False only for a teacher's deliberate wrong answer."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates continuations of token-id prompts and takes new weights in memory."""

    name: str

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """One Generation per prompt, in order."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the policy weights (HF parameter names) without touching disk."""
        ...

    def close(self) -> None:
        """Free the engine's memory; another engine may start in this process afterwards."""
        ...


def validate_prompts(prompts: Sequence[Sequence[int]], *, vocab_size: int, max_len: int) -> None:
    """Reject empty prompts, out-of-vocabulary ids and prompts with no room left to generate."""
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ConfigError(f"prompts[{index}]", "is empty")
        if len(prompt) >= max_len:
            raise ConfigError(
                f"prompts[{index}]", f"has {len(prompt)} tokens, no room to generate", allowed=f"< {max_len}"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ConfigError(
                f"prompts[{index}]", "holds a token id outside the vocabulary", allowed=f"0..{vocab_size - 1}"
            )


def make_engine(kind: str, model_dir: str, **opts: Any) -> RolloutEngine:
    """Build the engine called ``kind`` ("vllm" or "hf") on the model in ``model_dir``."""
    # Imported here so that the HF path never pays vLLM's multi-second import.
    if kind == "vllm":
        from earl_core.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model_dir, **opts)
    if kind == "hf":
        from earl_core.engines.hf import HFEngine

        return HFEngine(model_dir, **opts)
    raise ConfigError("rollout.engine", f"unknown engine {kind!r}", allowed=ENGINE_KINDS)
