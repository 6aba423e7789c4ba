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
