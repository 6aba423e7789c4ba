"""Runs the Data Dispatcher on a real two-node Ray cluster and prints what it saw as JSON (test_dispatch.py starts it
inside a network namespace of its own, where loopback is the only interface, so both raylets stay on 127.0.0.1).

    python tests/e2e/two_node_dispatch.py MODEL_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import ray
import torch
from ray.cluster_utils import Cluster
from transformers import AutoModelForCausalLM

from earl_core.config import AlgoConfig
from earl_core.ray_exec.dispatcher import Dispatcher
from earl_core.ray_exec.groups import RolloutGroup, TrainerGroup
from earl_core.rl.advantages import RunningBaseline

SAMPLING = {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 5}
LIMITS = {"max_invalid": 3, "format_penalty": 0.0, "max_context": 2048, "max_new_tokens": 8}


def specs(n: int) -> list[dict[str, Any]]:
    # Groups of two games sharing seed, side and opponent (GRPO groups).
    return [{"index": i, "group": i // 2, "agent_side": 1 + (i // 2) % 2, "opponent": "random", "seed": 70 + i // 2}
            for i in range(n)]


WAYS = {"centralized": ("centralized", "object_store"), "object_store": ("layout_aware", "object_store"),
        "collective": ("layout_aware", "collective")}
"""The dispatches compared: the baseline and the layout-aware mode over each transport."""


def train(model: str, algo: AlgoConfig, way: str, played: dict[str, Any], rollout: RolloutGroup, *,
          tp: int = 1) -> dict[str, Any]:
    trainer = TrainerGroup(model, workers=2, algo=algo.__dict__, reference_dir=None, seed=0, tp=tp)
    try:
        # A baseline from earlier iterations (0.5): the untrained policy's games may all end alike, and advantages
        # of zero would train nothing.
        baseline = RunningBaseline(algo.baseline_decay, 0.5)
        dispatcher = Dispatcher(*WAYS[way][:1], algo, WAYS[way][1])
        routes = sorted({t.route for t in dispatcher.plan(played["records"], rollout, trainer).transfers})
        report = dispatcher.dispatch(played, rollout, trainer, baseline)
        nodes = sorted(set(trainer.nodes()))
        metrics = trainer.rl_step_received()
        weights = ray.get(trainer.weights()[0])
    finally:
        trainer.close()
    return {"report": {**report.__dict__, "advantages": {str(k): v for k, v in report.advantages.items()}},
            "nodes": nodes, "metrics": metrics, "routes": routes,
            "weights_hash": weights_hash(weights)}


def weights_hash(weights: dict[str, torch.Tensor]) -> str:
    """Digest of the exact bytes of every weight (a bit-exact comparison without shipping the weights)."""
    h = hashlib.sha256()
    for _, w in sorted(weights.items()):
        h.update(w.contiguous().numpy().tobytes())
    return h.hexdigest()


def main(model: str) -> dict[str, Any]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    out: dict[str, Any] = {"cluster_nodes": len([n for n in ray.nodes() if n["Alive"]])}
    initial = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
    out["initial_hash"] = weights_hash(initial)
    try:
        # Two engines fill one node (PACK); the trainer's two ranks then can only go to the other node.
        rollout = RolloutGroup(model, workers=2, engine="hf", engine_opts={})
        try:
            played = rollout.play(specs(8), SAMPLING, LIMITS)
            out["records"] = played["records"]
            out["engine_nodes"] = sorted(set(rollout.nodes()))
            for name in ("grpo", "reinforce"):
                algo = AlgoConfig(name=name, lr=1e-3, micro_batch=2, epochs=1, kl_coef=0.0)
                out[name] = {way: train(model, algo, way, played, rollout) for way in WAYS}
            # One TP group of two ranks on the other node: one network copy, the second rank gets it relayed.
            grpo = AlgoConfig(name="grpo", lr=1e-3, micro_batch=2, epochs=1, kl_coef=0.0)
            out["tp2"] = {way: train(model, grpo, way, played, rollout, tp=2) for way in ("centralized", "collective")}
        finally:
            rollout.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(str(Path(sys.argv[1])))))
