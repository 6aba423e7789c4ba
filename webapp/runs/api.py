"""REST API of runs: list/submit/show, cancel, clone, events, metrics (JSON/CSV), games, checkpoints."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from django.db.models import Q, QuerySet
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from earl_core.events import EVENT_TYPES
from webapp.api_errors import Conflict, FieldErrors
from webapp.parsers import API_PARSERS
from webapp.runs.models import Run, RunEvent
from webapp.runs.serializers import (CheckpointSerializer, CloneSerializer, EventPageSerializer, GameSerializer,
                                     MetricsSerializer, RunCreateSerializer, RunSerializer, team_for, unstorable_errors,
                                     validated)
from webapp.runs.services import StateConflict, membership, clone_run, request_cancel, submit_run, sync_checkpoints, visible_runs
from webapp.runs.zipstream import zip_chunks_async

MAX_EVENTS_PAGE = 1000


class CSVRenderer(BaseRenderer):
    """Passes through text already written as CSV (`?format=csv`)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return data.encode() if isinstance(data, str) else b""


def _int_param(request: Request, name: str, default: int, *, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise FieldErrors([{"field": name, "message": f"{raw[:40]!r} is not an integer in range",
                            "allowed": f"{lo}..{hi}"}])
    return value


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Runs of the caller's teams; another team's run is a 404, exactly like a missing one."""

    serializer_class = RunSerializer
    parser_classes = API_PARSERS
    # Never used for data (get_queryset decides); it lets the schema say a run id is an integer.
    queryset = Run.objects.none()

    def get_queryset(self) -> QuerySet[Run]:
        runs = visible_runs(self.request.user).select_related("team", "owner")
        if self.action != "list":
            return runs
        params = self.request.query_params
        if params.get("team"):
            runs = runs.filter(team=team_for(self.request.user, params["team"]))
        if params.get("status"):
            wanted = [s.strip() for s in params["status"].split(",") if s.strip()]
            bad = [s for s in wanted if s not in Run.Status.values]
            if bad:
                raise FieldErrors([{"field": "status", "message": f"unknown status {bad[0]!r}",
                                    "allowed": ", ".join(Run.Status.values)}])
            runs = runs.filter(status__in=wanted)
        if params.get("search"):
            term = params["search"][:100]
            if unstorable_errors(term, "search"):  # PostgreSQL cannot compare text holding NUL
                raise FieldErrors(unstorable_errors(term, "search"))
            runs = runs.filter(Q(name__icontains=term) | Q(owner__username__icontains=term))
        return runs

    @extend_schema(parameters=[
        OpenApiParameter("team", str, description="team id or slug"),
        OpenApiParameter("status", str, description="comma-separated statuses"),
        OpenApiParameter("search", str, description="text in the run's name or owner"),
    ])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=RunCreateSerializer, responses={201: RunSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(RunCreateSerializer(data=request.data, context={"request": request}))
        run = submit_run(user=request.user, **data)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: RunSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        member = membership(request.user, run.team)
        if member is None or not member.can_launch:
            raise PermissionDenied("viewers watch runs; cancelling needs the admin or member role in the run's team")
        try:
            run = request_cancel(run)
        except StateConflict as exc:
            raise Conflict(str(exc)) from exc
        return Response(RunSerializer(run).data)

    @extend_schema(request=CloneSerializer, responses={201: RunSerializer})
    @action(detail=True, methods=["post"])
    def clone(self, request: Request, pk: str | None = None) -> Response:
        source = self.get_object()
        form = CloneSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        # the caller must be allowed to launch in that team today, and the config must still be valid
        validated(RunCreateSerializer(data={"team": source.team_id, "config": source.config, "priority": source.priority},
                                      context={"request": request}))
        run = clone_run(source, user=request.user, name=form.validated_data.get("name"))
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[
        OpenApiParameter("after", int, description="only events with a higher seq"),
        OpenApiParameter("type", str, description="comma-separated event types"),
        OpenApiParameter("limit", int, description=f"1..{MAX_EVENTS_PAGE} (default 200)"),
    ], responses=EventPageSerializer)
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        after = _int_param(request, "after", 0, lo=0, hi=2**31 - 1)
        limit = _int_param(request, "limit", 200, lo=1, hi=MAX_EVENTS_PAGE)
        events = RunEvent.objects.filter(run=run, seq__gt=after)
        if request.query_params.get("type"):
            types = [t.strip() for t in request.query_params["type"].split(",") if t.strip()]
            bad = [t for t in types if t not in EVENT_TYPES]
            if bad:
                raise FieldErrors([{"field": "type", "message": f"unknown event type {bad[0]!r}",
                                    "allowed": ", ".join(EVENT_TYPES)}])
            events = events.filter(type__in=types)
        page = [e.envelope() for e in events.order_by("seq")[:limit]]
        return Response({"events": page, "last_seq": run.last_seq,
                         "next_after": page[-1]["seq"] if page else after, "status": run.status})

    @extend_schema(parameters=[OpenApiParameter("format", str, enum=["json", "csv"])],
                   responses={(200, "application/json"): MetricsSerializer, (200, "text/csv"): OpenApiTypes.STR})
    @action(detail=True, methods=["get"], url_path="metrics",
            renderer_classes=[JSONRenderer, CSVRenderer, BrowsableAPIRenderer])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        fmt = request.accepted_renderer.format
        rows = [{"iteration": e.data["iteration"], "values": e.data["values"]}
                for e in RunEvent.objects.filter(run=run, type="metrics").order_by("seq")]
        if fmt == "json":
            return Response({"run": run.pk, "metrics": rows})
        keys = sorted({k for r in rows for k in r["values"]})
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["iteration", *keys])
        for r in rows:
            writer.writerow([r["iteration"], *(r["values"].get(k, "") for k in keys)])
        response = Response(out.getvalue(), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
        return response

    @extend_schema(responses=GameSerializer(many=True))
    @action(detail=True, methods=["get"])
    def games(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        page = self.paginate_queryset(run.games.order_by("-iteration", "-index"))
        return self.get_paginated_response(GameSerializer(page, many=True).data)

    @extend_schema(responses=CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a run has few checkpoints: one plain list
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        sync_checkpoints(run)
        return Response(CheckpointSerializer(run.checkpoints.all(), many=True).data)

    @extend_schema(responses={(200, "application/zip"): bytes})
    @action(detail=True, methods=["get"], url_path=r"checkpoints/(?P<iteration>\d+)/download")
    def download_checkpoint(self, request: Request, pk: str | None = None, iteration: str = "0") -> HttpResponse | Response:
        run = self.get_object()
        # The route's \d+ also matches other scripts' digits and numbers too long for int(); neither names a checkpoint.
        number = int(iteration) if iteration.isascii() and len(iteration) < 10 else None
        ckpt = run.checkpoints.filter(iteration=number).first() if number is not None else None
        folder = Path(ckpt.path).resolve() if ckpt else None
        # Only files inside this run's own folder are ever served.
        if folder is None or not folder.is_dir() or not folder.is_relative_to(run.run_dir.resolve()):
            return Response({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
        response = StreamingHttpResponse(zip_chunks_async(folder), content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{folder.name}.zip"'
        return response
