"""Fair share between teams: usage over a sliding window, the queue order it feeds, and Jain's fairness index."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from webapp.scheduling.resources import Resources, SchedulingError
from webapp.scheduling.workload import RunRequest, priority_rank


@dataclass(frozen=True, kw_only=True)
class UsageInterval:
    """A team held ``resources`` from ``start`` until ``end`` (None: still running)."""

    team: str
    start: float
    end: float | None
    resources: Resources


def dominant_share(resources: Resources, cluster_total: Resources) -> float:
    """The larger of the GPU and CPU share of the cluster (dominant-resource style).

    A GPU run's share is then (usually) its GPU fraction and a CPU-only run's its CPU fraction, so GPU-seconds and
    CPU-seconds become comparable. Memory is left out: it is rarely what a team competes for here.
    """
    shares = [resources.gpus / cluster_total.gpus if cluster_total.gpus else 0.0,
              resources.cpus / cluster_total.cpus if cluster_total.cpus else 0.0]
    return max(shares)


def usage_in_window(intervals: Iterable[UsageInterval], now: float, *, window_s: float,
                    cluster_total: Resources) -> dict[str, float]:
    """Per team, the dominant-share-seconds used within ``[now - window_s, now]``.

    Each interval is clipped to the window (a still-running one ends at ``now``) and weighted by its dominant share,
    so one full-cluster hour counts 3600 whatever the resource. Every team named in ``intervals`` gets an entry.
    """
    if not window_s > 0:
        raise SchedulingError("window_s", f"must be positive, got {window_s!r}", allowed="seconds > 0")
    since = now - window_s
    usage: dict[str, float] = {}
    for one in intervals:
        end = now if one.end is None else min(one.end, now)
        seconds = max(0.0, end - max(one.start, since))
        usage[one.team] = usage.get(one.team, 0.0) + seconds * dominant_share(one.resources, cluster_total)
    return usage


def queue_key(run: RunRequest, usage: Mapping[str, float]) -> tuple[int, float, float, int]:
    """Sort key of the queue: higher priority class, then the team that used less, then older, then lower id."""
    return (-priority_rank(run.priority), usage.get(run.team, 0.0), run.submitted_at, run.run_id)


def queue_order(queued: Iterable[RunRequest], usage: Mapping[str, float]) -> list[RunRequest]:
    """The queue as the policy walks it; ``usage`` is per team (``usage_in_window``), absent teams used nothing."""
    return sorted(queued, key=lambda run: queue_key(run, usage))


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one value takes everything.

    All zeros count as perfectly fair (1.0); an empty sequence or a negative value is an error.
    """
    if not values:
        raise SchedulingError("values", "needs at least one value", allowed="one or more numbers >= 0")
    if any(v < 0 for v in values):
        raise SchedulingError("values", f"must not be negative, got {min(values)!r}", allowed="numbers >= 0")
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)
