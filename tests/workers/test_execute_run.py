"""The service end to end: REST submit -> Celery worker process (Redis broker) -> the core on a Ray head -> events in
the database and live on the websocket; cancel reaches the running core. Real processes, nothing eager or in-memory."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.webapp.conftest import TINY_CONFIG
from webapp.accounts.models import ApiToken
from webapp.runs.models import Run, RunEvent
from webapp.stack import Stack, database_url, free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FINISHED = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One Ray head for the module (its start costs seconds); workers reach it through RAY_ADDRESS."""
    stack = Stack(log_dir=tmp_path_factory.mktemp("stack-logs"))
    stack.start_ray_head(port=free_port(), dashboard_port=free_port(), num_cpus=4)
    yield stack
    stack.stop()


@pytest.fixture
def worker(ray_head: Stack, redis_url: str, runs_dir: Any, transactional_db: None) -> Iterator[Stack]:
    """A real Celery worker process on the test database and the test Redis."""
    stack = Stack(env={**ray_head.env, "DATABASE_URL": database_url(connection.settings_dict), "REDIS_URL": redis_url,
                       "CELERY_BROKER_URL": redis_url, "EARL_RUNS_DIR": str(runs_dir), "EARL_CANCEL_POLL_S": "1"},
                  log_dir=ray_head.log_dir)
    stack.start_celery_worker(name=f"w{free_port()}")
    yield stack
    stack.stop()


def _wait(predicate: Any, *, timeout_s: float, what: str, stack: Stack) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        dead = stack.first_dead()
        assert dead is None, f"{dead} died; logs in {stack.log_dir}"
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}; logs in {stack.log_dir}")


def _recorded(run_id: int) -> bool:
    """The worker has written how the run ended (a summary, or failed with its error)."""
    run = Run.objects.get(pk=run_id)
    return run.summary != {} or run.status == "failed"


class Viewer(threading.Thread):
    """A websocket client of the run (through the ASGI app, on the Redis channel layer) collecting every frame."""

    def __init__(self, run_id: int, key: str) -> None:
        super().__init__(daemon=True)
        self.run_id, self.key = run_id, key
        self.frames: list[dict[str, Any]] = []
        self.connected = threading.Event()

    def run(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        from tests.webapp.sockets import open_socket

        comm = open_socket(f"/ws/runs/{self.run_id}/?after=0", self.key)
        connected, _ = await comm.connect(timeout=10)
        assert connected
        self.connected.set()
        while True:
            frame = json.loads(await comm.receive_from(timeout=600))
            self.frames.append(frame)
            if frame["type"] == "run.status" and frame["data"]["status"] in FINISHED:
                break
        await comm.disconnect()


def test_submitted_run_trains_on_ray_and_streams_every_event(worker: Stack, as_alice: Any, alice: Any) -> None:
    config = {**TINY_CONFIG, "checkpoint_every": 1}
    created = as_alice.post("/api/runs/", {"team": "ants", "name": "e2e", "config": config}, format="json")
    assert created.status_code == 201, created.json()
    run_id = created.json()["id"]
    viewer = Viewer(run_id, ApiToken.issue(alice)[1])
    viewer.start()
    assert viewer.connected.wait(30)

    _wait(lambda: _recorded(run_id), timeout_s=420, what="the run to finish", stack=worker)
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", run.error
    assert run.iterations_done == 2 and run.started_at and run.finished_at

    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)) and run.last_seq == len(events)
    assert [e.data["status"] for e in events if e.type == "run.status"] == ["queued", "starting", "running", "succeeded"]
    assert [e.data["iteration"] for e in events if e.type == "metrics" and "rollout/win_rate" in e.data["values"]] == [0, 1]
    assert any(e.type == "memory" for e in events)

    viewer.join(60)
    assert [f["seq"] for f in viewer.frames] == [e.seq for e in events]  # no gap, no duplicate, same order

    games = as_alice.get(f"/api/runs/{run_id}/games/").json()["results"]
    assert games and all(g["result"] in ("win", "loss", "draw") and g["transcript"] for g in games)
    ckpts = as_alice.get(f"/api/runs/{run_id}/checkpoints/").json()
    assert [c["iteration"] for c in ckpts] == [0, 1, 2] or [c["iteration"] for c in ckpts] == [1, 2]
    download = as_alice.get(ckpts[-1]["download"])
    assert download.status_code == 200 and download["Content-Type"] == "application/zip"
    assert as_alice.post(f"/api/runs/{run_id}/cancel/").status_code == 409


def test_cancel_stops_a_running_run_at_a_safe_point(worker: Stack, as_alice: Any) -> None:
    config = {**TINY_CONFIG, "iterations": 500}
    run_id = as_alice.post("/api/runs/", {"team": "ants", "config": config}, format="json").json()["id"]
    _wait(lambda: Run.objects.get(pk=run_id).iterations_done >= 1, timeout_s=300, what="a first iteration",
          stack=worker)
    assert as_alice.post(f"/api/runs/{run_id}/cancel/").json()["status"] == "cancelling"
    # the status event arrives first; the worker then records the core's summary
    _wait(lambda: _recorded(run_id), timeout_s=120, what="the cancel", stack=worker)
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.iterations_done < 500
    assert run.summary["last_checkpoint"]  # the core checkpoints when it stops
    statuses = [e.data["status"] for e in RunEvent.objects.filter(run=run, type="run.status").order_by("seq")]
    assert statuses[-1] == "cancelled"


def test_a_preempted_run_checkpoints_requeues_and_resumes_from_its_checkpoint(
        worker: Stack, as_alice: Any, settings: Any) -> None:
    """A high run that does not fit stops a preemptible low one: the low run pauses at a checkpoint, waits, and
    resumes there once the high run is done. Every pass sees the real Ray head (4 CPUs) through its dashboard."""
    settings.RAY_DASHBOARD_URL = worker.env["RAY_DASHBOARD_URL"]
    low_config = {**TINY_CONFIG, "iterations": 12, "checkpoint_every": 1}
    low_id = as_alice.post("/api/runs/", {"team": "ants", "name": "low", "config": low_config, "priority": "low",
                                          "preemptible": True, "resources": {"cpus": 3}}, format="json").json()["id"]
    _wait(lambda: Run.objects.get(pk=low_id).iterations_done >= 1, timeout_s=300, what="a first iteration",
          stack=worker)
    high = as_alice.post("/api/runs/", {"team": "ants", "name": "high", "config": TINY_CONFIG, "priority": "high",
                                        "resources": {"cpus": 3}}, format="json").json()
    waiting = Run.objects.get(pk=high["id"])
    assert waiting.queue["reason"] == "capacity", waiting.queue  # 1 CPU free: first in line while the low one stops
    assert Run.objects.get(pk=low_id).preempt_requested
    _wait(lambda: _recorded(low_id) and _recorded(high["id"]), timeout_s=600, what="both runs to finish",
          stack=worker)

    low, top = Run.objects.get(pk=low_id), Run.objects.get(pk=high["id"])
    assert low.status == "succeeded" and top.status == "succeeded", (low.error, top.error)
    assert low.preemptions == 1 and low.iterations_done == 12
    events = list(RunEvent.objects.filter(run=low).order_by("seq"))
    statuses = [e.data["status"] for e in events if e.type == "run.status"]
    assert statuses == ["queued", "starting", "running", "paused", "queued", "starting", "running", "succeeded"]
    paused_at = next(e for e in events if e.type == "run.status" and e.data["status"] == "paused")
    stopped = int(paused_at.data["message"].split("before iteration ")[1].split(";")[0])
    assert any(e.type == "log" and f"at iteration {stopped}" in e.data.get("message", "") for e in events)
    # Each iteration trained once: the resume continued from the checkpoint, it did not start over.
    trained = [e.data["iteration"] for e in events if e.type == "metrics" and "rollout/win_rate" in e.data["values"]]
    assert trained == list(range(12))
    # The high run started only once the low one had given its room back.
    assert top.started_at > paused_at.ts
    allocations = list(low.allocations.order_by("started_at").values_list("end", "preempted_for"))
    assert allocations == [("preempted", top.pk), ("succeeded", None)]


def test_a_worker_killed_mid_run_is_recovered_and_resumes_from_its_checkpoint(worker: Stack, as_alice: Any) -> None:
    """SIGKILL the Celery worker (parent and child: the run's Ray driver dies with it) in the middle of a run. With
    the default lease (30 s) and scheduler period (15 s), the scheduler process notices the silence, requeues the
    run within 60 s, and a new worker resumes it from its last checkpoint: no iteration after it is lost."""
    config = {**TINY_CONFIG, "iterations": 5, "checkpoint_every": 1}
    run_id = as_alice.post("/api/runs/", {"team": "ants", "name": "crash", "config": config},
                           format="json").json()["id"]
    _wait(lambda: Run.objects.get(pk=run_id).iterations_done >= 2, timeout_s=300, what="two iterations",
          stack=worker)
    (name,) = [n for n, _ in worker.procs if n.startswith("w")]
    worker.kill(name)
    killed_at = time.monotonic()
    worker.start_scheduler()
    worker.start_celery_worker(name=f"w{free_port()}")

    def requeued() -> bool:
        return RunEvent.objects.filter(run_id=run_id, type="run.status", data__status="queued", seq__gt=1).exists()

    _wait(requeued, timeout_s=90, what="the lost run to be requeued", stack=worker)
    noticed_s = time.monotonic() - killed_at
    print(f"requeued {noticed_s:.1f} s after the worker was killed")
    assert noticed_s < 60, f"a killed worker's run was requeued only after {noticed_s:.0f} s"
    _wait(lambda: _recorded(run_id), timeout_s=420, what="the resumed run to finish", stack=worker)

    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and run.iterations_done == 5 and run.recoveries == 1, run.error
    assert run.lease == "" and run.heartbeat_at is None
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    statuses = [e.data["status"] for e in events if e.type == "run.status"]
    assert statuses == ["queued", "starting", "running", "queued", "starting", "running", "succeeded"]
    recovery = next(e for e in events if e.type == "run.status" and "stopped answering" in e.data["message"])
    resumed_at = int(recovery.data["message"].split("checkpoint at iteration ")[1].split(" ")[0])
    assert resumed_at >= 2
    after = [e.data["iteration"] for e in events if e.seq > recovery.seq and e.type == "metrics"
             and "rollout/win_rate" in e.data["values"]]
    assert after == list(range(resumed_at, 5))  # it continued from the checkpoint, it did not start over
    assert list(run.allocations.order_by("id").values_list("end", flat=True)) == ["lost", "succeeded"]
