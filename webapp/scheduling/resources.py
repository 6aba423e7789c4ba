"""Resources, nodes and gang placement: where a run's bundles go on a cluster snapshot (Ray's PACK, first fit)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from earl_core.errors import ConfigError

# Ray counts fractional CPUs in units of 1/10000; rounding to the same grain keeps add/subtract exact, so a run
# released onto a node gives back exactly what it took (no 1e-16 leftovers that make a bundle "not fit").
CPU_DECIMALS = 4
GIB = 1024**3

Placement = tuple[str, ...]
"""The node of each bundle of a gang: ``placement[i]`` holds bundle ``i``."""


class SchedulingError(ConfigError):
    """A scheduling input (resources, node, quota, priority, run) holds a value outside what it allows."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    """An amount of cluster resources: one worker's bundle, a node's capacity, a team's usage."""

    cpus: float
    gpus: int
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("gpus", "memory_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SchedulingError(name, f"must be a whole number, got {value!r}", allowed="integers >= 0")
            if value < 0:
                raise SchedulingError(name, f"must not be negative, got {value}", allowed="integers >= 0")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, (int, float)) or not self.cpus >= 0:
            raise SchedulingError("cpus", f"must be a non-negative number, got {self.cpus!r}", allowed="numbers >= 0")
        object.__setattr__(self, "cpus", round(float(self.cpus), CPU_DECIMALS))

    @classmethod
    def nothing(cls) -> Resources:
        return cls(cpus=0.0, gpus=0, memory_bytes=0)

    def __add__(self, other: Resources) -> Resources:
        return Resources(cpus=self.cpus + other.cpus, gpus=self.gpus + other.gpus,
                         memory_bytes=self.memory_bytes + other.memory_bytes)

    def __sub__(self, other: Resources) -> Resources:
        if not other.fits_in(self):
            raise ValueError(f"cannot take {other.describe()} out of {self.describe()}")
        return Resources(cpus=self.cpus - other.cpus, gpus=self.gpus - other.gpus,
                         memory_bytes=self.memory_bytes - other.memory_bytes)

    def fits_in(self, other: Resources) -> bool:
        """Whether every dimension of this amount is at most the other's."""
        return self.cpus <= other.cpus and self.gpus <= other.gpus and self.memory_bytes <= other.memory_bytes

    def capped_by(self, other: Resources) -> Resources:
        """The part of this amount that the other also has (the smaller value in each dimension)."""
        return Resources(cpus=min(self.cpus, other.cpus), gpus=min(self.gpus, other.gpus),
                         memory_bytes=min(self.memory_bytes, other.memory_bytes))

    def describe(self) -> str:
        """``2 GPUs, 8 CPUs, 16 GiB memory`` (memory only when asked for)."""
        parts = [amount("gpus", self.gpus), amount("cpus", self.cpus)]
        if self.memory_bytes:
            parts.append(amount("memory_bytes", self.memory_bytes))
        return ", ".join(parts)


def amount(dimension: str, value: float) -> str:
    """One dimension in words: ``1 GPU``, ``8 CPUs``, ``16 GiB memory``."""
    if dimension == "memory_bytes":
        return f"{value / GIB:g} GiB memory"
    unit = {"gpus": "GPU", "cpus": "CPU"}[dimension]
    return f"{value:g} {unit}" + ("" if value == 1 else "s")


DIMENSIONS = ("gpus", "cpus", "memory_bytes")


def total_of(amounts: Iterable[Resources]) -> Resources:
    out = Resources.nothing()
    for one in amounts:
        out = out + one
    return out


@dataclass(frozen=True, kw_only=True)
class Node:
    """One machine of the cluster snapshot: what it has and what is free on it now."""

    name: str
    total: Resources
    free: Resources

    def __post_init__(self) -> None:
        if not self.free.fits_in(self.total):
            raise SchedulingError("free", f"node {self.name!r} has {self.free.describe()} free but only "
                                  f"{self.total.describe()} in all", allowed=f"at most {self.total.describe()}")

    @classmethod
    def idle(cls, name: str, total: Resources) -> Node:
        return cls(name=name, total=total, free=total)


def place_gang(bundles: Sequence[Resources], nodes: Sequence[Node]) -> Placement | None:
    """Where each bundle would go on the nodes' free resources, all at once, or None when the gang does not fit."""
    return place(bundles, {node.name: node.free for node in nodes})


def place(bundles: Sequence[Resources], free: Mapping[str, Resources]) -> Placement | None:
    """First-fit decreasing over ``free`` (node name -> free resources, in the snapshot's node order).

    Like Ray's PACK strategy, the largest bundles (by GPUs, then CPUs, then memory) go first and each lands on the
    first node with room, so a gang fills few nodes. A gang either places whole or not at all.
    """
    room = dict(free)
    where: dict[int, str] = {}
    largest_first = sorted(range(len(bundles)),
                           key=lambda i: (-bundles[i].gpus, -bundles[i].cpus, -bundles[i].memory_bytes, i))
    for i in largest_first:
        node = next((name for name, left in room.items() if bundles[i].fits_in(left)), None)
        if node is None:
            return None
        room[node] = room[node] - bundles[i]
        where[i] = node
    return tuple(where[i] for i in range(len(bundles)))


def occupy(free: Mapping[str, Resources], bundles: Sequence[Resources], placement: Placement) -> dict[str, Resources]:
    """Free resources once the bundles sit where ``placement`` puts them."""
    out = dict(free)
    for bundle, node in zip(bundles, placement, strict=True):
        out[node] = out[node] - bundle
    return out


def release(free: Mapping[str, Resources], bundles: Sequence[Resources], placement: Placement) -> dict[str, Resources]:
    """Free resources once a run's bundles are given back; bundles on nodes no longer in the snapshot are dropped."""
    out = dict(free)
    for bundle, node in zip(bundles, placement, strict=True):
        if node in out:
            out[node] = out[node] + bundle
    return out
