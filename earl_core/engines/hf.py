"""Reference rollout engine on plain transformers: a batched, left-padded KV-cache decode loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import DynamicCache

from earl_core.engines.base import Generation, SamplingSpec, validate_prompts
from earl_core.errors import EngineError
from earl_core.models.factory import load_policy


class HFEngine:
    """Generates with the same transformers model a trainer would use; slow but obviously correct."""

    name = "hf"

    def __init__(self, model_dir: str, *, dtype: torch.dtype = torch.float32) -> None:
        self.model, self.tokenizer = load_policy(str(model_dir), dtype=dtype)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = _eos_ids(self.model, self.tokenizer.eos_token_id)
        self.max_len = int(self.model.config.max_position_embeddings)

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """Sample continuations for all prompts in one padded batch."""
        if self.model is None:
            raise EngineError("HFEngine is closed")
        if not prompts:
            return []
        validate_prompts(prompts, vocab_size=self.model.config.vocab_size, max_len=self.max_len)
        generator = torch.Generator()
        if spec.seed is None:
            generator.seed()  # fresh entropy for this generator only; the global RNG is left alone
        else:
            generator.manual_seed(spec.seed)
        stop_ids = torch.tensor(sorted(self.eos_ids | set(spec.stop_token_ids)))
        longest = max(len(p) for p in prompts)
        budget = min(spec.max_new_tokens, self.max_len - longest)
        # Left padding keeps every row's next token in the last column.
        input_ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            input_ids[row, longest - len(prompt) :] = torch.tensor(list(prompt))
            mask[row, longest - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # pad slots get position 0; they are masked anyway
        cache = DynamicCache()
        out_tokens: list[torch.Tensor] = []
        out_logprobs: list[torch.Tensor] = []
        done = torch.zeros(len(prompts), dtype=torch.bool)
        with torch.inference_mode():
            step_ids = input_ids
            for _ in range(budget):
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = out.past_key_values
                raw = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)  # (B, V)
                token = _sample(raw, spec, generator)  # (B,)
                token = torch.where(done, torch.full_like(token, self.pad_id), token)
                out_tokens.append(token)
                out_logprobs.append(raw.gather(-1, token[:, None]).squeeze(-1))
                done |= torch.isin(token, stop_ids)
                if bool(done.all()):
                    break
                step_ids = token[:, None]
                positions = positions[:, -1:] + 1
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        tokens = torch.stack(out_tokens, dim=1).tolist()  # (B, N)
        logprobs = torch.stack(out_logprobs, dim=1).tolist()
        stop_set = set(stop_ids.tolist())
        return [_trim(row_tokens, row_logprobs, stop_set) for row_tokens, row_logprobs in zip(tokens, logprobs)]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the model; every parameter must be given (a tied head may be omitted)."""
        if self.model is None:
            raise EngineError("HFEngine is closed")
        try:
            missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
        except RuntimeError as exc:
            raise EngineError(f"weights do not fit the model: {exc}") from exc
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            raise EngineError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")

    def close(self) -> None:
        """Drop the model; the engine is unusable afterwards."""
        self.model = None


def _eos_ids(model: torch.nn.Module, tokenizer_eos: int | None) -> set[int]:
    """Tokenizer eos plus generation_config eos (an int or a list), as vLLM stops on both."""
    ids = {tokenizer_eos} if tokenizer_eos is not None else set()
    config_eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(config_eos)
    return ids


def _sample(logprobs: torch.Tensor, spec: SamplingSpec, generator: torch.Generator) -> torch.Tensor:
    """Greedy or temperature + top-p sampling from raw logprobs (B, V) -> (B,)."""
    if spec.greedy:
        return logprobs.argmax(dim=-1)
    probs = torch.softmax(logprobs / spec.temperature, dim=-1)
    if spec.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= spec.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _trim(tokens: list[int], logprobs: list[float], stop_ids: set[int]) -> Generation:
    """Cut a padded row right after its first stop token."""
    for index, token in enumerate(tokens):
        if token in stop_ids:
            return Generation(tokens[: index + 1], logprobs[: index + 1], "stop")
    return Generation(tokens, logprobs, "length")
