"""Rollout engine on vLLM: token-id prompts, prefix caching, raw logprobs, in-memory weight reload."""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence

import torch
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.outputs import CompletionOutput

from earl_core.engines.base import Generation, SamplingSpec, validate_prompts
from earl_core.errors import EngineError


class VLLMEngine:
    """A vLLM ``LLM`` in this process (CPU) or with vLLM's own workers (GPU), driven by token ids."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str,
        *,
        kv_cache_gib: float = 1.0,
        max_model_len: int = 8192,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        gpu_memory_utilization: float = 0.8,
        dtype: str = "float32",
    ) -> None:
        on_gpu = torch.cuda.is_available()
        options: dict[str, object] = {}
        if not on_gpu:
            # In-process engine core: no spawned processes, and collective_rpc calls run right here.
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            # vLLM's CPU memory check sees only the NUMA node; a fixed KV budget sidesteps it.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = _gib_text(kv_cache_gib)
            options["enforce_eager"] = True
            options["distributed_executor_backend"] = "uni" if tensor_parallel_size == 1 else "mp"
            if tensor_parallel_size > 1:
                # Each CPU rank needs its own cores, else "Not enough allowed NUMA nodes to bind threads".
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", _split_cores(tensor_parallel_size))
            # vLLM 0.32 on CPU crashes ("CPU Generator does not use offset") when a seeded request's
            # prefill is split into chunks; whole-prompt prefills avoid it. The batch token budget
            # must then hold the longest prompt.
            options["enable_chunked_prefill"] = False
            options["max_num_batched_tokens"] = max(max_model_len, 8192)
        else:
            options["gpu_memory_utilization"] = gpu_memory_utilization
        try:
            self.llm = LLM(
                model=str(model_dir),
                tokenizer=str(model_dir),
                # float32 by default so logprobs match the trainer's float32 forward pass; vLLM's
                # "auto" would downcast a float32 checkpoint to bf16/fp16.
                dtype=dtype,
                max_model_len=max_model_len,
                tensor_parallel_size=tensor_parallel_size,
                seed=seed,
                # Each turn re-sends the whole conversation; the cache makes that prefix free.
                enable_prefix_caching=True,
                # Logprobs before temperature/top-p: what the trainer's forward pass computes.
                logprobs_mode="raw_logprobs",
                **options,
            )
        except Exception as exc:  # vLLM raises many types while starting; callers need one
            raise EngineError(f"vLLM failed to start on {model_dir!r}: {exc}") from exc
        model_config = self.llm.llm_engine.model_config
        self.vocab_size = model_config.get_vocab_size()
        self.max_model_len = model_config.max_model_len
        cache = self.llm.llm_engine.vllm_config.cache_config
        # Tokens the KV cache holds across all running sequences (per rank it holds each token's share of the
        # KV heads, so a TP engine holds more): past it vLLM preempts and recomputes sequences.
        self.kv_capacity_tokens: int | None = (
            int(cache.num_gpu_blocks) * int(cache.block_size) if cache.num_gpu_blocks else None)

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """Sample continuations for all prompts in one vLLM call; logprobs are raw."""
        llm = self._require_llm()
        if not prompts:
            return []
        validate_prompts(prompts, vocab_size=self.vocab_size, max_len=self.max_model_len)
        params = [
            SamplingParams(
                max_tokens=min(spec.max_new_tokens, self.max_model_len - len(prompt)),
                temperature=spec.temperature,
                top_p=spec.top_p,
                # top_k / min_p / penalties stay neutral (vLLM ignores generation_config when given params).
                stop_token_ids=list(spec.stop_token_ids),
                seed=None if spec.seed is None else spec.seed + index,
                logprobs=0,  # 0 = only the sampled token's logprob
                detokenize=False,
            )
            for index, prompt in enumerate(prompts)
        ]
        requests = [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts]
        try:
            outputs = llm.generate(requests, params, use_tqdm=False)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"vLLM generation failed: {exc}") from exc
        return [_to_generation(output.outputs[0]) for output in outputs]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Reload weights in place in every worker, then drop cached prefixes computed with the old ones."""
        llm = self._require_llm()
        # A list (not an iterator) so the call can cross process boundaries on multi-process setups;
        # the method is named by string so nothing needs pickling.
        weights = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        try:
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except Exception as exc:  # surfaced from inside the workers, type varies
            raise EngineError(f"vLLM weight reload failed: {exc}") from exc
        llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine core down and free its memory so another engine can start in this process."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        # Shutting the core down tears down vLLM's torch.distributed group; without it a second
        # LLM in the same process fails to initialise its own.
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _require_llm(self) -> LLM:
        if self.llm is None:
            raise EngineError("VLLMEngine is closed")
        return self.llm


def _gib_text(gib: float) -> str:
    """VLLM_CPU_KVCACHE_SPACE takes whole GiB; round up so small budgets stay non-zero."""
    return str(max(1, int(-(-gib // 1))))


def _split_cores(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND value giving each rank an equal, disjoint block of this process's cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        raise EngineError(f"tensor_parallel_size={ranks} needs at least {ranks} CPU cores, found {len(cores)}")
    per_rank = len(cores) // ranks
    blocks = [cores[r * per_rank : (r + 1) * per_rank] for r in range(ranks)]
    return "|".join(",".join(str(c) for c in block) for block in blocks)


def _to_generation(completion: CompletionOutput) -> Generation:
    """vLLM CompletionOutput -> Generation (the stop token is part of token_ids)."""
    token_ids = list(completion.token_ids)
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids)]
    finish = "stop" if completion.finish_reason == "stop" else "length"
    return Generation(token_ids, logprobs, finish)
