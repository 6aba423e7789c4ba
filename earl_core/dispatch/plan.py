"""Transfer plans: which worker sends which sample to which rank, by which route, for two parallel layouts.

A stage's workers form ``dp`` data-parallel groups of ``tp`` tensor-parallel ranks (rank = dp_index * tp + tp_index,
as the trainer's device mesh numbers them). Every rank of a source group holds the group's samples (they are
replicas); every rank of a destination group needs all of that group's samples. The plan

- assigns samples to destination groups balanced by tokens (longest first onto the lightest group), preferring a
  group on a node that already holds the sample while that group stays within the mean plus half the longest sample;
- picks one sending replica per sample and destination node (a replica on that node when there is one, so the
  bytes never leave the node; otherwise the replica that has sent least, spreading the load over source links);
- gives each destination rank its route: ``local`` (sender on its node), ``network`` (one crossing per destination
  node) or ``peer`` (a rank of its own TP group on its node got it over the network; it reads that copy).

Bound (checked by the property tests): no destination group gets more than ``mean + max_length`` tokens, where
``mean`` is the total over the groups' count. Each destination rank receives its samples in ascending sample id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Route = Literal["local", "network", "peer"]


@dataclass(frozen=True)
class GroupLayout:
    """``dp`` data-parallel groups of ``tp`` ranks and the node each rank runs on (index = dp_index * tp + tp_index)."""

    dp: int
    tp: int
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.dp < 1 or self.tp < 1:
            raise ValueError(f"a layout needs dp >= 1 and tp >= 1, got dp={self.dp} tp={self.tp}")
        if len(self.nodes) != self.dp * self.tp:
            raise ValueError(f"{self.dp} x {self.tp} ranks need {self.dp * self.tp} node names, got {len(self.nodes)}")

    @classmethod
    def on_one_node(cls, dp: int, tp: int, node: str = "local") -> GroupLayout:
        return cls(dp, tp, (node,) * (dp * tp))

    @property
    def ranks(self) -> int:
        return self.dp * self.tp

    def group_ranks(self, group: int) -> list[int]:
        """Global ranks of data-parallel group ``group``."""
        return list(range(group * self.tp, (group + 1) * self.tp))

    def group_nodes(self, group: int) -> set[str]:
        return {self.nodes[r] for r in self.group_ranks(group)}


@dataclass(frozen=True)
class Sample:
    """One sample (a finished game) as the driver knows it: metadata only."""

    id: int
    tokens: int
    source: int
    """Data-parallel group of the source layout that holds it."""


@dataclass(frozen=True)
class Transfer:
    """One sample reaching one destination rank."""

    sample: int
    sender: int
    """Global rank in the source layout whose copy is read."""
    receiver: int
    """Global rank in the destination layout."""
    route: Route
    via: int | None = None
    """For ``peer``: the destination rank whose copy this rank reads."""


@dataclass(frozen=True)
class ReceiveSchedule:
    """One destination rank's part of a plan carried by point-to-point messages (the collective transport)."""

    senders: list[int]
    """Source ranks that send this rank one shipment each (its local and network routes), ascending."""
    forward: dict[int, list[int]]
    """Peer rank -> the senders whose shipments this rank passes on to it (as one shipment)."""
    vias: list[int]
    """Ranks of its own TP group that pass it one shipment each (its peer routes), ascending."""


@dataclass
class TransferPlan:
    """The whole plan of one dispatch: assignment, transfers, and what each rank expects."""

    source: GroupLayout
    destination: GroupLayout
    assignment: list[list[int]]
    """Sample ids per destination data-parallel group, ascending: the order every rank of the group expects."""
    transfers: list[Transfer]
    tokens: dict[int, int] = field(default_factory=dict)
    """Tokens per sample id (sizes the link accounting)."""

    def expected(self, rank: int) -> list[int]:
        """Sample ids destination ``rank`` must receive, in the order it uses them."""
        return self.assignment[rank // self.destination.tp]

    def group_tokens(self) -> list[int]:
        return [sum(self.tokens[s] for s in ids) for ids in self.assignment]

    def sends(self, sender: int) -> dict[int, list[int]]:
        """What source rank ``sender`` ships: sample ids per receiving destination rank (network and local routes;
        peer routes read a copy already on their node)."""
        out: dict[int, list[int]] = defaultdict(list)
        for t in self.transfers:
            if t.sender == sender and t.route != "peer":
                out[t.receiver].append(t.sample)
        return {r: sorted(ids) for r, ids in sorted(out.items())}

    def receive_schedule(self, rank: int) -> ReceiveSchedule:
        """How destination ``rank`` gets its samples over messages: one shipment from each sender (what
        ``sends(sender)[rank]`` names), then it forwards to each peer it relays for, and takes one shipment from
        each rank it reads through. A relaying rank is the first of its group on its node, and every sample its
        peers read through it came from the same senders, so a forward is exactly what those senders sent it."""
        senders = sorted({t.sender for t in self.transfers if t.receiver == rank and t.route != "peer"})
        forward: dict[int, set[int]] = defaultdict(set)
        for t in self.transfers:
            if t.route == "peer" and t.via == rank:
                forward[t.receiver].add(t.sender)
        vias = sorted({t.via for t in self.transfers if t.receiver == rank and t.route == "peer"})  # type: ignore[misc]
        return ReceiveSchedule(senders, {p: sorted(s) for p, s in sorted(forward.items())}, vias)

    def link_tokens(self) -> dict[str, tuple[int, int]]:
        """(tokens out, tokens in) per node over the network: what the node's link carries under this plan."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for t in self.transfers:
            if t.route == "network":
                n = self.tokens[t.sample]
                out[self.source.nodes[t.sender]][0] += n
                out[self.destination.nodes[t.receiver]][1] += n
        return {node: (v[0], v[1]) for node, v in sorted(out.items())}


def balance_bound(lengths: Sequence[int], groups: int) -> float:
    """The most tokens a destination group may get: the mean share plus the longest sample."""
    return sum(lengths) / groups + max(lengths, default=0)


def plan_transfers(samples: Sequence[Sample], source: GroupLayout, destination: GroupLayout, *,
                   locality: bool = True) -> TransferPlan:
    """The transfer plan of ``samples`` from the ``source`` layout to the ``destination`` layout (see module doc)."""
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        raise ValueError("sample ids must be unique")
    bad = [s.id for s in samples if not 0 <= s.source < source.dp]
    if bad:
        raise ValueError(f"samples {bad[:5]} name a source group outside 0..{source.dp - 1}")
    assignment = _assign(samples, source, destination, locality=locality)
    by_id = {s.id: s for s in samples}
    sent: dict[int, int] = defaultdict(int)  # tokens each source rank has sent over the network
    transfers: list[Transfer] = []
    for group, members in enumerate(assignment):
        ranks = destination.group_ranks(group)
        for sid in members:
            sample = by_id[sid]
            replicas = source.group_ranks(sample.source)
            for node in sorted({destination.nodes[r] for r in ranks}):
                on_node = [r for r in ranks if destination.nodes[r] == node]
                near = [r for r in replicas if source.nodes[r] == node]
                if near:
                    transfers += [Transfer(sid, near[0], r, "local") for r in on_node]
                    continue
                sender = min(replicas, key=lambda r: (sent[r], r))
                sent[sender] += sample.tokens
                first = on_node[0]
                transfers.append(Transfer(sid, sender, first, "network"))
                transfers += [Transfer(sid, sender, r, "peer", via=first) for r in on_node[1:]]
    return TransferPlan(source, destination, [sorted(m) for m in assignment], transfers,
                        {s.id: s.tokens for s in samples})


def _assign(samples: Sequence[Sample], source: GroupLayout, destination: GroupLayout, *,
            locality: bool) -> list[list[int]]:
    """Sample ids per destination group: longest first onto the lightest group, or onto a group sharing a node with
    the sample's source when that group stays within the mean plus half the longest sample.

    Why the bound holds: a sample placed on the lightest group lands on a load at most the mean of what is placed so
    far, so that group ends at most ``mean + length``; a local placement is capped below that."""
    groups = destination.dp
    loads = [0] * groups
    out: list[list[int]] = [[] for _ in range(groups)]
    lengths = [s.tokens for s in samples]
    cap = sum(lengths) / groups + max(lengths, default=0) / 2
    near: dict[int, list[int]] = {}
    for h in range(source.dp):
        nodes = source.group_nodes(h)
        near[h] = [g for g in range(groups) if destination.group_nodes(g) & nodes]
    for s in sorted(samples, key=lambda s: (-s.tokens, s.id)):
        lightest = min(range(groups), key=lambda g: (loads[g], g))
        choice = lightest
        if locality:
            fits = [g for g in near[s.source] if loads[g] + s.tokens <= cap]
            if fits:
                choice = min(fits, key=lambda g: (loads[g], g))
        out[choice].append(s.id)
        loads[choice] += s.tokens
    return out
