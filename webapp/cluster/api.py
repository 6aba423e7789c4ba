"""GET /api/cluster/: nodes, what active runs hold, and the queue (other teams' runs without their names)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.cluster.ray_view import ray_nodes
from webapp.runs.models import Run

_PRIORITY_ORDER = {"urgent": 0, "high": 1, "normal": 2, "low": 3}


def _run_row(run: Run, my_teams: set[int], position: int | None = None) -> dict[str, Any]:
    mine = run.team_id in my_teams
    row = {"id": run.pk if mine else None, "name": run.name if mine else None, "team": run.team.name,
           "status": run.status, "priority": run.priority, "resources": run.resources, "mine": mine}
    if position is not None:
        row["position"] = position
    return row


def cluster_snapshot(user: Any) -> dict[str, Any]:
    my_teams = set(user.memberships.values_list("team_id", flat=True))
    active = Run.objects.filter(status__in=[Run.Status.STARTING, Run.Status.RUNNING, Run.Status.CANCELLING])
    queued = sorted(Run.objects.filter(status=Run.Status.QUEUED).select_related("team"),
                    key=lambda r: (_PRIORITY_ORDER.get(r.priority, 9), r.created_at, r.pk))
    return {
        **ray_nodes(),
        "running": [_run_row(r, my_teams) for r in active.select_related("team")],
        "queue": [_run_row(r, my_teams, i + 1) for i, r in enumerate(queued)],
    }


class ClusterView(APIView):
    """The shared cluster as every signed-in user may see it."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(cluster_snapshot(request.user))
