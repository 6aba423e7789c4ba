"""Worker leases: the attempt that holds a run proves it is alive; runs whose worker died are recovered or failed.

A worker takes the run's lease when it claims it and renews `heartbeat_at` every EARL_HEARTBEAT_S. Only the lease's
holder may write the run's events and its end. A run whose heartbeat is older than EARL_LEASE_S lost its worker (a
SIGKILL, a machine gone, a network cut): `recover_lost_runs` takes the lease away and requeues the run so it resumes
from its last checkpoint when admitted again — or, after EARL_MAX_RECOVERIES such requeues, marks it failed with
the reason. A worker that was only cut off finds its lease gone at its next renewal and stops without writing.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from earl_core.checkpoints import complete_checkpoints
from webapp.runs.live import publish_cluster_change, publish_events
from webapp.runs.models import Run
from webapp.scheduling.admission import close_allocation
from webapp.scheduling.models import Allocation

log = logging.getLogger(__name__)

# Runs a worker holds (claimed, not yet ended).
HELD = (Run.Status.STARTING, Run.Status.RUNNING, Run.Status.CANCELLING)


class LeaseLost(RuntimeError):
    """This worker no longer holds the run: it was declared lost and the run was requeued or ended."""

    def __init__(self, run_id: int) -> None:
        super().__init__(f"run {run_id}: this worker's lease was taken away (no heartbeat for "
                         f"{settings.EARL_LEASE_S} s); another attempt owns the run now")


def new_lease() -> str:
    """A token naming this attempt: host and pid for people reading the row, random for uniqueness."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def renew(run_id: int, lease: str, now: datetime | None = None) -> bool:
    """Record a heartbeat; False when the lease is no longer this attempt's (it must stop)."""
    return Run.objects.filter(pk=run_id, lease=lease).update(heartbeat_at=now or timezone.now()) == 1


def holds(run: Run, lease: str | None) -> bool:
    """Whether `lease` may write the run (None: a caller outside any attempt, such as the web side)."""
    return lease is None or run.lease == lease


@dataclass(frozen=True)
class Recovery:
    run_id: int
    action: str  # "requeued" | "failed" | "cancelled"
    silent_s: float
    message: str


def recover_lost_runs(now: datetime | None = None) -> list[Recovery]:
    """Requeue or end every held run whose worker stopped renewing its lease; returns what was done. The caller
    (`manage.py schedule`) runs an admission pass next, which admits the requeued runs again."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.EARL_LEASE_S)
    # A claimed run always has a heartbeat; rows claimed before leases existed fall back to their start.
    lost = Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, started_at__lt=stale)
    done = [r for run_id in Run.objects.filter(lost, status__in=HELD).values_list("pk", flat=True)
            if (r := _recover(run_id, stale, now)) is not None]
    if done:
        try:
            publish_cluster_change()
        except Exception:
            log.warning("could not publish a cluster change", exc_info=True)
    return done


def _recover(run_id: int, stale: datetime, now: datetime) -> Recovery | None:
    from webapp.runs.services import store_status_event  # services imports this module's LeaseLost

    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, status__in=HELD).first()
        beat = run and (run.heartbeat_at or run.started_at)
        if run is None or beat is None or beat >= stale:
            return None  # it ended, or renewed, while we looked
        silent_s = (now - beat).total_seconds()
        lost = f"its worker stopped answering (no heartbeat for {silent_s:.0f} s)"
        checkpoints = complete_checkpoints(run.run_dir)
        if run.cancel_requested:
            action, end, status = "cancelled", Allocation.End.CANCELLED, Run.Status.CANCELLED
            message = f"cancelled: {lost} while it was cancelling"
        elif run.recoveries < settings.EARL_MAX_RECOVERIES:
            action, end, status = "requeued", Allocation.End.LOST, Run.Status.QUEUED
            where = (f"from its checkpoint at iteration {checkpoints[-1][0]}" if checkpoints
                     else "from the start (it had no checkpoint yet)")
            message = (f"requeued: {lost}; it resumes {where} when admitted again "
                       f"(recovery {run.recoveries + 1} of at most {settings.EARL_MAX_RECOVERIES})")
        else:
            action, end, status = "failed", Allocation.End.FAILED, Run.Status.FAILED
            message = (f"failed: {lost}, and it was already requeued {run.recoveries} times after lost workers "
                       f"(EARL_MAX_RECOVERIES={settings.EARL_MAX_RECOVERIES})")
        close_allocation(run, end, now=now)
        run.status, run.lease, run.heartbeat_at, run.preempt_requested = status, "", None, False
        fields = ["status", "lease", "heartbeat_at", "preempt_requested"]
        if action == "requeued":
            run.recoveries += 1
            # Progress is what the checkpoint holds: iterations after it are trained again.
            run.iterations_done = checkpoints[-1][0] if checkpoints else 0
            fields += ["recoveries", "iterations_done"]
        else:
            run.finished_at = now
            fields.append("finished_at")
            if action == "failed":
                run.error = message
                fields.append("error")
        run.save(update_fields=fields)
        envelope = store_status_event(run, status, message)
        transaction.on_commit(lambda: publish_events(run_id, [envelope]), robust=True)
    log.warning("run %s %s", run_id, message)
    return Recovery(run_id, action, silent_s, message)
