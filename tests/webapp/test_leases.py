"""Worker leases: a run whose worker stops renewing is requeued to resume from its checkpoint, or failed with the
reason after too many recoveries; the lost worker, if it still lives, can write nothing more."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from earl_core.loop import RunSummary
from tests.webapp.test_admission import NOW, queue, run_pass
from webapp.accounts.models import Team
from webapp.runs.leases import LeaseLost, recover_lost_runs, renew
from webapp.runs.models import Run, RunEvent
from webapp.runs.services import store_events
from webapp.scheduling.models import Allocation

pytestmark = pytest.mark.django_db


def held(team: Team, owner: Any, captured: Any, *, lease: str = "w1:42:abc", **fields: Any) -> Run:
    """An admitted run a worker claimed at NOW (its last heartbeat)."""
    run = queue(team, owner, cpus=1)
    assert run_pass(captured).admitted == (run.pk,)
    Run.objects.filter(pk=run.pk).update(**{"status": Run.Status.RUNNING, "started_at": NOW, "lease": lease,
                                            "heartbeat_at": NOW, **fields})
    return Run.objects.get(pk=run.pk)


def checkpoint(run: Run, iteration: int) -> None:
    folder = run.run_dir / "checkpoints" / f"iter_{iteration:06d}"
    folder.mkdir(parents=True)
    (folder / "earl_state.json").write_text("{}")


def recover(captured: Any, after_s: float, *, since: datetime = NOW) -> list[Any]:
    """What `manage.py schedule` does `after_s` past `since`: recover lost runs, then an admission pass."""
    with captured(execute=False):  # nothing goes to a broker or a channel layer here
        done = recover_lost_runs(since + timedelta(seconds=after_s))
    run_pass(captured, at=since + timedelta(seconds=after_s))
    return done


def test_a_run_whose_worker_went_silent_is_requeued_to_resume_from_its_checkpoint(
        ants: Team, alice: Any, runs_dir: Any, django_capture_on_commit_callbacks: Any) -> None:
    run = held(ants, alice, django_capture_on_commit_callbacks, iterations_done=5)
    checkpoint(run, 2)
    checkpoint(run, 4)
    assert recover(django_capture_on_commit_callbacks, after_s=29) == []  # the lease (30 s) still holds

    (done,) = recover(django_capture_on_commit_callbacks, after_s=31)
    assert (done.run_id, done.action, round(done.silent_s)) == (run.pk, "requeued", 31)
    run.refresh_from_db()
    assert run.status == "queued" and run.lease == "" and run.heartbeat_at is None and run.recoveries == 1
    assert run.iterations_done == 4  # iteration 4 and later are trained again from the checkpoint
    # Queued again, the next pass admitted it again like any waiting run.
    assert list(run.allocations.order_by("id").values_list("end", flat=True)) == ["lost", ""]
    last = RunEvent.objects.filter(run=run).order_by("seq").last()
    assert last.data["status"] == "queued"
    assert "no heartbeat for 31 s" in last.data["message"] and "checkpoint at iteration 4" in last.data["message"]
    assert "recovery 1 of at most 3" in last.data["message"]


def test_a_run_without_a_checkpoint_starts_over(ants: Team, alice: Any, runs_dir: Any,
                                                django_capture_on_commit_callbacks: Any) -> None:
    run = held(ants, alice, django_capture_on_commit_callbacks, iterations_done=1)
    (done,) = recover(django_capture_on_commit_callbacks, after_s=40)
    assert "from the start (it had no checkpoint yet)" in done.message
    assert Run.objects.get(pk=run.pk).iterations_done == 0


def test_after_too_many_recoveries_the_run_fails_with_the_reason(
        ants: Team, alice: Any, runs_dir: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    settings.EARL_MAX_RECOVERIES = 2
    run = held(ants, alice, django_capture_on_commit_callbacks, recoveries=2)
    (done,) = recover(django_capture_on_commit_callbacks, after_s=45)
    run.refresh_from_db()
    assert done.action == "failed" and run.status == "failed" and run.finished_at is not None
    assert "no heartbeat for 45 s" in run.error and "EARL_MAX_RECOVERIES=2" in run.error
    assert list(run.allocations.values_list("end", flat=True)) == ["failed"]
    assert RunEvent.objects.filter(run=run).order_by("seq").last().data["status"] == "failed"


def test_a_run_lost_while_cancelling_ends_cancelled(ants: Team, alice: Any, runs_dir: Any,
                                                    django_capture_on_commit_callbacks: Any) -> None:
    run = held(ants, alice, django_capture_on_commit_callbacks, status=Run.Status.CANCELLING, cancel_requested=True)
    (done,) = recover(django_capture_on_commit_callbacks, after_s=60)
    run.refresh_from_db()
    assert done.action == "cancelled" and run.status == "cancelled" and run.recoveries == 0
    assert list(run.allocations.values_list("end", flat=True)) == ["cancelled"]


def test_queued_and_finished_runs_are_not_touched(ants: Team, alice: Any, runs_dir: Any,
                                                  django_capture_on_commit_callbacks: Any) -> None:
    finished = held(ants, alice, django_capture_on_commit_callbacks, status=Run.Status.SUCCEEDED)
    queued = queue(ants, alice, cpus=1)
    assert recover(django_capture_on_commit_callbacks, after_s=3600) == []
    assert Run.objects.get(pk=queued.pk).status == "queued" and Run.objects.get(pk=finished.pk).status == "succeeded"


def test_the_lost_worker_can_write_nothing_more(ants: Team, alice: Any, runs_dir: Any,
                                                django_capture_on_commit_callbacks: Any) -> None:
    """A worker cut off (not dead) after its run was requeued: its heartbeat, its events and its end are refused,
    so two attempts never write one run."""
    from workers.tasks import _finish

    run = held(ants, alice, django_capture_on_commit_callbacks, lease="old")
    assert renew(run.pk, "old")
    # renew() stamped the real clock: an hour after it the lease is stale
    recover(django_capture_on_commit_callbacks, after_s=3600, since=timezone.now())
    assert not renew(run.pk, "old")
    seq = Run.objects.get(pk=run.pk).last_seq
    late = {"v": 1, "run": run.pk, "seq": seq + 1, "ts": "2026-12-04T12:00:00Z", "type": "log",
            "data": {"level": "info", "message": "late"}}
    with pytest.raises(LeaseLost, match="lease was taken away"):
        store_events(run.pk, [late], lease="old")
    _finish(run.pk, RunSummary("succeeded", 2, None, {}, str(run.run_dir)), None, "old")
    run.refresh_from_db()
    assert run.status == "queued" and run.last_seq == seq and run.summary == {}
    assert list(run.allocations.order_by("id").values_list("end", flat=True)) == ["lost", ""]


@pytest.mark.django_db(transaction=True)  # the heartbeat writes from its own thread and connection
def test_the_heartbeat_renews_and_notices_when_its_lease_is_gone(
        ants: Team, alice: Any, runs_dir: Any, django_capture_on_commit_callbacks: Any) -> None:
    from workers.heartbeat import Heartbeat

    run = held(ants, alice, django_capture_on_commit_callbacks, lease="mine")
    with Heartbeat(run.pk, "mine", every_s=0.05) as beat:
        deadline = time.monotonic() + 10
        while Run.objects.get(pk=run.pk).heartbeat_at == NOW and time.monotonic() < deadline:
            time.sleep(0.02)
        assert Run.objects.get(pk=run.pk).heartbeat_at != NOW and not beat.lost.is_set()
        Run.objects.filter(pk=run.pk).update(lease="another-attempt")
        assert beat.lost.wait(10)


def test_the_schedule_command_recovers_lost_runs_before_its_pass(
        ants: Team, alice: Any, runs_dir: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    settings.RAY_DASHBOARD_URL = ""
    run = held(ants, alice, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))  # the command's clock
    out = StringIO()
    with django_capture_on_commit_callbacks(execute=False):
        call_command("schedule", "--once", stdout=out)
    assert f"run {run.pk} requeued: its worker stopped answering" in out.getvalue()
    assert Allocation.objects.filter(run=run, ended_at__isnull=True).count() == 1
