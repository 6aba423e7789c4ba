"""What can happen to a run: submit, cancel, clone, and storing the events a worker reports."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from earl_core.checkpoints import complete_checkpoints
from earl_core.config import RunConfig
from webapp.accounts.models import Membership, Team
from webapp.cluster.ray_view import ray_nodes
from webapp.runs.leases import LeaseLost, holds
from webapp.runs.live import publish_cluster_change, publish_events
from webapp.runs.models import Checkpoint, Game, Run, RunEvent
from webapp.scheduling.admission import close_allocation, request_admission
from webapp.scheduling.gang import sizing_config
from webapp.scheduling.submission import check_submission, cluster_nodes


class StateConflict(Exception):
    """The run's state does not allow this change (the API answers 409)."""


def visible_runs(user: Any) -> QuerySet[Run]:
    """Runs of every team the user belongs to (any role)."""
    return Run.objects.filter(team__memberships__user=user).distinct()


def membership(user: Any, team: Team) -> Membership | None:
    return Membership.objects.filter(user=user, team=team).first()


def core_config(run: Run) -> RunConfig:
    """The core's config for this run: the stored one, written into the run's own folder."""
    data = dict(run.config)
    data["name"] = run.run_dir.name
    data["output_dir"] = str(run.run_dir.parent)
    return RunConfig.from_dict(data)


def store_status_event(run: Run, status: str, message: str) -> dict[str, Any]:
    """Append a run.status event written by the web side (only while no worker owns the run's stream)."""
    seq = (run.events.aggregate(m=Max("seq"))["m"] or 0) + 1
    event = RunEvent.objects.create(run=run, seq=seq, type="run.status", data={"status": status, "message": message},
                                    ts=timezone.now())
    Run.objects.filter(pk=run.pk).update(last_seq=seq)
    run.last_seq = seq
    return event.envelope()


def submit_run(*, user: Any, team: Team, name: str, config: dict[str, Any], priority: str = Run.Priority.NORMAL,
               resources: dict[str, Any] | None = None, cloned_from: Run | None = None, preemptible: bool = False,
               expected_duration_s: float | None = None) -> Run:
    """Store a validated run as queued and run an admission pass once the transaction commits.

    A run that could never start on the cluster, or that its team's quota does not allow, is refused with a
    SchedulingError naming the request field (the API answers 400) and nothing is stored.
    """
    # Asked before the transaction: the dashboard may take its whole timeout, and no lock should wait on it.
    nodes = cluster_nodes(ray_nodes())
    with transaction.atomic():
        # The team's row lock makes a team's submissions take turns, so max_queued holds under concurrent submits.
        # no_key: rows that reference the team (an admission pass's allocations) may still be inserted meanwhile.
        Team.objects.select_for_update(no_key=True).filter(pk=team.pk).first()
        check_submission(team, resources=resources or {}, config=sizing_config(config), nodes=nodes)
        run = Run.objects.create(team=team, owner=user, name=name, config=config, priority=priority,
                                 resources=resources or {}, cloned_from=cloned_from, preemptible=preemptible,
                                 expected_duration_s=expected_duration_s)
        envelope = store_status_event(run, Run.Status.QUEUED, "waiting for admission")
        # The admission pass must see the committed row; it queues the run for a worker when it may start (now,
        # or at a later pass when a run ends). It logs rather than raises: the run is stored either way.
        transaction.on_commit(lambda: request_admission(nodes), robust=True)
        transaction.on_commit(lambda: publish_events(run.pk, [envelope]), robust=True)
        transaction.on_commit(publish_cluster_change, robust=True)
    return run


def request_cancel(run: Run) -> Run:
    """Cancel now if no worker has it yet; else flag it and let the worker stop at its next safe point."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.is_finished:
            raise StateConflict(f"run {run.pk} is already {run.status}; only queued, starting or running runs can be cancelled")
        if run.status == Run.Status.CANCELLING:
            return run
        if run.status == Run.Status.QUEUED:
            close_allocation(run, "cancelled")  # admitted but not yet claimed: its room goes back now
            run.status = Run.Status.CANCELLED
            run.finished_at = timezone.now()
            run.cancel_requested = True
            run.save(update_fields=["status", "finished_at", "cancel_requested"])
            envelope = store_status_event(run, Run.Status.CANCELLED, "cancelled before it started")
            transaction.on_commit(lambda: publish_events(run.pk, [envelope]), robust=True)
        else:
            run.status = Run.Status.CANCELLING
            run.cancel_requested = True
            run.save(update_fields=["status", "cancel_requested"])
        transaction.on_commit(publish_cluster_change, robust=True)
        if run.status == Run.Status.CANCELLED:
            transaction.on_commit(request_admission, robust=True)  # its place or its room may start another
    return run


def clone_run(run: Run, *, user: Any, name: str | None = None) -> Run:
    """A new queued run with the same team, config and priority."""
    return submit_run(user=user, team=run.team, name=name or f"{run.name} (clone)"[:100], config=run.config,
                      priority=run.priority, resources=run.resources, cloned_from=run, preemptible=run.preemptible,
                      expected_duration_s=run.expected_duration_s)


# ---- what a worker reports ----------------------------------------------------------------------------

_STATUS_FROM_CORE = {s.value for s in Run.Status}


def store_events(run_id: int, envelopes: list[dict[str, Any]], *, lease: str | None = None) -> list[dict[str, Any]]:
    """Persist a batch of core events in order, and apply what they say to the run; returns the stored ones.

    Events at or below the stored last seq are skipped (a batch retried after a crash is not stored twice). With a
    `lease`, only the worker attempt holding it may write: a worker declared lost gets LeaseLost and stores nothing.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if not holds(run, lease):
            raise LeaseLost(run_id)
        fresh = [{**e, "data": storable(e["data"])} for e in envelopes if e["seq"] > run.last_seq]
        if not fresh:
            return []
        RunEvent.objects.bulk_create([
            RunEvent(run=run, seq=e["seq"], type=e["type"], data=e["data"], ts=e["ts"]) for e in fresh
        ])
        run.last_seq = fresh[-1]["seq"]
        fields = {"last_seq"}
        for e in fresh:
            fields |= _apply(run, e)
        run.save(update_fields=sorted(fields))
        _store_games(run, fresh)
    return fresh


def storable(value: Any) -> Any:
    """The value with every NUL character (U+0000) replaced by U+FFFD: PostgreSQL's text and jsonb cannot hold one,
    and a model's raw answer may contain it (an untrained policy writes any token). Live viewers get the same text."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def _apply(run: Run, envelope: dict[str, Any]) -> set[str]:
    data = envelope["data"]
    if envelope["type"] == "metrics":
        if any(key.startswith("sft/") for key in data.get("values", {})):
            return set()  # warm-start epochs are not RL iterations
        run.iterations_done = max(run.iterations_done, int(data["iteration"]) + 1)
        return {"iterations_done"}
    if envelope["type"] != "run.status" or data.get("status") not in _STATUS_FROM_CORE:
        return set()
    status = data["status"]
    if run.cancel_requested and status in (Run.Status.STARTING, Run.Status.RUNNING):
        return set()  # the user asked to cancel; the row keeps saying so until the core stops
    run.status = status
    changed = {"status"}
    if status == Run.Status.STARTING and run.started_at is None:
        run.started_at = timezone.now()
        changed.add("started_at")
    if status in Run.FINISHED:
        run.finished_at = timezone.now()
        changed.add("finished_at")
        if status == Run.Status.FAILED:
            run.error = data.get("message", "")[:10_000]
            changed.add("error")
    return changed


def _store_games(run: Run, envelopes: list[dict[str, Any]]) -> None:
    """Sample games: moves collect in the transcript, the game.end event completes the row."""
    for e in envelopes:
        if e["type"] not in ("game.move", "game.end"):
            continue
        d = e["data"]
        game, _ = Game.objects.get_or_create(
            run=run, iteration=d["iteration"], index=d["game"],
            defaults={"opponent": "", "agent_side": 1, "result": "", "reward": 0.0, "moves": ""})
        if e["type"] == "game.move":
            game.transcript = [*game.transcript, d]
            game.save(update_fields=["transcript"])
        else:
            game.opponent, game.agent_side, game.result = d["opponent"], d["agent_side"], d["result"]
            game.reward, game.moves = d["reward"], d["moves"]
            game.save(update_fields=["opponent", "agent_side", "result", "reward", "moves"])


def requeue_preempted(run: Run, iterations_done: int) -> dict[str, Any]:
    """A run that paused for a preemption goes back to the queue with its progress (inside the caller's
    transaction, the row locked); returns the stored queued event. It resumes from its checkpoint when admitted."""
    allocation = close_allocation(run, "preempted")
    run.status = Run.Status.QUEUED
    run.iterations_done = iterations_done
    run.preempt_requested = False
    run.preemptions += 1
    run.save(update_fields=["status", "iterations_done", "preempt_requested", "preemptions"])
    made_room = allocation.preempted_for if allocation is not None else None
    # The run it made room for is named only within its own team (other teams' run ids stay private).
    same_team = made_room is not None and Run.objects.filter(pk=made_room, team_id=run.team_id).exists()
    why = f" for run {made_room}" if same_team else " for a higher-priority run" if made_room else ""
    return store_status_event(run, Run.Status.QUEUED, f"preempted{why} after {iterations_done} iterations; it "
                                                      "resumes from its checkpoint when admitted again")


def sync_checkpoints(run: Run) -> list[Checkpoint]:
    """Record the complete checkpoint folders the run has written (half-written ones end in .tmp)."""
    found = []
    for iteration, path in complete_checkpoints(run.run_dir):
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        ckpt, _ = Checkpoint.objects.update_or_create(
            run=run, iteration=iteration, defaults={"path": str(path), "size_bytes": size})
        found.append(ckpt)
    return found
