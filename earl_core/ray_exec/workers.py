"""Ray actor classes: a rollout worker owning one engine, and a data-parallel trainer worker owning a Learner."""

from __future__ import annotations

import random
import socket
import time
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoTokenizer

from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, RunnerLimits, engine_policy, play_episodes
from earl_core.config import AlgoConfig
from earl_core.engines.base import Generation, SamplingSpec, make_engine
from earl_core.env.opponents import make_opponent
from earl_core.parallel.probe import PeakMemory
from earl_core.parallel.tensor_parallel import local_numel
from earl_core.ray_exec.memory import memory_reading
from earl_core.rl.learner import Learner


class RolloutWorker:
    """Plays a share of each iteration's games with its own engine; receives new weights in memory."""

    def __init__(self, model_dir: str, *, index: int, engine: str, engine_opts: dict[str, Any]) -> None:
        self.index = index
        self.name = f"rollout-{index}"
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.encoder = ChatEncoder(tokenizer)
        self.engine = make_engine(engine, model_dir, **engine_opts)

    def ready(self) -> str:
        return self.name

    def play(self, specs: list[dict[str, Any]], sampling: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
        """Play the given games; returns finished episode records and rollout statistics."""
        generated = 0
        calls = 0

        def policy(episodes: list[Episode]) -> list[Generation]:
            nonlocal generated, calls
            # A fresh seed per worker and per turn: prompt i of a call samples with seed + i, so equal
            # prompts on different workers or turns must not share a seed (GRPO groups would collapse).
            seed = random.Random(f"{sampling.get('seed')}/{self.index}/{calls}").getrandbits(31)
            spec = SamplingSpec(**{**sampling, "seed": seed, "stop_token_ids": (self.encoder.im_end,)})
            gens = engine_policy(self.engine, spec)(episodes)
            generated += sum(len(g.token_ids) for g in gens)
            calls += 1
            return gens

        games = [
            GameSpec(index=s["index"], group=s["group"], agent_side=s["agent_side"],
                     opponent=make_opponent(s["opponent"]), seed=s["seed"])
            for s in specs
        ]
        start = time.perf_counter()
        episodes = play_episodes(games, policy, self.encoder, limits=RunnerLimits(**limits))
        seconds = time.perf_counter() - start
        return {
            "records": [ep.record() for ep in episodes],
            "generated_tokens": generated,
            "engine_calls": calls,
            "seconds": seconds,
            "worker": self.name,
        }

    def load_weights(self, state_dict_ref: list[ray.ObjectRef]) -> float:
        """Load weights handed over by reference (they come straight from the trainer, never via the driver)."""
        start = time.perf_counter()
        state_dict = ray.get(state_dict_ref[0])
        self.engine.load_weights(state_dict)
        return time.perf_counter() - start

    def memory(self) -> dict[str, Any]:
        return memory_reading(self.name, "rollout")

    def close(self) -> None:
        self.engine.close()


class TrainerWorker:
    """One data-parallel rank of the trainer; ranks all-reduce gradients with gloo (CPU) or NCCL (GPU)."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.name = f"trainer-{rank}"
        self.learner: Learner | None = None
        self._dp_group: Any = None
        self.device = "cpu"

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port on this rank's node for the process group (rank 0 hosts it)."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, int(s.getsockname()[1])

    def setup(self, model_dir: str, *, algo: dict[str, Any], reference_dir: str | None, seed: int,
              master: tuple[str, int] | None, temperature: float = 1.0, tp: int = 1) -> str:
        # Ray caps actor threads at 1 by default; use the CPUs this actor reserved.
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))
        tp_mesh = None
        if self.world_size > 1:
            assert master is not None
            device = "cuda" if torch.cuda.is_available() else "cpu"
            dist.init_process_group("nccl" if device == "cuda" else "gloo",
                                    init_method=f"tcp://{master[0]}:{master[1]}", rank=self.rank,
                                    world_size=self.world_size, timeout=timedelta(minutes=10))
            self.device = device
            tp_mesh = self._mesh(tp)
        self.learner = Learner(model_dir, algo=AlgoConfig(**algo), reference_dir=reference_dir, seed=seed,
                               temperature=temperature, reduce=self._all_reduce, tp_mesh=tp_mesh)
        return self.name

    def _mesh(self, tp: int) -> Any:
        """(dp, tp) mesh over the whole group; sets the DP group and returns the TP mesh (None for tp=1)."""
        # Rank = dp_index * tp + tp_index: the ranks of one TP group are neighbours (one node, when packed).
        mesh = init_device_mesh(self.device, (self.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        self._dp_group = mesh["dp"].get_group() if self.world_size // tp > 1 else None
        return mesh["tp"] if tp > 1 else None

    def relayout(self, tp: int) -> float:
        """Re-split the learner for TP degree ``tp`` over the same ranks (weights move in memory)."""
        assert self.learner is not None
        if self.world_size == 1:
            return 0.0
        start = time.perf_counter()
        # The old shards carry their own mesh, so the gather inside relayout still runs on the old TP group.
        self.learner.relayout(self._mesh(tp))
        return time.perf_counter() - start

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self._dp_group is not None:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self._dp_group)
        return t

    def rl_step(self, records: list[dict[str, Any]], advantages: list[float]) -> dict[str, float]:
        assert self.learner is not None
        start = time.perf_counter()
        with PeakMemory() as experience_peak:
            batch = self.learner.prepare(records, advantages)
        prepared = time.perf_counter()
        with PeakMemory() as train_peak:
            metrics = self.learner.rl_step(batch)
        end = time.perf_counter()
        return {**metrics, "perf/experience_s": prepared - start, "perf/train_s": end - prepared,
                "memory/experience_peak_bytes": float(experience_peak.bytes),
                "memory/train_peak_bytes": float(train_peak.bytes)}

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool) -> None:
        assert self.learner is not None
        self.learner.set_layout(stage, micro_batch, checkpointing)

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool) -> dict[str, float]:
        assert self.learner is not None
        return self.learner.profile(stage, micro_batch, context, checkpointing=checkpointing)

    def sft_step(self, records: list[dict[str, Any]], lr: float) -> dict[str, float]:
        assert self.learner is not None
        return self.learner.sft_step(records, lr=lr)

    def reset_optimizer(self) -> None:
        assert self.learner is not None
        self.learner.reset_optimizer()

    def weights(self, publish: bool = True) -> list[ray.ObjectRef]:
        """The full weights as an object in this worker's store, returned by reference (wrapped so Ray does not
        fetch it). Under TP every rank of the group takes part in the gather; only one publishes."""
        assert self.learner is not None
        state = self.learner.state_dict()
        return [ray.put(state)] if publish else []

    def save(self, path: str, extra: dict[str, Any], write: bool = True) -> str:
        assert self.learner is not None
        return str(self.learner.save(path, extra=extra, write=write))

    def load_optimizer(self, checkpoint: str) -> None:
        assert self.learner is not None
        self.learner.load_optimizer(checkpoint)

    def memory(self) -> dict[str, Any]:
        return memory_reading(self.name, "train")

    def local_parameters(self) -> int:
        """Parameters this rank stores (fewer than the model's under TP)."""
        assert self.learner is not None
        return local_numel(self.learner.model)

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
