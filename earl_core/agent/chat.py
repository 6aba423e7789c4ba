"""Token-level ChatML conversation: built by appending ids, so each turn's prompt extends the last one exactly.

Re-tokenising the whole text every turn could change earlier tokens and would defeat the rollout engine's
prefix cache; appending ids keeps the trained sequence identical to what the engine saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class TokenizerLike(Protocol):
    """What we need of a Hugging Face tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...
    def convert_tokens_to_ids(self, token: str) -> int: ...


class ChatEncoder:
    """Encodes ChatML messages into token ids with the tokenizer's special tokens."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self.tokenizer = tokenizer
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._newline = tokenizer.encode("\n", add_special_tokens=False)
        self._headers: dict[str, list[int]] = {}
        self._assistant_header = self._header("assistant")

    def _header(self, role: str) -> list[int]:
        # Cached: a warm start encodes some 100,000 messages of three roles.
        if role not in self._headers:
            self._headers[role] = [self.im_start, *self.tokenizer.encode(f"{role}\n", add_special_tokens=False)]
        return self._headers[role]

    def message(self, role: str, text: str) -> list[int]:
        """`<|im_start|>role\\ntext<|im_end|>\\n` as ids."""
        body = self.tokenizer.encode(text, add_special_tokens=False)
        return [*self._header(role), *body, self.im_end, *self._newline]

    def generation_prompt(self) -> list[int]:
        """`<|im_start|>assistant\\n`: what the agent's answer follows."""
        return list(self._assistant_header)

    def close_answer(self, generated: list[int]) -> list[int]:
        """Ids to append after a generated answer so the conversation stays well formed."""
        tail = [] if generated and generated[-1] == self.im_end else [self.im_end]
        return [*tail, *self._newline]

    def decode_answer(self, generated: list[int]) -> str:
        ids = generated[:-1] if generated and generated[-1] == self.im_end else generated
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class Conversation:
    """A growing token sequence with a mask of the tokens the agent produced (the ones we train on)."""

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def extend_context(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)
        self.action_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def extend_action(self, ids: list[int], logprobs: list[float], *, trainable: bool = True) -> None:
        assert len(ids) == len(logprobs), "one logprob per generated token"
        self.token_ids.extend(ids)
        self.action_mask.extend([1 if trainable else 0] * len(ids))
        self.logprobs.extend(logprobs)

    def __len__(self) -> int:
        return len(self.token_ids)


def answer_spans(action_mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of agent-written tokens in a conversation."""
    spans, start = [], None
    for i, m in enumerate([*action_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans
