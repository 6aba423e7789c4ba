"""The admission pass: the queue and the scheduler's books read from the database, one decision by the policy,
written back under one lock, so passes in any web or worker process never admit a run twice nor over-commit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from webapp.cluster.ray_view import ray_nodes
from webapp.queue import enqueue_run
from webapp.runs.live import publish_cluster_change
from webapp.runs.models import Run
from webapp.scheduling.fairness import UsageInterval, usage_in_window
from webapp.scheduling.gang import requested_gang, resources_errors, sizing_config
from webapp.scheduling.models import AdmissionLock, Allocation, Quota
from webapp.scheduling.policy import Plan, SchedulerState, plan
from webapp.scheduling.resources import Node, Resources, SchedulingError, place, total_of
from webapp.scheduling.submission import cluster_nodes
from webapp.scheduling.workload import RunningRun, RunRequest, expected_end

log = logging.getLogger(__name__)

ASK_RAY: Any = object()
"""``nodes`` default: read the cluster from Ray's dashboard (before the pass takes its lock)."""
UNKNOWN_NODE = "unknown"
"""The stand-in node when the cluster cannot be read: only quotas and priorities then decide."""


@dataclass(frozen=True, kw_only=True)
class PassResult:
    """What one pass did."""

    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    waiting: int
    capacity_known: bool
    resent: tuple[int, ...] = ()
    """Admitted runs whose task went to the workers again (``RESEND_AFTER_S``)."""


def admission_pass(*, now: datetime | None = None, nodes: Sequence[Node] | None = ASK_RAY,
                   enqueue: Callable[[int], None] = enqueue_run, window_s: float | None = None) -> PassResult:
    """Decide which queued runs start now, which preemptible runs make room, and why the rest wait; write it.

    ``nodes`` are the cluster's nodes with their totals (what is free is the scheduler's own books: the open
    allocations); None when the cluster cannot be read: the last good read is used then, and only with none ever
    made do quotas and priorities alone admit (Ray queues what does not fit). Admitted runs that no worker
    claimed within ``RESEND_AFTER_S`` get their task again. Admitted runs get an allocation and are handed to
    ``enqueue`` once the pass commits; preempted runs are asked to checkpoint and requeue (their worker does it);
    waiting runs get their place, reason and estimated start in ``Run.queue``. ``now`` and ``enqueue`` are parameters so a simulated clock can
    drive the real pass (bench/scheduler_bench.py).
    """
    if nodes is ASK_RAY:
        nodes = cluster_nodes(ray_nodes(timeout_s=5.0))  # an HTTP call: before the lock, so no pass waits on it
    window = window_s or settings.EARL_FAIR_SHARE_WINDOW_S
    _ensure_lock_row()
    with transaction.atomic():
        # Passes take turns here: the UPDATE holds the row's lock until commit on PostgreSQL (and SQLite's
        # IMMEDIATE transactions serialize writers anyway); every read below sees what earlier passes committed.
        AdmissionLock.objects.filter(pk=1).update(passes=F("passes") + 1)
        now = now or timezone.now()  # read once the lock is held: a pass never stamps a time before the last one
        nodes = _remember_nodes(nodes, now)
        books = _Books.read(now, nodes, window)
        decision = plan(books.state, now.timestamp())
        books.write(decision)
        resent = _resend_unclaimed(now, exclude={a.run_id for a in decision.admit})
        # Only once the allocations are committed may a worker look for them; a rolled-back pass queues nothing.
        # One callback per run (robust: a broker error is logged and the others are still sent).
        for run_id in [a.run_id for a in decision.admit] + resent:
            transaction.on_commit(_sender(enqueue, run_id), robust=True)
        if decision.admit or decision.preempt:
            transaction.on_commit(_announce)
    return PassResult(admitted=tuple(a.run_id for a in decision.admit), preempted=decision.preempt,
                      waiting=len(decision.waiting), capacity_known=nodes is not None, resent=tuple(resent))


def _sender(enqueue: Callable[[int], None], run_id: int) -> Callable[[], None]:
    def send_run() -> None:  # a named function: Django logs a failed robust callback by its __qualname__
        enqueue(run_id)

    return send_run


RESEND_AFTER_S = 300.0
"""An admitted run no worker has claimed this long after its task was sent gets its task again (a lost message,
a purged queue); a duplicate is harmless: the worker's claim takes a run once."""


def _resend_unclaimed(now: datetime, *, exclude: set[int]) -> list[int]:
    due = now - timedelta(seconds=RESEND_AFTER_S)
    stale = (Allocation.objects.filter(ended_at__isnull=True, run__status=Run.Status.QUEUED)
             .filter(Q(sent_at__isnull=True) | Q(sent_at__lt=due)).exclude(run_id__in=exclude))
    ids = list(stale.values_list("run_id", flat=True))
    if ids:
        Allocation.objects.filter(ended_at__isnull=True, run_id__in=ids).update(sent_at=now)
        log.warning("runs %s were admitted but no worker claimed them within %.0f s; sending their tasks again",
                    ids, RESEND_AFTER_S)
    return ids


def _remember_nodes(nodes: Sequence[Node] | None, now: datetime) -> Sequence[Node] | None:
    """Store the cluster as read now; when it cannot be read, the last good read (None only if there never was one).

    A dashboard that times out once must not turn the pass into quota-only admission of the whole queue."""
    lock = AdmissionLock.objects.get(pk=1)
    lock.last_pass_at = now
    if nodes is not None:
        lock.nodes = [{"name": n.name, "cpus": n.total.cpus, "gpus": n.total.gpus,
                       "memory_bytes": n.total.memory_bytes} for n in nodes]
        lock.nodes_read_at = now
    elif lock.nodes:
        log.warning("the cluster could not be read; using its nodes as read at %s", lock.nodes_read_at)
        nodes = tuple(Node.idle(row["name"], Resources(cpus=row["cpus"], gpus=row["gpus"],
                                                       memory_bytes=row["memory_bytes"])) for row in lock.nodes)
    lock.save(update_fields=["last_pass_at", "nodes", "nodes_read_at"])
    return nodes


def request_admission(nodes: Sequence[Node] | None = ASK_RAY) -> None:
    """Run a pass now and log (never raise) a failure: callers are requests and workers whose own work is done;
    the next submit, finish or cancel runs another pass."""
    try:
        admission_pass(nodes=nodes)
    except Exception:
        log.exception("admission pass failed")


def _announce() -> None:
    try:
        publish_cluster_change()
    except Exception:
        log.warning("could not publish a cluster change", exc_info=True)


def _ensure_lock_row() -> None:
    if not AdmissionLock.objects.filter(pk=1).exists():
        try:
            with transaction.atomic():
                AdmissionLock.objects.create(pk=1)
        except IntegrityError:
            pass  # another process created it first


class _Books:
    """The snapshot a pass decides on, and the rows it writes the decision to."""

    def __init__(self, now: datetime, state: SchedulerState, queued: Mapping[int, Run],
                 gangs: Mapping[int, tuple[Resources, ...]], capacity_known: bool) -> None:
        self.now = now
        self.state = state
        self.queued = queued
        self.gangs = gangs
        self.capacity_known = capacity_known

    @classmethod
    def read(cls, now: datetime, nodes: Sequence[Node] | None, window_s: float) -> _Books:
        held = list(Allocation.objects.filter(ended_at__isnull=True).select_related("run", "team"))
        admitted = {a.run_id for a in held}
        # Locked until the pass commits: a cancel or a claim of one of these waits for the decision.
        # no_key: a FOR NO KEY UPDATE lock, so inserting a row that references one of these runs (a clone's
        # cloned_from) does not wait on the pass, and the pass and a submit cannot deadlock.
        candidates = (Run.objects.select_for_update(of=("self",), no_key=True).select_related("team")
                      .filter(status=Run.Status.QUEUED).order_by("pk"))
        queued: dict[int, Run] = {}
        gangs: dict[int, tuple[Resources, ...]] = {}
        requests = []
        for run in candidates:
            if run.pk in admitted:
                continue
            errors = resources_errors(run.resources)
            if errors:  # the API refuses these; a row written another way waits with its reason
                run.queue = {"reason": "invalid", "message": str(errors[0])}
                run.save(update_fields=["queue"])
                continue
            if run.cancel_requested:  # being cancelled: it will not start
                continue
            try:
                gang = requested_gang(run.resources, sizing_config(run.config))
                requests.append(RunRequest(run_id=run.pk, team=run.team.slug, bundles=gang,
                                           submitted_at=run.created_at.timestamp(), priority=run.priority,
                                           expected_duration_s=run.expected_duration_s, preemptible=run.preemptible))
            except SchedulingError as exc:  # one bad row (written around the API) must not stop every pass
                run.queue = {"reason": "invalid", "message": str(exc)}
                run.save(update_fields=["queue"])
                continue
            gangs[run.pk] = gang
            queued[run.pk] = run
        snapshot, running = _free_nodes(nodes, [_running(a, now) for a in held], requests)
        cluster_total = total_of(n.total for n in snapshot)
        since = now - timedelta(seconds=window_s)
        history = Allocation.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since)).select_related("team")
        intervals = [UsageInterval(team=a.team.slug, start=a.started_at.timestamp(),
                                   end=None if a.ended_at is None else a.ended_at.timestamp(),
                                   resources=Resources(cpus=a.cpus, gpus=a.gpus, memory_bytes=a.memory_bytes))
                     for a in history]
        usage = usage_in_window(intervals, now.timestamp(), window_s=window_s, cluster_total=cluster_total)
        quotas = {q.team.slug: q.as_policy() for q in Quota.objects.select_related("team")}
        state = SchedulerState(nodes=snapshot, queued=requests, running=running, quotas=quotas, usage=usage)
        return cls(now, state, queued, gangs, nodes is not None)

    def write(self, decision: Plan) -> None:
        for admission in decision.admit:
            run = self.queued[admission.run_id]
            gang = self.gangs[run.pk]
            total = total_of(gang)
            Allocation.objects.create(
                run=run, team=run.team, placement=list(admission.placement), cpus=total.cpus, gpus=total.gpus,
                memory_bytes=total.memory_bytes, priority=run.priority, preemptible=run.preemptible,
                bundles=[{"cpus": b.cpus, "gpus": b.gpus, "memory_bytes": b.memory_bytes} for b in gang],
                backfilled=admission.backfilled, iterations_at_start=run.iterations_done, started_at=self.now,
                sent_at=self.now)
            where = sorted(set(admission.placement))
            run.queue = {"reason": "admitted", "position": 0, "backfilled": admission.backfilled,
                         "nodes": where if self.capacity_known else [],
                         "message": ("admitted" + (" behind the reserved head" if admission.backfilled else "")
                                     + "; waiting for a worker to start it"), "at": _iso(self.now)}
            run.save(update_fields=["queue"])
        if decision.preempt:
            head = decision.reservation.run_id if decision.reservation else None
            # Only runs that still hold their room (one may have ended since it was read) are asked to stop.
            holding = Allocation.objects.filter(ended_at__isnull=True, run_id__in=decision.preempt)
            Run.objects.filter(pk__in=holding.values("run_id"), preempt_requested=False,
                               cancel_requested=False).update(preempt_requested=True)
            Allocation.objects.filter(run_id__in=decision.preempt, ended_at__isnull=True,
                                      preempted_for__isnull=True).update(preempted_for=head)
        changed = []
        for run_id, waiting in decision.waiting.items():
            run = self.queued[run_id]
            start = waiting.estimated_start
            queue = {"reason": waiting.reason, "position": waiting.position, "message": waiting.message,
                     "estimated_start": None if start is None else _iso(_from_ts(start)), "at": _iso(self.now)}
            if not self.capacity_known:
                queue["message"] += " (the cluster could not be read: only quotas and priorities decide)"
            if {k: v for k, v in run.queue.items() if k != "at"} != {k: v for k, v in queue.items() if k != "at"}:
                run.queue = queue
                changed.append(run)
        Run.objects.bulk_update(changed, ["queue"], batch_size=500)


def _running(allocation: Allocation, now: datetime) -> RunningRun:
    """An open allocation as the policy sees it: what it holds, where, and when it should give it back."""
    run = allocation.run
    total = run.config.get("iterations") if isinstance(run.config, dict) else None
    end = now.timestamp() if run.preempt_requested else expected_end(
        started_at=allocation.started_at.timestamp(), now=now.timestamp(), iterations_done=run.iterations_done,
        iterations_at_start=allocation.iterations_at_start, total_iterations=total if isinstance(total, int) else None,
        expected_duration_s=run.expected_duration_s)
    bundles = tuple(Resources(cpus=b["cpus"], gpus=b["gpus"], memory_bytes=b.get("memory_bytes", 0))
                    for b in allocation.bundles)
    return RunningRun(run_id=run.pk, team=allocation.team.slug, bundles=bundles,
                      placement=tuple(allocation.placement), started_at=allocation.started_at.timestamp(),
                      expected_end=end, priority=allocation.priority, preemptible=allocation.preemptible)


def _free_nodes(nodes: Sequence[Node] | None, running: Sequence[RunningRun],
                queued: Sequence[RunRequest]) -> tuple[tuple[Node, ...], list[RunningRun]]:
    """The nodes with what the open allocations hold taken out (and the running runs as placed on them).

    Unknown cluster: one stand-in node with room for everything. Known cluster: a run admitted while the cluster
    could not be read is placed now where its gang fits (Ray put it somewhere; it must count), a bundle on a node
    that left the cluster holds nothing.
    """
    if nodes is None:
        everything = total_of([r.total for r in running] + [r.total for r in queued])
        held = total_of(r.total for r in running)
        return (Node(name=UNKNOWN_NODE, total=everything, free=everything - held),), list(running)
    free = {n.name: n.total for n in nodes}
    placed = []
    for run in sorted(running, key=lambda r: UNKNOWN_NODE in r.placement):
        if UNKNOWN_NODE in run.placement:
            where = place(run.bundles, free)
            if where is None:  # more is running than the cluster has: count it on the first nodes, floored
                where = tuple(next(iter(free)) for _ in run.bundles)
            run = replace(run, placement=where)
        for bundle, node in zip(run.bundles, run.placement):
            if node in free:
                free[node] = _minus(free[node], bundle)
        placed.append(run)
    return tuple(Node(name=n.name, total=n.total, free=free[n.name]) for n in nodes), placed


def _minus(free: Resources, bundle: Resources) -> Resources:
    """Free minus a bundle, floored at zero (a node that shrank under its allocations is simply full)."""
    return Resources(cpus=max(0.0, free.cpus - bundle.cpus), gpus=max(0, free.gpus - bundle.gpus),
                     memory_bytes=max(0, free.memory_bytes - bundle.memory_bytes))


def _from_ts(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=dt_timezone.utc)


def _iso(moment: datetime) -> str:
    return moment.astimezone(dt_timezone.utc).isoformat().replace("+00:00", "Z")


def close_allocation(run: Run, end: str, *, now: datetime | None = None) -> Allocation | None:
    """End the run's open allocation (inside the caller's transaction); None when it holds none."""
    allocation = Allocation.objects.select_for_update().filter(run=run, ended_at__isnull=True).first()
    if allocation is None:
        return None
    allocation.ended_at = now or timezone.now()
    allocation.end = end
    allocation.save(update_fields=["ended_at", "end"])
    return allocation
