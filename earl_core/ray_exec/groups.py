"""Worker groups: split work across the actors of a stage and gather their results (paired split/gather)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from earl_core.errors import PlacementError
from earl_core.ray_exec.workers import RolloutWorker, TrainerWorker
from earl_core.rl.batch import balance_by_tokens

T = TypeVar("T")
log = logging.getLogger(__name__)


# What a dead rollout or trainer worker raises in the driver: the actor itself, its process, an object only it
# held, or its node. (Wrapped in a RayTaskError when a peer saw it first: Ray makes that an instance of the cause.)
WORKER_LOST = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError,
               ray.exceptions.NodeDiedError)


def close_actors(actors: list[Any]) -> None:
    """Ask each actor to free its resources, then kill it; a dead or failing actor never blocks the others
    and never hides the error that ended the run (cleanup problems are logged, not raised)."""
    for actor in actors:
        try:
            ray.get(actor.close.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - cleanup must go on whatever happened to this actor
            log.warning("closing %s failed", actor, exc_info=True)
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001
            log.warning("killing %s failed", actor, exc_info=True)


PLACEMENT_TIMEOUT_S = 120.0


class Gang:
    """All-or-nothing reservation of one bundle per worker (a Ray placement group): a group starts only when
    every one of its workers can be placed, so no half-started group holds resources."""

    def __init__(self, name: str, workers: int, *, cpus: float, gpus: float = 0,
                 timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
        self.bundle = {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}
        self.group: PlacementGroup = placement_group([dict(self.bundle) for _ in range(workers)], strategy="PACK")
        if not self.group.wait(timeout_s):
            remove_placement_group(self.group)
            raise PlacementError(f"{name}: {workers} x {self.bundle} could not be reserved within {timeout_s:.0f} s "
                                 f"(cluster has {ray.available_resources()} free of {ray.cluster_resources()})")

    def slot(self, index: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that puts a worker into bundle ``index``."""
        return PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=index)

    def release(self) -> None:
        try:
            remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - cleanup must go on (the cluster may be gone already)
            log.warning("removing a placement group failed", exc_info=True)


def split_round_robin(items: Sequence[T], parts: int) -> list[list[T]]:
    """Item i goes to part i % parts (games are interleaved so each worker gets both sides and all groups)."""
    return [list(items[i::parts]) for i in range(parts)]


def split_by_tokens(records: Sequence[dict[str, Any]], parts: int) -> list[list[int]]:
    """Indices per part, longest first onto the lightest part, so ranks get similar token counts."""
    return balance_by_tokens([len(r["token_ids"]) for r in records], parts)


def _check_rollout_tp(workers: int, engine: str, tp: int) -> None:
    """Engines of ``tp`` ranks must use the rollout workers up exactly, and only vLLM splits an engine."""
    if tp < 1 or workers % tp:
        raise ValueError(f"{workers} rollout workers cannot form engines of {tp} tensor-parallel ranks")
    if tp > 1 and engine != "vllm":
        raise ValueError(f"the {engine} engine has no tensor parallelism (tp={tp})")


class RolloutGroup:
    """The rollout ranks as ``workers / tp`` engines (one Ray actor each) of ``tp`` tensor-parallel ranks."""

    def __init__(self, model_dir: str, *, workers: int, engine: str, engine_opts: dict[str, Any],
                 num_cpus: float = 1, num_gpus: float = 0, tp: int = 1) -> None:
        _check_rollout_tp(workers, engine, tp)
        self.model_dir, self.workers, self.engine, self.engine_opts = model_dir, workers, engine, dict(engine_opts)
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self._start(tp)

    def _start(self, tp: int) -> None:
        self.tp = tp
        # Counts the engine sets this group has started (a dispatch group of the old engines is stale).
        self.generation = getattr(self, "generation", 0) + 1
        self._nodes: list[str] | None = None
        engines = self.workers // tp
        # An engine's ranks are processes it starts itself (vLLM's executor): its bundle holds all their cores.
        self.gang = Gang("rollout workers", engines, cpus=self.num_cpus * tp, gpus=self.num_gpus * tp)
        opts = {**self.engine_opts, **({"tensor_parallel_size": tp} if self.engine == "vllm" else {})}
        actor = ray.remote(num_cpus=self.num_cpus * tp, num_gpus=self.num_gpus * tp)(RolloutWorker)
        self.actors = [actor.options(scheduling_strategy=self.gang.slot(i)).remote(
            self.model_dir, index=i, engine=self.engine, engine_opts=opts) for i in range(engines)]
        try:
            ray.get([a.ready.remote() for a in self.actors])
        except BaseException:
            self.close()
            raise

    @property
    def engines(self) -> int:
        return len(self.actors)

    def relayout(self, tp: int, weights_ref: list[ray.ObjectRef] | None) -> float:
        """Rebuild the engines with ``tp`` ranks each (vLLM fixes its tensor-parallel degree at start) and load
        ``weights_ref`` into them, straight from the trainer's object store (no disk). Returns the seconds taken."""
        _check_rollout_tp(self.workers, self.engine, tp)
        start = time.perf_counter()
        self.close()
        self._start(tp)
        if weights_ref is not None:
            self.load_weights(weights_ref)
        return time.perf_counter() - start

    def kv_capacity_tokens(self) -> int | None:
        """Tokens each engine's KV cache holds (the smallest of the engines; None when not preallocated)."""
        found = [c for c in ray.get([a.kv_capacity_tokens.remote() for a in self.actors]) if c is not None]
        return min(found) if found else None

    def profile(self, *, games: int, context: int, step_tokens: int, new_tokens: int) -> dict[str, float]:
        """One game turn of ``games`` conversations at ``context`` tokens, the games split over the engines as
        play() splits them; the slowest engine sets the time."""
        share = -(-games // self.engines)
        seconds = max(ray.get([a.profile.remote(share, context, step_tokens, new_tokens) for a in self.actors]))
        return {"seconds": seconds, "tokens_per_s": games * (step_tokens + new_tokens) / max(seconds, 1e-9)}

    def play(self, specs: list[dict[str, Any]], sampling: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
        """Split the games, play them everywhere at once; gather their metadata in game order (each names the
        engine that holds its bulk fields as ``source``), every engine's per-group reward scalars, summed stats.
        The lowest-numbered game keeps its move texts (the dashboard shows it)."""
        shares = split_round_robin(specs, len(self.actors))
        shown = min((s["index"] for s in specs), default=None)
        busy = [(i, a, s) for i, (a, s) in enumerate(zip(self.actors, shares)) if s]
        results = ray.get([a.play.remote(s, sampling, limits, shown_game=shown) for _, a, s in busy])
        for (source, _, _), res in zip(busy, results):
            for r in res["records"]:
                r["source"] = source
        records = sorted((r for res in results for r in res["records"]), key=lambda r: r["index"])
        return {
            "records": records,
            "groups": [res["groups"] for res in results],
            "generated_tokens": sum(r["generated_tokens"] for r in results),
            "seconds": max(r["seconds"] for r in results),
            "per_worker": [{"worker": r["worker"], "seconds": r["seconds"], "tokens": r["generated_tokens"]} for r in results],
        }

    def nodes(self) -> list[str]:
        """Ray node id of each engine (asked once per engine set: an actor does not change node)."""
        if self._nodes is None:
            self._nodes = ray.get([a.node.remote() for a in self.actors])
        return list(self._nodes)

    def ship(self, sends: list[dict[int, list[int]]]) -> list[dict[int, dict[str, Any]]]:
        """Each engine puts its shipments (``sends[engine]``: sample ids per destination key) into its own object
        store; the references come back, the bytes stay where they are."""
        return ray.get([a.ship.remote(part) for a, part in zip(self.actors, sends)])

    def held_records(self) -> list[dict[str, Any]]:
        """The last games' whole records, fetched to the caller in game order (for inspection: a run's games
        travel through the Data Dispatcher instead)."""
        return sorted((r for part in ray.get([a.held_records.remote() for a in self.actors]) for r in part),
                      key=lambda r: r["index"])

    def release(self) -> None:
        """The engines drop the games they hold."""
        ray.get([a.release.remote() for a in self.actors])

    def replay(self, records: list[dict[str, Any]]) -> float:
        """Re-run recorded games' turns on the engines (split as play() splits games); the slowest engine's
        seconds (RolloutWorker.replay)."""
        shares = split_round_robin(records, len(self.actors))
        return max(ray.get([a.replay.remote(s) for a, s in zip(self.actors, shares) if s]))

    def load_weights(self, weights_ref: list[ray.ObjectRef]) -> float:
        return max(ray.get([a.load_weights.remote(weights_ref) for a in self.actors]))

    def memory(self) -> list[dict[str, Any]]:
        return ray.get([a.memory.remote() for a in self.actors])

    def close(self) -> None:
        close_actors(self.actors)
        self.gang.release()


def _step_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from every rank's: losses are already global (reduced); times and peaks: the slowest."""
    out = dict(results[0])
    for key in ("perf/experience_s", "perf/train_s", "memory/experience_peak_bytes", "memory/train_peak_bytes"):
        out[key] = max(r[key] for r in results)
    return out


def _check_split(workers: int, tp: int, fsdp: bool) -> None:
    """Whether ``workers`` trainer ranks can run TP degree ``tp``, FSDP-sharded or not (FSDP needs >= 2 DP ranks)."""
    if tp < 1 or workers % tp:
        raise ValueError(f"{workers} trainer workers cannot form tensor-parallel groups of {tp}")
    if fsdp and workers // tp < 2:
        raise ValueError(f"FSDP shards over >= 2 data-parallel ranks, not {workers} worker(s) at TP={tp}")


class TrainerGroup:
    """Trainer ranks sharing one process group: `workers / tp` data-parallel groups of `tp` tensor-parallel ranks;
    with ``fsdp`` the training state is also sharded over the data-parallel ranks (2-D when tp > 1)."""

    def __init__(self, model_dir: str, *, workers: int, algo: dict[str, Any], reference_dir: str | None, seed: int,
                 temperature: float = 1.0, num_cpus: float = 1, num_gpus: float = 0, tp: int = 1,
                 fsdp: bool = False) -> None:
        _check_split(workers, tp, fsdp)
        self.tp = tp
        self.dp = workers // tp
        self.fsdp = fsdp
        self._nodes: list[str] | None = None
        self.gang = Gang("trainer workers", workers, cpus=num_cpus, gpus=num_gpus)
        actor = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(TrainerWorker)
        self.actors = [actor.options(scheduling_strategy=self.gang.slot(r)).remote(rank=r, world_size=workers)
                       for r in range(workers)]
        try:
            master = ray.get(self.actors[0].rendezvous.remote()) if workers > 1 else None
            ray.get([a.setup.remote(model_dir, algo=algo, reference_dir=reference_dir, seed=seed, master=master,
                                    temperature=temperature, tp=tp, fsdp=fsdp)
                     for a in self.actors])
        except BaseException:
            self.close()
            raise

    def _shares(self, records: Sequence[dict[str, Any]]) -> list[list[int]]:
        """Record indices per rank: split by tokens across the DP groups; the ranks of a TP group share one."""
        per_group = split_by_tokens(records, self.dp)
        return [per_group[rank // self.tp] for rank in range(len(self.actors))]

    @property
    def _lead(self) -> list[Any]:
        """The first TP group (under FSDP: every rank, each holding a shard): gathers full weights (a collective
        among its ranks), rank 0 publishes/writes."""
        return list(self.actors) if self.fsdp else self.actors[: self.tp]

    def nodes(self) -> list[str]:
        """Ray node id of each rank (asked once: the ranks live as long as the group, on their node)."""
        if self._nodes is None:
            self._nodes = ray.get([a.node.remote() for a in self.actors])
        return list(self._nodes)

    def receive(self, refs: list[list[ray.ObjectRef]], expected: list[list[int]],
                advantage: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank fetches its shipments and checks them (TrainerWorker.receive); returns each rank's answer."""
        return ray.get([a.receive.remote(r, e, advantage) for a, r, e in zip(self.actors, refs, expected)])

    def rl_step_received(self) -> dict[str, float]:
        """The RL step on every rank, on what receive() delivered (the run's path: the Data Dispatcher)."""
        return _step_metrics(ray.get([a.rl_step_received.remote() for a in self.actors]))

    def rl_step(self, records: list[dict[str, Any]], advantages: Sequence[float]) -> dict[str, float]:
        """The RL step on records the caller holds, split by tokens over the DP groups (benchmarks, tests)."""
        return _step_metrics(ray.get([a.rl_step.remote([records[i] for i in idx], [float(advantages[i]) for i in idx])
                                      for a, idx in zip(self.actors, self._shares(records))]))

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None:
        """Apply a stage layout's micro-batch (and activation checkpointing) on every rank."""
        ray.get([a.set_layout.remote(stage, micro_batch, checkpointing) for a in self.actors])

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False) -> dict[str, float]:
        """Time and peak memory of one micro-batch on the first TP group (DP groups do the same work); the
        slowest rank and the highest peak count."""
        results = ray.get([a.profile.remote(stage, micro_batch, context, checkpointing) for a in self._lead])
        seconds = max(r["seconds"] for r in results)
        peak = max(r["peak_bytes"] for r in results)
        if any(r.get("out_of_memory") for r in results):
            # One rank out of device memory is the layout out of memory.
            return {"seconds": seconds, "tokens_per_s": 0.0, "out_of_memory": 1.0, "peak_bytes": peak}
        return {"seconds": seconds, "tokens_per_s": micro_batch * context / max(seconds, 1e-9), "peak_bytes": peak}

    def sft_step(self, records: list[dict[str, Any]], lr: float) -> dict[str, float]:
        return ray.get([a.sft_step.remote([records[i] for i in idx], lr)
                        for a, idx in zip(self.actors, self._shares(records))])[0]

    def reset_optimizer(self) -> None:
        ray.get([a.reset_optimizer.remote() for a in self.actors])

    def reset_reference(self) -> None:
        ray.get([a.reset_reference.remote() for a in self.actors])

    def weights(self) -> list[ray.ObjectRef]:
        return ray.get([a.weights.remote(publish=i == 0) for i, a in enumerate(self._lead)])[0]

    def save(self, path: str, extra: dict[str, Any]) -> str:
        return ray.get([a.save.remote(path, extra, write=i == 0) for i, a in enumerate(self._lead)])[0]

    def load_optimizer(self, checkpoint: str) -> None:
        ray.get([a.load_optimizer.remote(checkpoint) for a in self.actors])

    def memory(self) -> list[dict[str, Any]]:
        return ray.get([a.memory.remote() for a in self.actors])

    def relayout(self, tp: int, fsdp: bool = False) -> float:
        """Switch every rank to TP degree ``tp`` (DP = workers / tp), FSDP-sharded over the DP ranks or not;
        weights and optimizer state move in memory between the ranks. Returns the seconds the switch took
        (slowest rank)."""
        _check_split(len(self.actors), tp, fsdp)
        seconds = max(ray.get([a.relayout.remote(tp, fsdp) for a in self.actors]))
        self.tp, self.dp = tp, len(self.actors) // tp
        self.fsdp = fsdp
        return seconds

    def local_parameters(self) -> list[int]:
        """Parameters each rank stores."""
        return ray.get([a.local_parameters.remote() for a in self.actors])

    def close(self) -> None:
        close_actors(self.actors)
        self.gang.release()
