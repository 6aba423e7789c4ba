"""The admission pass on the database: gang admission within capacity, quotas counted across passes, backfill,
queue position and estimated start, preemption and requeue, fair share from history, and concurrent passes."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.webapp.conftest import TINY_CONFIG, client_for
from webapp.accounts.models import Team
from webapp.runs.models import Run
from webapp.runs.services import request_cancel, requeue_preempted, submit_run
from webapp.scheduling.admission import admission_pass
from webapp.scheduling.models import Allocation, Quota
from webapp.scheduling.resources import Node, Resources

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=dt_timezone.utc)


def nodes(*cpus: float, gpus: int = 0) -> tuple[Node, ...]:
    return tuple(Node.idle(f"n{i}", Resources(cpus=c, gpus=gpus)) for i, c in enumerate(cpus))


def queue(team: Team, owner: Any, *, cpus: float, age_s: float = 0, priority: str = "normal",
          duration: float | None = None, preemptible: bool = False, iterations: int = 2) -> Run:
    return Run.objects.create(team=team, owner=owner, name="r", config={**TINY_CONFIG, "iterations": iterations},
                              priority=priority, resources={"cpus": cpus}, expected_duration_s=duration,
                              preemptible=preemptible, created_at=NOW - timedelta(seconds=1000 - age_s))


def run_pass(captured: Any, at: datetime = NOW, cluster: tuple[Node, ...] | None = None, **kwargs: Any) -> Any:
    """One pass; the runs it hands to a worker (after its commit) are returned in ``handed``."""
    handed: list[int] = []
    with captured(execute=True):
        result = admission_pass(now=at, nodes=cluster if cluster is not None else nodes(4), enqueue=handed.append,
                                **kwargs)
    assert list(result.admitted) == handed
    return result


def open_allocations() -> dict[int, Allocation]:
    return {a.run_id: a for a in Allocation.objects.filter(ended_at__isnull=True)}


def test_gang_admission_within_capacity_backfill_and_the_head_s_estimate(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    first = queue(ants, alice, cpus=2, duration=600)
    head = queue(ants, alice, cpus=4, age_s=1)            # needs the whole node
    short = queue(ants, alice, cpus=1, age_s=2, duration=100)   # ends before the head can start: backfills
    long = queue(ants, alice, cpus=1, age_s=3, duration=5000)   # would still hold the CPU the head needs

    result = run_pass(django_capture_on_commit_callbacks)
    assert result.admitted == (first.pk, short.pk) and result.capacity_known
    held = open_allocations()
    assert held[first.pk].placement == ["n0"] and held[first.pk].cpus == 2 and not held[first.pk].backfilled
    assert held[short.pk].backfilled
    head.refresh_from_db()
    long.refresh_from_db()
    assert head.queue["reason"] == "capacity" and head.queue["position"] == 1
    assert head.queue["estimated_start"] == "2026-12-04T12:10:00Z"  # when `first` is expected to end
    assert long.queue["reason"] == "reservation" and long.queue["position"] == 2
    assert Run.objects.get(pk=short.pk).queue["reason"] == "admitted"


def test_a_second_pass_admits_nobody_twice(ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    runs = [queue(ants, alice, cpus=2, age_s=i) for i in range(3)]
    assert run_pass(django_capture_on_commit_callbacks).admitted == (runs[0].pk, runs[1].pk)
    assert run_pass(django_capture_on_commit_callbacks).admitted == ()
    assert Allocation.objects.count() == 2


def test_the_quota_counts_what_the_team_already_holds(ants: Team, alice: Any,
                                                       django_capture_on_commit_callbacks: Any) -> None:
    Quota.objects.create(team=ants, max_cpus=4)
    held = queue(ants, alice, cpus=3)
    assert run_pass(django_capture_on_commit_callbacks, cluster=nodes(16)).admitted == (held.pk,)
    more = queue(ants, alice, cpus=2, age_s=5)
    assert run_pass(django_capture_on_commit_callbacks, cluster=nodes(16)).admitted == ()
    more.refresh_from_db()
    assert more.queue["reason"] == "quota" and "at most 4 CPUs" in more.queue["message"]
    # Its room comes back when the holder ends: then it starts.
    request_cancel(held)  # admitted, not yet claimed: cancelled at once, allocation closed
    assert Allocation.objects.get(run=held).end == "cancelled"
    assert run_pass(django_capture_on_commit_callbacks, cluster=nodes(16)).admitted == (more.pk,)


def test_preemption_asks_the_victim_then_the_head_starts_and_the_victim_waits_with_its_progress(
        ants: Team, bees: Team, alice: Any, charlie: Any, django_capture_on_commit_callbacks: Any) -> None:
    victim = queue(bees, charlie, cpus=4, preemptible=True, priority="low", iterations=10)
    assert run_pass(django_capture_on_commit_callbacks).admitted == (victim.pk,)
    Run.objects.filter(pk=victim.pk).update(status=Run.Status.RUNNING, iterations_done=3)
    urgent = queue(ants, alice, cpus=4, priority="high", age_s=10)

    result = run_pass(django_capture_on_commit_callbacks, at=NOW + timedelta(seconds=60))
    assert result.preempted == (victim.pk,) and result.admitted == ()
    victim.refresh_from_db()
    assert victim.preempt_requested and open_allocations()[victim.pk].preempted_for == urgent.pk
    # Passes while it checkpoints ask again, but nothing changes and nothing starts on room not yet given back.
    assert run_pass(django_capture_on_commit_callbacks, at=NOW + timedelta(seconds=61)).admitted == ()

    with transaction.atomic():  # what the worker does once the core paused it
        envelope = requeue_preempted(Run.objects.select_for_update().get(pk=victim.pk), 4)
    # The urgent run is another team's: the victim's team is not told its id.
    assert envelope["data"] == {"status": "queued", "message": "preempted for a higher-priority run after 4 "
                                                               "iterations; it resumes from its checkpoint when "
                                                               "admitted again"}
    result = run_pass(django_capture_on_commit_callbacks, at=NOW + timedelta(seconds=90))
    assert result.admitted == (urgent.pk,)
    victim.refresh_from_db()
    assert victim.status == "queued" and victim.preemptions == 1 and not victim.preempt_requested
    assert victim.iterations_done == 4 and victim.queue["reason"] == "capacity"  # first in line again
    ends = list(Allocation.objects.filter(run=victim).values_list("end", flat=True))
    assert ends == ["preempted"]


def test_a_non_preemptible_run_is_never_stopped(ants: Team, bees: Team, alice: Any, charlie: Any,
                                                django_capture_on_commit_callbacks: Any) -> None:
    holder = queue(bees, charlie, cpus=4, priority="low")
    run_pass(django_capture_on_commit_callbacks)
    queue(ants, alice, cpus=4, priority="urgent", age_s=10)
    assert run_pass(django_capture_on_commit_callbacks).preempted == ()
    assert not Run.objects.get(pk=holder.pk).preempt_requested


def test_fair_share_puts_the_team_that_used_less_first(ants: Team, bees: Team, alice: Any, charlie: Any,
                                                       django_capture_on_commit_callbacks: Any) -> None:
    # Ants held the whole node for an hour that ended ten minutes ago; bees used nothing.
    old = queue(ants, alice, cpus=4)
    Allocation.objects.create(run=old, team=ants, bundles=[{"cpus": 4, "gpus": 0}], placement=["n0"], cpus=4,
                              gpus=0, priority="normal", started_at=NOW - timedelta(minutes=70),
                              ended_at=NOW - timedelta(minutes=10), end="succeeded")
    Run.objects.filter(pk=old.pk).update(status=Run.Status.SUCCEEDED)
    ants_run = queue(ants, alice, cpus=4, age_s=1)        # older
    bees_run = queue(bees, charlie, cpus=4, age_s=500)
    assert run_pass(django_capture_on_commit_callbacks).admitted == (bees_run.pk,)
    assert Run.objects.get(pk=ants_run.pk).queue["position"] == 1
    # Outside the window the hour no longer counts, and age decides again.
    Allocation.objects.filter(run=bees_run).delete()
    assert run_pass(django_capture_on_commit_callbacks, window_s=300).admitted == (ants_run.pk,)


def test_an_unreadable_cluster_leaves_quotas_and_priorities_to_decide(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    Quota.objects.create(team=ants, max_cpus=8)
    runs = [queue(ants, alice, cpus=3, age_s=i) for i in range(3)]
    handed: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        result = admission_pass(now=NOW, nodes=None, enqueue=handed.append)
    assert not result.capacity_known and handed == [runs[0].pk, runs[1].pk]
    last = Run.objects.get(pk=runs[2].pk)
    assert last.queue["reason"] == "quota" and "could not be read" in last.queue["message"]


def test_runs_admitted_while_the_cluster_was_unreadable_count_once_it_is_read(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    first = queue(ants, alice, cpus=3)
    with django_capture_on_commit_callbacks(execute=True):
        admission_pass(now=NOW, nodes=None, enqueue=lambda run_id: None)
    assert Allocation.objects.get(run=first).placement == ["unknown"]
    second = queue(ants, alice, cpus=3, age_s=5)
    assert run_pass(django_capture_on_commit_callbacks).admitted == ()  # 4 CPUs, 3 held somewhere
    assert Run.objects.get(pk=second.pk).queue["reason"] == "capacity"


def test_the_api_takes_preemptible_and_expected_duration_and_shows_the_queue(
        alice: Any, settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    settings.RAY_DASHBOARD_URL = ""
    client = client_for(alice)
    body = {"team": "ants", "config": TINY_CONFIG, "name": "x"}
    bad = client.post("/api/runs/", {**body, "preemptible": "yes", "expected_duration_s": 0}, format="json")
    assert bad.status_code == 400
    errors = {e["field"]: e for e in bad.json()["errors"]}
    assert errors["preemptible"]["allowed"] == "true or false"
    assert errors["expected_duration_s"]["allowed"].startswith("seconds from 1 to 2592000")
    created = client.post("/api/runs/", {**body, "preemptible": True, "expected_duration_s": 90}, format="json")
    assert created.status_code == 201
    run = Run.objects.get(pk=created.json()["id"])
    assert run.preemptible and run.expected_duration_s == 90.0
    Run.objects.filter(pk=run.pk).update(queue={"reason": "capacity", "position": 2, "message": "m",
                                                "estimated_start": None})
    shown = client.get(f"/api/runs/{run.pk}/").json()
    assert shown["queue"]["position"] == 2 and shown["preemptible"] and shown["expected_duration_s"] == 90.0
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    assert client.get(f"/api/runs/{run.pk}/").json()["queue"] is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_never_admit_twice_nor_over_commit(ants: Team, bees: Team, alice: Any,
                                                             charlie: Any) -> None:
    """Passes from several threads (own database connections) at once: row locks on PostgreSQL, IMMEDIATE
    transactions on SQLite. Without the lock each pass would see the same free room and admit into it."""
    Quota.objects.create(team=ants, max_cpus=5)
    cluster = nodes(6, 6)
    admission_pass(now=NOW, nodes=cluster, enqueue=lambda run_id: None)  # the cluster as last read: what submits see
    for i in range(24):
        team, owner = (ants, alice) if i % 2 else (bees, charlie)
        queue(team, owner, cpus=1 + i % 3, age_s=i)
    failures: list[BaseException] = []
    handed: list[int] = []

    def passes(k: int) -> None:
        try:
            start.wait(10)
            for j in range(3):
                admission_pass(now=NOW + timedelta(seconds=k + 4 * j), nodes=cluster, enqueue=handed.append)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)
        finally:
            connection.close()

    source = Run.objects.filter(team=bees).first()

    def clones() -> None:
        """Submits referencing a queued run (cloned_from) while passes lock the queue: no deadlock, no 500."""
        try:
            start.wait(10)
            for _ in range(4):
                submit_run(user=charlie, team=bees, name="clone", config=source.config, resources={"cpus": 1},
                           cloned_from=source)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)
        finally:
            connection.close()

    start = threading.Barrier(5)
    threads = [threading.Thread(target=passes, args=(k,)) for k in range(4)] + [threading.Thread(target=clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert Run.objects.filter(name="clone").count() == 4
    # The clones' own passes (on submit) see no cluster view and fall back to the last nodes read: the same 6+6.
    held = list(Allocation.objects.filter(ended_at__isnull=True))
    assert len({a.run_id for a in held}) == len(held)
    per_node: dict[str, float] = {}
    per_team: dict[int, float] = {}
    for a in held:
        for bundle, node in zip(a.bundles, a.placement):
            per_node[node] = per_node.get(node, 0) + bundle["cpus"]
        per_team[a.team_id] = per_team.get(a.team_id, 0) + a.cpus
    assert all(used <= 6 for used in per_node.values()), per_node
    assert per_team.get(ants.pk, 0) <= 5
    assert sum(per_node.values()) >= 10  # it did admit: the room is mostly used


def test_the_cluster_view_shows_holdings_the_queue_with_reasons_and_team_usage(
        ants: Team, bees: Team, alice: Any, charlie: Any, settings: Any,
        django_capture_on_commit_callbacks: Any) -> None:
    settings.RAY_DASHBOARD_URL = ""
    mine = queue(ants, alice, cpus=3)
    theirs = queue(bees, charlie, cpus=3, age_s=5)
    Quota.objects.create(team=ants, max_cpus=3)
    also_mine = queue(ants, alice, cpus=1, age_s=9)
    run_pass(django_capture_on_commit_callbacks, at=timezone.now() - timedelta(minutes=5))  # in the usage window
    snap = client_for(alice).get("/api/cluster/").json()
    assert [(r["id"], r["status"], r["cpus"], r["nodes"]) for r in snap["running"]] == [(mine.pk, "admitted", 3, ["n0"])]
    rows = {r["position"]: r for r in snap["queue"]}
    assert rows[1]["id"] is None and rows[1]["team"] == "Bees" and rows[1]["reason"] == "capacity"
    assert rows[1]["message"] is None  # another team's reason text stays with that team
    assert rows[2]["id"] == also_mine.pk and rows[2]["reason"] == "quota" and "at most 3 CPUs" in rows[2]["message"]
    assert set(snap["usage"]["teams"]) == {"Ants"} and len(snap["usage"]["times"]) == 48
    assert theirs.pk not in [r["id"] for r in snap["running"]]


def test_the_schedule_command_runs_a_pass(ants: Team, alice: Any, settings: Any,
                                          django_capture_on_commit_callbacks: Any) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    settings.RAY_DASHBOARD_URL = ""
    waiting = queue(ants, alice, cpus=1)
    out = StringIO()
    with django_capture_on_commit_callbacks(execute=False):  # nothing is handed to a broker here
        call_command("schedule", "--once", stdout=out)
    assert f"admitted [{waiting.pk}]" in out.getvalue() and "cluster view unavailable" in out.getvalue()
    with pytest.raises(CommandError, match="--every must be a positive number"):
        call_command("schedule", "--every", "0")


def test_a_failing_hand_off_neither_fails_the_pass_nor_stops_the_others(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    first, second = queue(ants, alice, cpus=1), queue(ants, alice, cpus=1, age_s=1)
    sent: list[int] = []

    def broker(run_id: int) -> None:
        if run_id == first.pk:
            raise ConnectionError("broker down")
        sent.append(run_id)

    with django_capture_on_commit_callbacks(execute=True):
        result = admission_pass(now=NOW, nodes=nodes(4), enqueue=broker)
    assert result.admitted == (first.pk, second.pk) and sent == [second.pk]


def test_an_admitted_run_no_worker_claimed_gets_its_task_again(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    lost = queue(ants, alice, cpus=1)
    assert run_pass(django_capture_on_commit_callbacks).admitted == (lost.pk,)
    assert run_pass(django_capture_on_commit_callbacks, at=NOW + timedelta(seconds=60)).resent == ()
    sent: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        later = admission_pass(now=NOW + timedelta(seconds=301), nodes=nodes(4), enqueue=sent.append)
    assert later.resent == (lost.pk,) and sent == [lost.pk] and later.admitted == ()
    assert run_pass(django_capture_on_commit_callbacks, at=NOW + timedelta(seconds=400)).resent == ()  # not again yet


def test_one_bad_row_waits_with_its_reason_and_the_rest_are_admitted(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    bad = queue(ants, alice, cpus=1)
    Run.objects.filter(pk=bad.pk).update(expected_duration_s=-5)  # written around the API and the admin's validator
    good = queue(ants, alice, cpus=1, age_s=1)
    assert run_pass(django_capture_on_commit_callbacks).admitted == (good.pk,)
    bad.refresh_from_db()
    assert bad.queue["reason"] == "invalid" and "expected_duration_s" in bad.queue["message"]


def test_an_unreadable_cluster_falls_back_to_the_nodes_last_read(
        ants: Team, alice: Any, django_capture_on_commit_callbacks: Any) -> None:
    run_pass(django_capture_on_commit_callbacks, cluster=nodes(4))  # read once: one 4-CPU node
    runs = [queue(ants, alice, cpus=3, age_s=i) for i in range(2)]
    handed: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        result = admission_pass(now=NOW, nodes=None, enqueue=handed.append)
    assert result.capacity_known and handed == [runs[0].pk]  # not the whole queue
    assert Run.objects.get(pk=runs[1].pk).queue["reason"] == "capacity"


def test_max_queued_counts_only_runs_still_waiting(ants: Team, alice: Any,
                                                    django_capture_on_commit_callbacks: Any) -> None:
    """An admitted run (a worker is about to claim it) no longer waits: it does not fill the team's queue."""
    from webapp.scheduling.gang import sizing_config
    from webapp.scheduling.resources import SchedulingError
    from webapp.scheduling.submission import check_submission

    Quota.objects.create(team=ants, max_queued=1)
    admitted = queue(ants, alice, cpus=1)
    assert run_pass(django_capture_on_commit_callbacks, cluster=nodes(1)).admitted == (admitted.pk,)
    check_submission(ants, resources={}, config=sizing_config(TINY_CONFIG), nodes=None)  # room for one waiting run
    queue(ants, alice, cpus=1)  # waits: the one CPU is held
    with pytest.raises(SchedulingError, match="already has 1 queued runs"):
        check_submission(ants, resources={}, config=sizing_config(TINY_CONFIG), nodes=None)
