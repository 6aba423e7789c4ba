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

from earl_core.agent.chat import ChatEncoder, answer_spans
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, RunnerLimits, engine_policy, play_episodes
from earl_core.config import AlgoConfig
from earl_core.dispatch import wire
from earl_core.dispatch.group_stats import baseline_advantages, grpo_from_table, summarise, table_from_wire, table_to_wire
from earl_core.dispatch.plan import ReceiveSchedule
from earl_core.dispatch.shipment import Shipment, assemble, metadata
from earl_core.engines.base import Generation, SamplingSpec, make_engine
from earl_core.env.opponents import make_opponent
from earl_core.parallel.tensor_parallel import local_numel
from earl_core.ray_exec.memory import memory_reading
from earl_core.rl.learner import Learner


class RolloutWorker:
    """Plays a share of each iteration's games with its own engine; receives new weights in memory."""

    def __init__(self, model_dir: str, *, index: int, engine: str, engine_opts: dict[str, Any]) -> None:
        self.index = index
        tp = int(engine_opts.get("tensor_parallel_size", 1))
        self.name = f"rollout-{index}" if tp == 1 else f"rollout-{index}-tp{tp}"
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.encoder = ChatEncoder(tokenizer)
        self.engine = make_engine(engine, model_dir, **engine_opts)
        self.held: dict[int, dict[str, Any]] = {}
        """The last games played, kept here until shipped to the trainer (only metadata goes to the driver)."""

    def ready(self) -> str:
        return self.name

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def kv_capacity_tokens(self) -> int | None:
        """Tokens this engine's KV cache holds (None: the engine does not preallocate one)."""
        return getattr(self.engine, "kv_capacity_tokens", None)

    def play(self, specs: list[dict[str, Any]], sampling: dict[str, Any], limits: dict[str, Any], *,
             shown_game: int | None = None) -> dict[str, Any]:
        """Play the given games and keep their records here; returns their metadata (records without the per-token
        fields; the move texts only of ``shown_game``), per-group reward scalars and rollout statistics."""
        generated = 0
        calls = 0
        # A seed of this worker's own: equal prompts on different workers must not share draws (GRPO groups would
        # collapse); engine_policy then derives a fresh seed per call (turn) from it.
        seed = random.Random(f"{sampling.get('seed')}/{self.index}").getrandbits(31)
        engine_turn = engine_policy(self.engine, SamplingSpec(**{**sampling, "seed": seed,
                                                                 "stop_token_ids": (self.encoder.im_end,)}))

        def policy(episodes: list[Episode]) -> list[Generation]:
            nonlocal generated, calls
            gens = engine_turn(episodes)
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
        records = [ep.record() for ep in episodes]
        self.held = {r["index"]: r for r in records}
        return {
            "records": [metadata(r, keep_moves=r["index"] == shown_game) for r in records],
            "groups": table_to_wire(summarise([r["reward"] for r in records], [r["group"] for r in records])),
            "generated_tokens": generated,
            "engine_calls": calls,
            "seconds": seconds,
            "worker": self.name,
        }

    def ship(self, sends: dict[int, list[int]]) -> dict[int, dict[str, Any]]:
        """Put one Shipment per receiver (sample ids per destination key) into this node's object store; returns
        per receiver the reference (wrapped in a list, so whoever gets this answer does not fetch the bytes) and
        the shipment's bytes per field."""
        out = {}
        for dest, ids in sends.items():
            shipment = Shipment.pack([self.held[i] for i in ids])
            out[dest] = {"ref": [ray.put(shipment)], "bytes": shipment.field_bytes()}
        return out

    def join_dispatch(self, store: tuple[str, int], rank: int, world: int) -> None:
        """Join the dispatch group (earl_core.dispatch.wire) as ``rank``; replaces an earlier group."""
        self.dispatch_group = wire.join(host=ray.util.get_node_ip_address(), store=store, rank=rank, world=world)

    def send_games(self, sends: dict[int, list[int]]) -> dict[int, dict[str, int]]:
        """Send one Shipment per receiver (sample ids per dispatch-group rank) over the dispatch group; returns the
        bytes per field of each."""
        shipments = {dest: Shipment.pack([self.held[i] for i in ids]) for dest, ids in sends.items()}
        wire.send(self.dispatch_group, shipments)
        return {dest: s.field_bytes() for dest, s in shipments.items()}

    def held_records(self) -> list[dict[str, Any]]:
        """The held games' whole records (per-token fields included)."""
        return list(self.held.values())

    def release(self) -> None:
        """Drop the held games (after the iteration's dispatch)."""
        self.held = {}

    def load_weights(self, state_dict_ref: list[ray.ObjectRef]) -> float:
        """Load weights handed over by reference (they come straight from the trainer, never via the driver)."""
        start = time.perf_counter()
        state_dict = ray.get(state_dict_ref[0])
        self.engine.load_weights(state_dict)
        return time.perf_counter() - start

    def profile(self, batch: int, context: int, step_tokens: int, new_tokens: int) -> float:
        """Seconds of one game turn for ``batch`` conversations at ``context`` tokens: each conversation's prefix
        is already cached (as after the previous turn), ``step_tokens`` new prompt tokens are prefilled and
        ``new_tokens`` are decoded. Random token ids: the time does not depend on what they say."""
        rng = random.Random(context * 7919 + batch)
        vocab = max(2, int(getattr(self.engine, "vocab_size", 256)))
        prefixes = [[rng.randrange(vocab) for _ in range(max(1, context - step_tokens))] for _ in range(batch)]
        warm = SamplingSpec(max_new_tokens=1, temperature=1.0, seed=1)
        self.engine.generate(prefixes, warm)  # caches the prefixes, like the turns before
        turn = [p + [rng.randrange(vocab) for _ in range(step_tokens)] for p in prefixes]
        # No stop token: every conversation decodes the whole answer budget.
        spec = SamplingSpec(max_new_tokens=new_tokens, temperature=1.0, seed=2)
        start = time.perf_counter()
        self.engine.generate(turn, spec)
        return time.perf_counter() - start

    def replay(self, records: list[dict[str, Any]]) -> float:
        """Seconds to re-run recorded games' agent turns on this engine, turn by turn with all games of a turn in
        one call: each prompt is the conversation up to that answer (cached up to the previous turn, as in a
        rollout), and as many tokens are decoded as the answer had (the sampled ones are dropped). It is the
        engine work of playing those games, for a benchmark whose games (a "thinking" agent's) a freshly built
        model would not play itself."""
        turns = [answer_spans(r["action_mask"]) for r in records]
        start = time.perf_counter()
        for t in range(max((len(x) for x in turns), default=0)):
            live = [(r["token_ids"][: x[t][0]], x[t][1] - x[t][0]) for r, x in zip(records, turns) if t < len(x)]
            spec = SamplingSpec(max_new_tokens=max(n for _, n in live), temperature=1.0, seed=t)
            self.engine.generate([prompt for prompt, _ in live], spec)
        return time.perf_counter() - start

    def memory(self) -> dict[str, Any]:
        return memory_reading(self.name, "rollout", children=True)

    def close(self) -> None:
        self.engine.close()


def _destroy_mesh_groups(mesh: Any) -> None:
    """Destroy the process groups of ``mesh``'s dimensions, except the default group (a dimension that spans
    the whole world is the default group itself)."""
    for name in mesh.mesh_dim_names:
        group = mesh.get_group(name)
        if group is not dist.group.WORLD:
            dist.destroy_process_group(group)


class TrainerWorker:
    """One data-parallel rank of the trainer; ranks all-reduce gradients with gloo (CPU) or NCCL (GPU)."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.name = f"trainer-{rank}"
        self.learner: Learner | None = None
        self._received: tuple[list[dict[str, Any]], list[float]] = ([], [])
        self._dp_group: Any = None
        self._dp_mesh: Any = None
        self._world_mesh: Any = None  # the (dp, tp) mesh whose groups the learner uses now
        self.fsdp = False
        self.device = "cpu"

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def rendezvous(self) -> tuple[str, int]:
        """Address and a free port on this rank's node for the process group (rank 0 hosts it)."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, int(s.getsockname()[1])

    def setup(self, model_dir: str, *, algo: dict[str, Any], reference_dir: str | None, seed: int,
              master: tuple[str, int] | None, temperature: float = 1.0, tp: int = 1, fsdp: bool = False) -> str:
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
        self.fsdp = fsdp and self._dp_mesh is not None
        self.learner = Learner(model_dir, algo=AlgoConfig(**algo), reference_dir=reference_dir, seed=seed,
                               temperature=temperature, reduce=self._all_reduce, tp_mesh=tp_mesh,
                               dp_mesh=self._dp_mesh, fsdp=self.fsdp)
        return self.name

    def _mesh(self, tp: int) -> Any:
        """(dp, tp) mesh over the whole group; sets the DP group and returns the TP mesh (None for tp=1)."""
        # Rank = dp_index * tp + tp_index: the ranks of one TP group are neighbours (one node, when packed).
        mesh = init_device_mesh(self.device, (self.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
        self._world_mesh = mesh
        self._dp_mesh = mesh["dp"] if self.world_size // tp > 1 else None
        self._dp_group = self._dp_mesh.get_group() if self._dp_mesh is not None else None
        return mesh["tp"] if tp > 1 else None

    def relayout(self, tp: int, fsdp: bool = False) -> float:
        """Re-split the learner for TP degree ``tp``, sharded with FSDP over the DP ranks or not, over the same
        ranks (weights and optimizer state move in memory)."""
        assert self.learner is not None
        if self.world_size == 1:
            return 0.0
        start = time.perf_counter()
        # The old shards carry their own mesh, so the gather inside relayout still runs on the old TP group.
        old = self._world_mesh
        tp_mesh = self._mesh(tp)
        self.fsdp = fsdp and self._dp_mesh is not None
        self.learner.relayout(tp_mesh, dp_mesh=self._dp_mesh, fsdp=self.fsdp)
        # Every init_device_mesh makes new groups (each holds sockets and threads under gloo, communicators under
        # NCCL), so a run that switches often would pile them up. The barrier first: a rank may finish its last
        # collective on an old group while a peer is still in it.
        dist.barrier()
        _destroy_mesh_groups(old)
        return time.perf_counter() - start

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self._dp_group is not None:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self._dp_group)
        return t

    def host_dispatch_store(self, world: int) -> tuple[str, int]:
        """Host the dispatch group's rendezvous store on this rank's node; its address."""
        ip = ray.util.get_node_ip_address()
        self._dispatch_store, port = wire.host_store(ip, world)
        return ip, port

    def join_dispatch(self, store: tuple[str, int], rank: int, world: int) -> None:
        """Join the dispatch group as ``rank`` (a group of its own: the trainer's process group is untouched)."""
        self.dispatch_group = wire.join(host=ray.util.get_node_ip_address(), store=store, rank=rank, world=world)

    def receive(self, refs: list[ray.ObjectRef], expected: list[int], advantage: dict[str, Any]) -> dict[str, Any]:
        """Fetch this rank's shipments (straight from the workers or the driver that put them) and accept them."""
        start = time.perf_counter()
        return self._accept(ray.get(refs), expected, advantage, start)

    def receive_messages(self, schedule: ReceiveSchedule, offset: int, expected: list[int],
                         advantage: dict[str, Any]) -> dict[str, Any]:
        """Take this rank's shipments over the dispatch group by its receive schedule (wire.receive_scheduled;
        trainer rank r is dispatch-group rank ``offset + r``) and accept them."""
        start = time.perf_counter()
        return self._accept(wire.receive_scheduled(self.dispatch_group, schedule, offset=offset), expected,
                            advantage, start)

    def _accept(self, shipments: list[Shipment], expected: list[int], advantage: dict[str, Any],
                start: float) -> dict[str, Any]:
        """Check that exactly the expected samples came, in the expected order, and compute their advantages when
        they did not come with them: from the merged per-group scalars (GRPO) or the baseline value (REINFORCE)."""
        records, advantages = assemble(shipments, expected)
        if advantages is None:
            rewards = [r["reward"] for r in records]
            if advantage["kind"] == "grpo":
                table = table_from_wire(advantage["table"])
                advantages = grpo_from_table(rewards, [r["group"] for r in records], table,
                                             normalize_std=advantage["normalize_std"]).tolist()
            else:
                advantages = baseline_advantages(rewards, advantage["baseline"]).tolist()
        self._received = (records, advantages)
        return {"seconds": time.perf_counter() - start, "samples": len(records),
                "bytes": sum(s.nbytes for s in shipments), "advantages": advantages}

    def rl_step_received(self) -> dict[str, float]:
        """The RL step on what receive() got."""
        records, advantages = self._received
        self._received = ([], [])
        return self.rl_step(records, advantages)

    def rl_step(self, records: list[dict[str, Any]], advantages: list[float]) -> dict[str, float]:
        assert self.learner is not None
        return self.learner.measured_rl_step(records, advantages)

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

    def reset_reference(self) -> None:
        assert self.learner is not None
        self.learner.reset_reference()

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
