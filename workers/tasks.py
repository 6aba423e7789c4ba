"""`workers.execute_run`: claim a queued run, train it with the EARL core on Ray, record how it ended."""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from earl_core import events as ev
from earl_core.loop import RunSummary, latest_checkpoint, train
from webapp.runs.leases import LeaseLost, holds, new_lease
from webapp.runs.live import publish_cluster_change, publish_events
from webapp.runs.models import Run
from webapp.runs.services import (core_config, requeue_preempted, storable, store_events, store_status_event,
                                  sync_checkpoints)
from webapp.scheduling.admission import close_allocation, request_admission
from webapp.scheduling.models import Allocation
from workers.celery_app import app
from workers.heartbeat import Heartbeat
from workers.relay import EventRelay

log = logging.getLogger(__name__)


def _announce_cluster_change() -> None:
    """Best effort: viewers of the cluster page refresh; a Redis hiccup must not strand a run's state."""
    try:
        publish_cluster_change()
    except Exception:
        log.warning("could not publish a cluster change", exc_info=True)


class StopFlags:
    """The core's `should_stop` (a cancel) and `should_pause` (a preemption): the run's two flags read from the
    database in one query, at most once per poll interval."""

    def __init__(self, run_id: int, *, poll_s: float, heartbeat: Heartbeat | None = None) -> None:
        self.run_id = run_id
        self.poll_s = poll_s
        self.heartbeat = heartbeat
        self._checked = 0.0
        self._cancel = False
        self._pause = False

    def _poll(self) -> None:
        # Once paused the core stops at its next safe point, but a cancel may still come first: keep reading.
        if not self._cancel and time.monotonic() - self._checked >= self.poll_s:
            close_old_connections()
            flags = Run.objects.filter(pk=self.run_id).values_list("cancel_requested", "preempt_requested").first()
            self._cancel, self._pause = flags or (True, False)  # a deleted run stops
            self._checked = time.monotonic()

    def cancel(self) -> bool:
        # A lost lease stops the core at once, without the checkpoint a cancel writes: the run is another
        # attempt's now, and this one must not write into its folder.
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(self.run_id)
        self._poll()
        return self._cancel

    def pause(self) -> bool:
        self._poll()
        return self._pause and not self._cancel


def _claim(run_id: int, lease: str) -> Run | None:
    """Move an admitted queued run to starting under a row lock, taking its lease; None when there is nothing to start.

    Nothing to start: the run is not queued (cancelled, or another worker took it), it holds no allocation (a
    task that outran or outlived its admission: the next pass that admits it queues it again), or it was asked to
    make room before it started (it goes back to waiting, no checkpoint needed).
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != Run.Status.QUEUED:
            return None
        if not run.allocations.filter(ended_at__isnull=True).exists():
            log.info("run %s is queued but not admitted; the admission pass will queue it when it may start", run_id)
            return None
        if run.preempt_requested:
            close_allocation(run, Allocation.End.PREEMPTED)
            run.preempt_requested = False
            run.queue = {}
            run.save(update_fields=["preempt_requested", "queue"])
            transaction.on_commit(request_admission)
            return None
        run.status = Run.Status.STARTING
        run.started_at = run.started_at or timezone.now()
        run.queue = {}
        run.lease, run.heartbeat_at = lease, timezone.now()
        run.save(update_fields=["status", "started_at", "queue", "lease", "heartbeat_at"])
    _announce_cluster_change()
    return run


def _fail_before_start(run: Run, exc: BaseException) -> None:
    """The core never started (bad stored config, say): record failed + an error event in the run's stream."""
    events: list[dict[str, Any]] = []
    stream = ev.EventStream(run.pk, events.append, start_seq=Run.objects.get(pk=run.pk).last_seq)
    stream.emit(ev.Error(message=str(exc), kind=type(exc).__name__, traceback=traceback.format_exc()))
    stream.emit(ev.RunStatus("failed", str(exc)))
    publish_events(run.pk, store_events(run.pk, events, lease=run.lease))


def _finish(run_id: int, summary: RunSummary | None, error: BaseException | None, lease: str) -> None:
    """Make the row agree with how the core ended, whatever events did or did not arrive; give its room back.

    A paused run (preempted) goes back to the queue with its progress; it resumes from its checkpoint when a
    later pass admits it again. Then a pass runs: what this run held may start others. A worker whose lease was
    taken away (declared lost) writes nothing: the run is another attempt's, or already ended.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if not holds(run, lease):
            log.warning("run %s: not recording how this attempt ended; its lease was taken away", run_id)
            return
        run.lease, run.heartbeat_at = "", None
        run.save(update_fields=["lease", "heartbeat_at"])
        if summary is not None and summary.status == "paused" and run.cancel_requested:
            # Cancelled while it paused for a preemption: it ends here, it does not go back to the queue.
            summary = RunSummary("cancelled", summary.iterations_done, summary.last_checkpoint,
                                 summary.final_metrics, summary.run_dir)
            envelope = store_status_event(run, Run.Status.CANCELLED, "cancelled while it paused for a preemption")
            transaction.on_commit(lambda e=envelope: publish_events(run_id, [e]), robust=True)
        if summary is not None and summary.status == "paused":
            envelope = requeue_preempted(run, summary.iterations_done)
            transaction.on_commit(lambda e=envelope: publish_events(run_id, [e]), robust=True)
        else:
            if summary is not None:
                run.status = summary.status
                run.summary = {"iterations_done": summary.iterations_done, "last_checkpoint": summary.last_checkpoint,
                               "final_metrics": summary.final_metrics}
                run.iterations_done = summary.iterations_done
            else:
                run.status = Run.Status.FAILED
                run.error = storable((str(error) or type(error).__name__)[:10_000])
            run.finished_at = run.finished_at or timezone.now()
            run.preempt_requested = False
            run.save(update_fields=["status", "summary", "iterations_done", "error", "finished_at",
                                    "preempt_requested"])
            close_allocation(run, run.status)
    sync_checkpoints(run)
    _announce_cluster_change()
    request_admission()


@app.task(name="workers.execute_run")
def execute_run(run_id: int) -> dict[str, Any]:
    """Run one training run end to end. Arguments are ids only; state lives in the database."""
    close_old_connections()
    lease = new_lease()
    run = _claim(run_id, lease)
    if run is None:
        log.info("run %s is not queued; nothing to do", run_id)
        return {"run": run_id, "status": "skipped"}
    with Heartbeat(run_id, lease, every_s=settings.EARL_HEARTBEAT_S) as heartbeat:
        return _execute(run, lease, heartbeat)


def _execute(run: Run, lease: str, heartbeat: Heartbeat) -> dict[str, Any]:
    run_id = run.pk
    try:
        cfg = core_config(run)
    except Exception as exc:
        _fail_before_start(run, exc)
        _finish(run_id, None, exc, lease)
        log.exception("run %s has an invalid config", run_id)
        raise
    relay = EventRelay(run_id, lease=lease)
    summary: RunSummary | None = None
    error: BaseException | None = None
    try:
        flags = StopFlags(run_id, poll_s=settings.EARL_CANCEL_POLL_S, heartbeat=heartbeat)
        summary = train(cfg, relay, run_id=run_id, resume=latest_checkpoint(cfg.run_dir) is not None,
                        should_stop=flags.cancel, should_pause=flags.pause,
                        ray_address=settings.RAY_ADDRESS or None, start_seq=run.last_seq)
    except BaseException as exc:
        error = exc
        log.exception("run %s failed", run_id)
        raise
    finally:
        try:
            relay.close()
        finally:
            _finish(run_id, summary, error, lease)
    return {"run": run_id, "status": summary.status, "iterations_done": summary.iterations_done}
