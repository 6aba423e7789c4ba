"""GET/PUT/PATCH /api/teams/<team>/quota/: a team's members read its quota, site admins (staff) set it."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.accounts.models import Team
from webapp.api_errors import FieldErrors, config_field_errors
from webapp.scheduling.models import Quota
from webapp.scheduling.resources import SchedulingError
from webapp.scheduling.workload import TeamQuota

LIMITS = ("max_gpus", "max_cpus", "max_queued")
MAX_LIMIT = 2**31 - 1


class QuotaSerializer(serializers.ModelSerializer):
    """What the endpoint answers; null means unlimited (help texts come from the model)."""

    team_slug = serializers.CharField(source="team.slug", read_only=True)

    class Meta:
        model = Quota
        fields = ["team", "team_slug", *LIMITS]
        read_only_fields = ["team"]


def visible_team(user: Any, value: str) -> Team:
    """The team by id or slug: any team for staff, the caller's own teams otherwise; 404 like a missing one."""
    teams = Team.objects.all() if user.is_staff else Team.objects.filter(memberships__user=user).distinct()
    by_id = value.isascii() and value.isdecimal() and len(value) < 19
    team = teams.filter(pk=int(value)).first() if by_id else teams.filter(slug=value).first()
    if team is None:
        raise Http404
    return team


def limits_from(data: Any, current: TeamQuota, *, partial: bool) -> TeamQuota:
    """The new limits: PATCH changes the keys given, PUT replaces all (a key left out becomes unlimited)."""
    if not isinstance(data, dict):
        raise FieldErrors([{"field": "body", "message": "must be a JSON object", "allowed": ", ".join(LIMITS)}])
    errors = [{"field": str(key)[:60], "message": "unknown field", "allowed": ", ".join(LIMITS)}
              for key in data if key not in LIMITS]
    values = {name: data.get(name, getattr(current, name) if partial else None) for name in LIMITS}
    for name, value in values.items():
        # The count columns are 32-bit (a bigger value would be a database error, not a 400); no real limit is near.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_LIMIT:
            errors.append({"field": name, "message": f"{value!r} is too large", "allowed": f"0..{MAX_LIMIT}, or null"})
            values[name] = None
    try:
        # The policy's own value object checks the limits: one place says what a quota may hold.
        quota = TeamQuota(**values)
    except SchedulingError as exc:
        errors += config_field_errors([exc], prefix="")
        quota = current
    if errors:
        raise FieldErrors(errors)
    return quota


class TeamQuotaView(APIView):
    """A team's limits on the shared cluster (all null while no quota is set)."""

    @extend_schema(responses={200: QuotaSerializer})
    def get(self, request: Request, team: str) -> Response:
        return Response(_answer(visible_team(request.user, team)))

    @extend_schema(request=QuotaSerializer, responses={200: QuotaSerializer})
    def put(self, request: Request, team: str) -> Response:
        return self._update(request, team, partial=False)

    @extend_schema(request=QuotaSerializer, responses={200: QuotaSerializer})
    def patch(self, request: Request, team: str) -> Response:
        return self._update(request, team, partial=True)

    def _update(self, request: Request, team_value: str, *, partial: bool) -> Response:
        team = visible_team(request.user, team_value)
        if not request.user.is_staff:
            raise PermissionDenied("only site admins (staff) set quotas; team admins and members can read them")
        with transaction.atomic():
            row, _ = Quota.objects.select_for_update().get_or_create(team=team)
            quota = limits_from(request.data, row.as_policy(), partial=partial)
            row.max_gpus, row.max_cpus, row.max_queued = quota.max_gpus, quota.max_cpus, quota.max_queued
            row.save()
        return Response(_answer(team))


def _answer(team: Team) -> dict[str, Any]:
    row = Quota.objects.filter(team=team).first() or Quota(team=team)
    return dict(QuotaSerializer(row).data)
