"""Rollout engines behind one protocol: vLLM for speed, plain transformers as the reference."""

from __future__ import annotations

from earl_core.engines.base import ENGINE_KINDS, Generation, RolloutEngine, SamplingSpec, make_engine
from earl_core.engines.hf import HFEngine

# VLLMEngine is not re-exported: importing vLLM costs seconds, so it loads only when asked for
# (`make_engine("vllm", ...)` or `from earl_core.engines.vllm_engine import VLLMEngine`).
__all__ = ["ENGINE_KINDS", "Generation", "HFEngine", "RolloutEngine", "SamplingSpec", "make_engine"]
