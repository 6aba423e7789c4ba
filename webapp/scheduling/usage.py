"""Team usage over time from the allocations: what the cluster page charts and what fair share compares."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from webapp.scheduling.fairness import UsageInterval, usage_in_window
from webapp.scheduling.models import Allocation
from webapp.scheduling.resources import Resources


@dataclass(frozen=True)
class Held:
    """One allocation as an interval: a team held ``gpus`` and ``cpus`` from ``start`` to ``end`` (None: now)."""

    team: str
    start: float
    end: float | None
    gpus: int
    cpus: float


def held_series(intervals: Iterable[Held], *, since: float, until: float,
                buckets: int) -> dict[str, dict[str, list[float]]]:
    """Per team, the mean GPUs and CPUs held in each of ``buckets`` equal slices of ``[since, until]``.

    A mean, not a sample: a run that held 4 GPUs for half a slice counts 2 there, so short runs do not vanish
    between samples and the area under a team's curve is its GPU-seconds.
    """
    step = (until - since) / buckets
    out: dict[str, dict[str, list[float]]] = {}
    for one in intervals:
        series = out.setdefault(one.team, {"gpus": [0.0] * buckets, "cpus": [0.0] * buckets})
        start, end = max(one.start, since), min(until if one.end is None else one.end, until)
        if end <= start:
            continue
        first, last = int((start - since) // step), min(buckets - 1, int((end - since) // step))
        for i in range(first, last + 1):
            lo, hi = since + i * step, since + (i + 1) * step
            overlap = max(0.0, min(hi, end) - max(lo, start)) / step
            series["gpus"][i] += one.gpus * overlap
            series["cpus"][i] += one.cpus * overlap
    for series in out.values():
        for key in series:
            series[key] = [round(v, 3) for v in series[key]]
    return out


def team_usage(now: datetime, *, window_s: float, buckets: int = 48,
               cluster_total: Resources | None = None) -> dict[str, Any]:
    """The cluster page's usage chart: per team (by name) GPUs and CPUs held over the window, and the fair-share
    usage the scheduler orders teams by (dominant-share hours; only when the cluster's size is known)."""
    since = now - timedelta(seconds=window_s)
    rows = (Allocation.objects.filter(started_at__lte=now).filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
            .select_related("team"))
    held = [Held(team=a.team.name, start=a.started_at.timestamp(),
                 end=None if a.ended_at is None else a.ended_at.timestamp(), gpus=a.gpus, cpus=a.cpus) for a in rows]
    step = window_s / buckets
    times = [(since + timedelta(seconds=step * (i + 0.5))).isoformat().replace("+00:00", "Z") for i in range(buckets)]
    usage: dict[str, Any] = {"since": since.isoformat().replace("+00:00", "Z"), "window_s": window_s, "times": times,
                             "teams": held_series(held, since=since.timestamp(), until=now.timestamp(),
                                                  buckets=buckets)}
    if cluster_total is not None and (cluster_total.gpus or cluster_total.cpus):
        intervals = [UsageInterval(team=a.team.name, start=a.started_at.timestamp(),
                                   end=None if a.ended_at is None else a.ended_at.timestamp(),
                                   resources=Resources(cpus=a.cpus, gpus=a.gpus)) for a in rows]
        share = usage_in_window(intervals, now.timestamp(), window_s=window_s, cluster_total=cluster_total)
        usage["fair_share_hours"] = {team: round(seconds / 3600, 3) for team, seconds in share.items()}
    return usage
