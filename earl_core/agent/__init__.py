"""The LLM agent's side of a Connect Four game: protocol text, token-level chat and the episode runner."""

from __future__ import annotations

from earl_core.agent.chat import ChatEncoder, Conversation
from earl_core.agent.episode import Episode, MoveRecord
from earl_core.agent.protocol import ParsedAnswer, answer_text, parse_answer, retry_prompt, system_prompt, turn_prompt
from earl_core.agent.runner import GameSpec, Policy, RunnerLimits, play_episodes

__all__ = [
    "ChatEncoder", "Conversation", "Episode", "GameSpec", "MoveRecord", "ParsedAnswer", "Policy", "RunnerLimits",
    "answer_text", "parse_answer", "play_episodes", "retry_prompt", "system_prompt", "turn_prompt",
]
