"""The Data Dispatcher on Ray: move the played games from the rollout engines to the trainer ranks and train.

Two modes on the same transfer plan (earl_core.dispatch.plan), so they feed the trainer identical inputs:

- ``layout_aware`` (default): the bytes go from each engine straight to the ranks the plan names, over one of two
  transports: ``collective`` (default; the engines and the ranks form a gloo dispatch group, earl_core.dispatch.wire,
  and send/receive point-to-point messages) or ``object_store`` (each engine puts one Shipment per receiving rank
  into its own object store and the driver hands the references to the ranks, which fetch from the engine's node).
  Advantages are computed on the ranks from per-group reward scalars the engines reported. The driver sees metadata
  only.
- ``centralized``: what single-controller frameworks do: the driver fetches every engine's games, computes the
  advantages, cuts one Shipment per rank and puts it into its own store for the ranks to fetch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import ray

from earl_core.config import AlgoConfig
from earl_core.dispatch.group_stats import (baseline_advantages, batch_mean, merge, summarise, table_from_wire,
                                            table_to_wire)
from earl_core.dispatch.plan import GroupLayout, Sample, TransferPlan, plan_transfers
from earl_core.dispatch.shipment import Shipment
from earl_core.ray_exec.groups import RolloutGroup, TrainerGroup
from earl_core.rl.advantages import RunningBaseline, grpo_advantages

DRIVER = -1
"""Destination key of the shipments the centralized mode gathers at the driver."""

LOCAL_FIELDS = ("old_logprobs", "ref_logprobs")
"""Fields the trainer ranks compute themselves (experience preparation runs on them): they move zero bytes."""


@dataclass
class DispatchReport:
    """What one iteration's dispatch moved and how long it took (the ``dispatch`` event's content)."""

    mode: str
    seconds: float
    bytes_moved: int
    bytes_via_driver: int
    fields: dict[str, int] = field(default_factory=dict)
    network_tokens: int = 0
    """Tokens the plan sends across nodes (0 when every sample's source and destination share a node)."""
    advantages: dict[int, float] = field(default_factory=dict)
    """Advantage each sample was trained with, by sample id (what both modes must agree on)."""


def _add(total: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, 0) + v


class Dispatcher:
    """Plans and runs one iteration's dispatch in the configured mode."""

    def __init__(self, mode: str, algo: AlgoConfig, transport: str = "collective") -> None:
        if mode not in ("layout_aware", "centralized"):
            raise ValueError(f"dispatch mode must be layout_aware or centralized, not {mode!r}")
        if transport not in ("collective", "object_store"):
            raise ValueError(f"dispatch transport must be collective or object_store, not {transport!r}")
        self.mode = mode
        self.transport = transport
        self.algo = algo
        self._members: tuple[int, int, int] | None = None
        """(rollout group, its engine generation, trainer group) the dispatch group was built for."""

    def plan(self, records: list[dict[str, Any]], rollout: RolloutGroup, trainer: TrainerGroup) -> TransferPlan:
        samples = [Sample(r["index"], r["tokens"], r["source"]) for r in records]
        source = GroupLayout(rollout.engines, 1, tuple(rollout.nodes()))
        destination = GroupLayout(trainer.dp, trainer.tp, tuple(trainer.nodes()))
        return plan_transfers(samples, source, destination)

    def dispatch(self, played: dict[str, Any], rollout: RolloutGroup, trainer: TrainerGroup,
                 baseline: RunningBaseline) -> DispatchReport:
        """Move the games of ``played`` (RolloutGroup.play's answer) to the trainer ranks, ready for
        TrainerGroup.rl_step_received(). The engines keep the games until RolloutGroup.release()."""
        start = time.perf_counter()
        plan = self.plan(played["records"], rollout, trainer)
        if self.mode == "layout_aware" and self.transport == "collective":
            report = self._collective(plan, played, rollout, trainer, baseline)
        elif self.mode == "layout_aware":
            report = self._layout_aware(plan, played, rollout, trainer, baseline)
        else:
            report = self._centralized(plan, played, rollout, trainer, baseline)
        report.seconds = time.perf_counter() - start
        report.network_tokens = sum(out for out, _ in plan.link_tokens().values())
        for name in LOCAL_FIELDS:
            report.fields.setdefault(name, 0)
        return report

    def _advantage_spec(self, tables: list[dict[int, Any]], baseline: RunningBaseline) -> dict[str, Any]:
        """What the ranks need to compute advantages: the merged per-group scalars, or the baseline value."""
        merged = merge(table_from_wire(t) for t in tables)
        if self.algo.name == "grpo":
            return {"kind": "grpo", "table": table_to_wire(merged), "normalize_std": self.algo.normalize_std}
        return {"kind": "baseline", "baseline": baseline.take(batch_mean(merged))}

    def _layout_aware(self, plan: TransferPlan, played: dict[str, Any], rollout: RolloutGroup,
                      trainer: TrainerGroup, baseline: RunningBaseline) -> DispatchReport:
        ranks = plan.destination.ranks
        sent = rollout.ship([plan.sends(engine) for engine in range(plan.source.ranks)])
        refs: list[list[ray.ObjectRef]] = [[] for _ in range(ranks)]
        for t in plan.transfers:
            # A peer route reads the copy its TP peer on the same node fetched (Ray pulls an object to a node once).
            holder = t.via if t.route == "peer" else t.receiver
            ref = sent[t.sender][holder]["ref"][0]
            if ref not in refs[t.receiver]:
                refs[t.receiver].append(ref)
        spec = self._advantage_spec(played["groups"], baseline)
        answers = trainer.receive(refs, [plan.expected(r) for r in range(ranks)], spec)
        report = DispatchReport(self.mode, 0.0, 0, 0)
        fields: dict[str, int] = {}
        for engine_sent in sent:
            for shipped in engine_sent.values():
                _add(fields, shipped["bytes"])
        report.fields = fields
        report.bytes_moved = sum(fields.values())
        report.advantages = _advantages(plan, answers)
        return report

    def _join(self, rollout: RolloutGroup, trainer: TrainerGroup) -> None:
        """(Re)build the dispatch group when its members changed: engine ``i`` is rank i, trainer rank r is
        engines + r; trainer rank 0 hosts the rendezvous store."""
        members = (id(rollout), rollout.generation, id(trainer))
        if members == self._members:
            return
        world = rollout.engines + len(trainer.actors)
        store = ray.get(trainer.actors[0].host_dispatch_store.remote(world))
        ray.get([a.join_dispatch.remote(store, i, world) for i, a in enumerate(rollout.actors)]
                + [a.join_dispatch.remote(store, rollout.engines + r, world) for r, a in enumerate(trainer.actors)])
        self._members = members

    def _collective(self, plan: TransferPlan, played: dict[str, Any], rollout: RolloutGroup,
                    trainer: TrainerGroup, baseline: RunningBaseline) -> DispatchReport:
        self._join(rollout, trainer)
        offset = rollout.engines  # dispatch-group rank of trainer rank r
        spec = self._advantage_spec(played["groups"], baseline)
        sends = [plan.sends(i) for i in range(rollout.engines)]
        sending = [a.send_games.remote({offset + r: ids for r, ids in part.items()})
                   for a, part in zip(rollout.actors, sends) if part]
        receiving = [a.receive_messages.remote(plan.receive_schedule(r), offset, plan.expected(r), spec)
                     for r, a in enumerate(trainer.actors)]
        done = _gather(sending + receiving)
        sent, answers = done[:len(sending)], done[len(sending):]
        fields: dict[str, int] = {}
        for engine_sent in sent:
            for shipped in engine_sent.values():
                _add(fields, shipped)
        report = DispatchReport(self.mode, 0.0, sum(fields.values()), 0, fields)
        report.advantages = _advantages(plan, answers)
        return report

    def _centralized(self, plan: TransferPlan, played: dict[str, Any], rollout: RolloutGroup,
                     trainer: TrainerGroup, baseline: RunningBaseline) -> DispatchReport:
        held = [sorted(r["index"] for r in played["records"] if r["source"] == e) for e in range(rollout.engines)]
        sent = rollout.ship([{DRIVER: ids} if ids else {} for ids in held])
        gathered: list[Shipment] = ray.get([s[DRIVER]["ref"][0] for s in sent if DRIVER in s])
        fields: dict[str, int] = {}
        for shipment in gathered:
            _add(fields, shipment.field_bytes())
        whole = Shipment.concat(gathered)
        rewards, groups = whole.rewards.tolist(), whole.groups.tolist()
        if self.algo.name == "grpo":
            whole.advantages = grpo_advantages(rewards, groups, normalize_std=self.algo.normalize_std)
        else:
            whole.advantages = baseline_advantages(rewards, baseline.take(batch_mean(summarise(rewards, groups))))
        refs: list[list[ray.ObjectRef]] = []
        for rank in range(plan.destination.ranks):
            shipment = whole.subset(plan.expected(rank))
            _add(fields, shipment.field_bytes())
            refs.append([ray.put(shipment)])
        answers = trainer.receive(refs, [plan.expected(r) for r in range(plan.destination.ranks)], {"kind": "given"})
        moved = sum(fields.values())
        report = DispatchReport(self.mode, 0.0, moved, moved, fields)
        report.advantages = _advantages(plan, answers)
        return report


def _gather(refs: list[ray.ObjectRef]) -> list[Any]:
    """Every result, but the first failure raises as soon as it happens: a rank that refused its samples must not
    leave the driver waiting on senders blocked until the group's timeout."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)
    return ray.get(refs)


def _advantages(plan: TransferPlan, answers: list[dict[str, Any]]) -> dict[int, float]:
    out: dict[int, float] = {}
    seen: dict[int, set[float]] = defaultdict(set)
    for rank, answer in enumerate(answers):
        for sid, value in zip(plan.expected(rank), answer["advantages"]):
            out[sid] = value
            seen[sid].add(value)
    assert all(len(v) == 1 for v in seen.values()), "ranks of one TP group disagree on an advantage"
    return out
