"""The task's boundary without a worker process: a run whose stored config no longer validates fails cleanly."""

from __future__ import annotations

from typing import Any

import pytest

from earl_core.errors import ConfigError
from webapp.runs.models import Run, RunEvent
from webapp.runs.services import submit_run
from workers.tasks import execute_run

# transaction=True: the task closes stale connections at its start, as a worker process must
pytestmark = pytest.mark.django_db(transaction=True)


def test_invalid_stored_config_records_failed_with_an_error_event_and_reraises(alice: Any, ants: Any) -> None:
    run = submit_run(user=alice, team=ants, name="stale", config={"rollout": {"temperature": 9}})
    with pytest.raises(ConfigError):
        execute_run(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and "rollout.temperature" in run.error and run.finished_at is not None
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [(e.seq, e.type) for e in events] == [(1, "run.status"), (2, "error"), (3, "run.status")]
    assert events[1].data["kind"] == "ConfigError" and events[2].data["status"] == "failed"
    assert run.last_seq == 3
    # a second delivery of the same task finds nothing to do
    assert execute_run(run.pk) == {"run": run.pk, "status": "skipped"}


def test_a_cancel_while_pausing_for_a_preemption_ends_the_run(alice: Any, ants: Any) -> None:
    """The core paused (a preemption) but the user cancelled meanwhile: the run ends cancelled and gives its room
    back; it does not go back to the queue to be admitted again."""
    from earl_core.loop import RunSummary
    from webapp.scheduling.models import Allocation
    from workers.tasks import _finish

    run = submit_run(user=alice, team=ants, name="preempted", config={"iterations": 5})  # admitted on commit
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLING, cancel_requested=True, preempt_requested=True,
                                         lease="this-worker")
    _finish(run.pk, RunSummary("paused", 2, None, {}, str(run.run_dir)), None, "this-worker")
    run.refresh_from_db()
    assert run.status == "cancelled" and run.preemptions == 0 and not run.preempt_requested
    assert list(Allocation.objects.filter(run=run).values_list("end", flat=True)) == ["cancelled"]
    statuses = [e.data["status"] for e in RunEvent.objects.filter(run=run, type="run.status").order_by("seq")]
    assert statuses[-1] == "cancelled"
