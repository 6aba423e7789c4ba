"""GET /api/cluster/: nodes, what each admitted run holds and where, the queue as the scheduler ordered it, and the
teams' usage over the fair-share window (other teams' runs without their names)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.cluster.ray_view import ray_nodes
from webapp.runs.models import Run
from webapp.scheduling.models import Allocation
from webapp.scheduling.resources import total_of
from webapp.scheduling.submission import cluster_nodes
from webapp.scheduling.usage import team_usage

_PRIORITY_ORDER = {"urgent": 0, "high": 1, "normal": 2, "low": 3}


def _run_row(run: Run, my_teams: set[int]) -> dict[str, Any]:
    mine = run.team_id in my_teams
    return {"id": run.pk if mine else None, "name": run.name if mine else None, "team": run.team.name,
            "status": run.status, "priority": run.priority, "resources": run.resources, "mine": mine}


def _held_row(allocation: Allocation, my_teams: set[int]) -> dict[str, Any]:
    run = allocation.run
    return {**_run_row(run, my_teams), "status": run.status if run.status != Run.Status.QUEUED else "admitted",
            "gpus": allocation.gpus, "cpus": allocation.cpus, "memory_bytes": allocation.memory_bytes,
            "nodes": sorted(set(allocation.placement)), "since": allocation.started_at,
            "backfilled": allocation.backfilled, "preemptible": allocation.preemptible,
            "stopping_for_preemption": run.preempt_requested}


def _queue_row(run: Run, my_teams: set[int], fallback_position: int) -> dict[str, Any]:
    queue = run.queue or {}
    row = {**_run_row(run, my_teams), "position": queue.get("position") or fallback_position,
           "reason": queue.get("reason"), "estimated_start": queue.get("estimated_start")}
    # The message may name what another team uses; a team sees the reasons of its own runs in full.
    row["message"] = queue.get("message") if row["mine"] else None
    return row


def cluster_snapshot(user: Any) -> dict[str, Any]:
    my_teams = set(user.memberships.values_list("team_id", flat=True))
    held = list(Allocation.objects.filter(ended_at__isnull=True).select_related("run", "run__team")
                .order_by("started_at", "id"))
    admitted = {a.run_id for a in held}
    waiting = [r for r in Run.objects.filter(status=Run.Status.QUEUED).select_related("team")
               if r.pk not in admitted]
    # The order of the last admission pass; runs it has not seen yet go last, by class then age.
    waiting.sort(key=lambda r: ((r.queue or {}).get("position") or 10**9, _PRIORITY_ORDER.get(r.priority, 9),
                                r.created_at, r.pk))
    view = ray_nodes()
    nodes = cluster_nodes(view)
    total = total_of(n.total for n in nodes) if nodes else None
    return {
        **view,
        "running": [_held_row(a, my_teams) for a in held],
        "queue": [_queue_row(r, my_teams, i + 1) for i, r in enumerate(waiting)],
        "usage": team_usage(timezone.now(), window_s=settings.EARL_FAIR_SHARE_WINDOW_S, cluster_total=total),
    }


class ClusterView(APIView):
    """The shared cluster as every signed-in user may see it."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(cluster_snapshot(request.user))
