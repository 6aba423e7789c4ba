"""Rollout layouts on a real local Ray: a vLLM engine with two tensor-parallel ranks plays the same greedy games as
two single-rank engines, and switching between the layouts rebuilds the engines with the weights handed over in
memory (the trainer's object reference, not the model on disk)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from earl_core.ray_exec.cluster import ray_cluster
from earl_core.ray_exec.groups import RolloutGroup

pytestmark = pytest.mark.slow

GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": 0}
LIMITS = {"max_invalid": 3, "format_penalty": 0.0, "max_context": 2048, "max_new_tokens": 8}


def _specs(n: int) -> list[dict]:
    return [{"index": i, "group": i, "agent_side": 1 + i % 2, "opponent": "random", "seed": 50 + i} for i in range(n)]


def test_tp2_engine_plays_like_two_tp1_engines_and_switches_in_memory(protocol_model: Path) -> None:
    # Weights that differ from the model on disk (and give sharper logits than a fresh init, so greedy choices
    # are not near-ties): after a rebuild the engines must play with these, not with the files.
    model = AutoModelForCausalLM.from_pretrained(protocol_model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    opts = {"kv_cache_gib": 1, "max_model_len": 2048, "seed": 0}
    with ray_cluster(num_cpus=2):
        ref = [ray.put(weights)]
        group = RolloutGroup(str(protocol_model), workers=2, engine="vllm", engine_opts=opts, tp=2)
        try:
            assert (group.engines, group.tp) == (1, 2)
            group.play(_specs(6), GREEDY, LIMITS)  # the weights on disk
            fresh = group.held_records()
            group.load_weights(ref)
            group.play(_specs(6), GREEDY, LIMITS)
            tp2 = group.held_records()
            tp2_capacity = group.kv_capacity_tokens()
            names = [m["worker"] for m in group.memory()]
            seconds = group.relayout(1, ref)
            assert (group.engines, group.tp) == (2, 1)
            tp1_meta = group.play(_specs(6), GREEDY, LIMITS)["records"]
            tp1 = group.held_records()
            tp1_capacity = group.kv_capacity_tokens()
            turn = group.profile(games=4, context=256, step_tokens=64, new_tokens=4)
        finally:
            group.close()
    assert names == ["rollout-0-tp2"]
    assert seconds > 0 and turn["seconds"] > 0 and turn["tokens_per_s"] > 0
    # Each rank of the TP engine keeps half of every token's KV heads in the same KV space: twice the tokens.
    assert tp2_capacity == 2 * tp1_capacity > 0
    a, b = tp2, tp1
    # The driver got metadata only; the whole records stayed with the engines.
    assert all("token_ids" not in r and r["tokens"] == len(f["token_ids"]) for r, f in zip(tp1_meta, tp1))
    assert [r["index"] for r in a] == [r["index"] for r in b] == list(range(6))
    assert sum(len(r["turn_context"]) for r in a) > 6, "the games went on for several turns"
    for x, y in zip(a, b):
        assert x["token_ids"] == y["token_ids"]
        got = torch.tensor([p for p, m in zip(x["logprobs"], x["action_mask"]) if m])
        want = torch.tensor([p for p, m in zip(y["logprobs"], y["action_mask"]) if m])
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    # The disk weights play other games: the rebuilt engines really play the handed-over weights.
    assert [r["token_ids"] for r in fresh] != [r["token_ids"] for r in b]
