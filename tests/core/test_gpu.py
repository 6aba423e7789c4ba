"""GPU path (run where CUDA exists; skipped elsewhere): vLLM on the GPU agrees with transformers, and a learner step runs on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from earl_core.agent.chat import ChatEncoder
from earl_core.agent.protocol import system_prompt, turn_prompt
from earl_core.config import AlgoConfig
from earl_core.engines import SamplingSpec, make_engine
from earl_core.env.connect_four import Board
from earl_core.rl.learner import Learner

pytestmark = pytest.mark.gpu


def test_vllm_on_gpu_matches_hf_greedy(protocol_model: Path, protocol_tokenizer) -> None:  # noqa: ANN001
    enc = ChatEncoder(protocol_tokenizer)
    prompt = enc.message("system", system_prompt(1)) + enc.message("user", turn_prompt(Board(), None)) \
        + enc.generation_prompt()
    spec = SamplingSpec(max_new_tokens=8, temperature=0.0, stop_token_ids=(enc.im_end,))
    vllm = make_engine("vllm", str(protocol_model), gpu_memory_utilization=0.2)
    try:
        got = vllm.generate([prompt] * 4, spec)
    finally:
        vllm.close()
    hf = make_engine("hf", str(protocol_model))
    want = hf.generate([prompt] * 4, spec)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_learner_runs_on_cuda(protocol_model: Path) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(), seed=0)
    assert learner.device.type == "cuda"
    rec = {"token_ids": list(range(1, 40)), "action_mask": [0] * 30 + [1] * 9}
    metrics = learner.rl_step(learner.prepare([rec, rec], [1.0, -1.0]))
    assert metrics["perf/train_tokens"] == 18 and torch.cuda.max_memory_allocated() > 0


def test_profile_reports_running_out_of_device_memory(protocol_model: Path) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(), seed=0)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(2 * (1 << 30) / total)  # 2 GiB: the tiny model needs far less
    try:
        # 64 x 16K tokens: ~12 GiB of saved activations per layer alone.
        failed = learner.profile("train", 64, 16384)
        assert failed["out_of_memory"] == 1.0 and failed["tokens_per_s"] == 0.0
        assert all(p.grad is None for p in learner.model.parameters())
        fine = learner.profile("train", 1, 256)
        assert fine["tokens_per_s"] > 0 and "out_of_memory" not in fine
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
