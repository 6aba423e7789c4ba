"""Runs as the scheduler sees them: priority classes, team quotas, queued and running runs, refusal at submit time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from webapp.scheduling.resources import DIMENSIONS, Node, Placement, Resources, SchedulingError, amount, place, total_of

PRIORITIES = ("low", "normal", "high", "urgent")
"""Priority classes, lowest first."""
ADMIN_ONLY_PRIORITY = "urgent"
PREEMPTING_PRIORITIES = ("high", "urgent")
"""A head run of these classes may stop preemptible runs of a strictly lower class."""


def priority_rank(priority: str) -> int:
    """0 for low ... 3 for urgent."""
    return PRIORITIES.index(priority)


def check_priority(priority: str, is_team_admin: bool) -> str:
    """The priority when the submitter may use it; urgent is for team admins."""
    allowed = PRIORITIES if is_team_admin else tuple(p for p in PRIORITIES if p != ADMIN_ONLY_PRIORITY)
    if priority not in PRIORITIES:
        raise SchedulingError("priority", f"unknown priority {str(priority)[:40]!r}", allowed=allowed)
    if priority not in allowed:
        raise SchedulingError("priority", f"{priority} is for team admins", allowed=allowed)
    return priority


def _check_limit(name: str, value: float | None, *, whole: bool) -> None:
    if value is None:
        return
    kind = "whole number" if whole else "number"
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or not value >= 0:
        raise SchedulingError(name, f"must be a non-negative {kind} or None (unlimited), got {value!r}",
                              allowed=f"{kind}s >= 0, or None")


@dataclass(frozen=True, kw_only=True)
class TeamQuota:
    """How much a team may use at once and how many of its runs may wait; None means unlimited."""

    max_gpus: int | None = None
    max_cpus: float | None = None
    max_queued: int | None = None

    def __post_init__(self) -> None:
        _check_limit("max_gpus", self.max_gpus, whole=True)
        _check_limit("max_cpus", self.max_cpus, whole=False)
        _check_limit("max_queued", self.max_queued, whole=True)

    def excess(self, using: Resources, asks: Resources) -> tuple[str, float] | None:
        """The first dimension (``gpus``/``cpus``) that ``asks`` needs and ``using + asks`` would take over its limit,
        with that limit; else None. A dimension ``asks`` does not use is not its to exceed (a CPU-only run is not held
        back because the team's GPUs are spoken for)."""
        for dimension, limit in (("gpus", self.max_gpus), ("cpus", self.max_cpus)):
            asked = getattr(asks, dimension)
            if limit is not None and asked > 0 and getattr(using, dimension) + asked > limit:
                return dimension, limit
        return None


UNLIMITED = TeamQuota()


def _check_bundles(bundles: Sequence[Resources]) -> tuple[Resources, ...]:
    if not bundles:
        raise SchedulingError("bundles", "a run needs at least one bundle", allowed="one Resources per worker")
    return tuple(bundles)


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """A queued run: a gang of bundles (one per worker, like Ray placement-group bundles) that starts whole."""

    run_id: int
    team: str
    bundles: tuple[Resources, ...]
    submitted_at: float
    priority: str = "normal"
    expected_duration_s: float | None = None
    """None when unknown; such runs are never backfilled past a reservation."""
    preemptible: bool = False
    """Opt-in: once running, it may be stopped (checkpointed and requeued) for a higher-priority head."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bundles", _check_bundles(self.bundles))
        if self.priority not in PRIORITIES:
            raise SchedulingError("priority", f"unknown priority {self.priority!r}", allowed=PRIORITIES)
        if self.expected_duration_s is not None and not self.expected_duration_s > 0:
            raise SchedulingError("expected_duration_s", f"must be positive, got {self.expected_duration_s!r}",
                                  allowed="seconds > 0, or None when unknown")

    @property
    def total(self) -> Resources:
        return total_of(self.bundles)


@dataclass(frozen=True, kw_only=True)
class RunningRun:
    """A run holding its bundles on the nodes of ``placement`` since ``started_at``."""

    run_id: int
    team: str
    bundles: tuple[Resources, ...]
    placement: Placement
    started_at: float
    expected_end: float | None
    """None when unknown: the policy then never counts on these resources coming back."""
    priority: str = "normal"
    preemptible: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "bundles", _check_bundles(self.bundles))
        object.__setattr__(self, "placement", tuple(self.placement))
        if len(self.placement) != len(self.bundles):
            raise SchedulingError("placement", f"run {self.run_id} has {len(self.bundles)} bundles but "
                                  f"{len(self.placement)} placed", allowed="one node name per bundle")
        if self.priority not in PRIORITIES:
            raise SchedulingError("priority", f"unknown priority {self.priority!r}", allowed=PRIORITIES)

    @property
    def total(self) -> Resources:
        return total_of(self.bundles)


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """Why a run is refused at submit time instead of waiting forever."""

    code: str
    """``bundle_too_big``, ``cluster_too_small``, ``team_quota`` or ``queue_full``."""
    field: str
    """The request field at fault: ``bundles[2].gpus``, ``gpus``, ``bundles``, ``queued``."""
    limit: float
    message: str

    def as_error(self) -> SchedulingError:
        return SchedulingError(self.field, self.message, allowed=f"at most {self.limit:g}")


def refusal(request: RunRequest, cluster_nodes: Sequence[Node], *, quota: TeamQuota | None,
            queued_count: int) -> Refusal | None:
    """The reason this run could never start (or may not queue) on this cluster for this team, else None.

    ``queued_count`` is how many runs of the team already wait. Checked in order: each bundle against the largest
    node, the total against the cluster, the whole gang on the idle cluster, the team's quota, its queue length.
    """
    return (_too_big_bundle(request, cluster_nodes) or _too_big_total(request, cluster_nodes)
            or _over_quota(request, quota or UNLIMITED) or _queue_full(request, quota or UNLIMITED, queued_count))


def _too_big_bundle(request: RunRequest, nodes: Sequence[Node]) -> Refusal | None:
    for i, bundle in enumerate(request.bundles):
        for dim in DIMENSIONS:
            largest = max((getattr(n.total, dim) for n in nodes), default=0)
            if getattr(bundle, dim) > largest:
                return Refusal(code="bundle_too_big", field=f"bundles[{i}].{dim}", limit=largest,
                               message=f"bundle {i} asks {amount(dim, getattr(bundle, dim))}; the largest node has "
                                       f"{amount(dim, largest) if dim == 'memory_bytes' else f'{largest:g}'}")
        if not any(bundle.fits_in(n.total) for n in nodes):
            return Refusal(code="bundle_too_big", field=f"bundles[{i}]", limit=0,
                           message=f"bundle {i} asks {bundle.describe()} together; no single node has all of that")
    return None


def _too_big_total(request: RunRequest, nodes: Sequence[Node]) -> Refusal | None:
    cluster = total_of(n.total for n in nodes)
    asks = request.total
    for dim in DIMENSIONS:
        if getattr(asks, dim) > getattr(cluster, dim):
            return Refusal(code="cluster_too_small", field=dim, limit=getattr(cluster, dim),
                           message=f"asks {amount(dim, getattr(asks, dim))} in all; the whole cluster has "
                                   f"{amount(dim, getattr(cluster, dim))}")
    # Placement packs first-fit; a gang it cannot place on the idle cluster would never start, so refuse it now.
    if place(request.bundles, {n.name: n.total for n in nodes}) is None:
        return Refusal(code="cluster_too_small", field="bundles", limit=len(nodes),
                       message=f"its {len(request.bundles)} bundles cannot all be placed at once even on the idle "
                               f"cluster of {len(nodes)} nodes")
    return None


def _over_quota(request: RunRequest, quota: TeamQuota) -> Refusal | None:
    excess = quota.excess(Resources.nothing(), request.total)
    if excess is None:
        return None
    dim, limit = excess
    return Refusal(code="team_quota", field=dim, limit=limit,
                   message=f"asks {amount(dim, getattr(request.total, dim))}; team {request.team!r} may use at most "
                           f"{limit:g} at once")


def _queue_full(request: RunRequest, quota: TeamQuota, queued_count: int) -> Refusal | None:
    if quota.max_queued is None or queued_count < quota.max_queued:
        return None
    return Refusal(code="queue_full", field="queued", limit=quota.max_queued,
                   message=f"team {request.team!r} already has {queued_count} queued runs; at most "
                           f"{quota.max_queued} may wait at once")


def expected_end(*, started_at: float, now: float, iterations_done: int, iterations_at_start: int,
                 total_iterations: int | None, expected_duration_s: float | None) -> float | None:
    """When a running run is expected to end: its measured pace once it has one, else the submitter's estimate.

    Pace counts only iterations done since this admission (a resumed run's earlier ones ran on another
    allocation). The estimate is scaled to the part of the run still to do when it resumed. None when neither is
    known; a run whose estimate has passed is taken to end now.
    """
    total = total_iterations or 0
    done_here = iterations_done - iterations_at_start
    if done_here > 0 and total > iterations_done and now > started_at:
        per_iteration = (now - started_at) / done_here
        return now + per_iteration * (total - iterations_done)
    if done_here > 0 and total and iterations_done >= total:
        return now  # the last iteration is done; it is writing its final checkpoint
    if expected_duration_s is None:
        return None
    left = 1.0 if not total else max(0.0, 1.0 - iterations_at_start / total)
    return max(now, started_at + expected_duration_s * left)
