"""REST shapes of runs, events, games and checkpoints; submission is validated by the core's own config."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from rest_framework import serializers

from earl_core.config import FLOAT_MAX_BITS, config_errors
from webapp.accounts.models import Membership, Team
from webapp.api_errors import FieldErrors, config_field_errors
from webapp.runs.models import Checkpoint, Game, Run
from webapp.scheduling.gang import SHAPES, resources_errors

# Fields of the core config the service owns: where a run writes is not the user's choice.
MAX_EXPECTED_S = 30 * 24 * 3600
"""A month: a longer estimate is a typo, and would make the run look like it never ends."""
SERVICE_OWNED = {"output_dir": "set by the service (each run writes into its own folder)"}
MAX_DEPTH = 16
"""Levels of objects and lists a submitted value may nest (a config has 2)."""


class RunSerializer(serializers.ModelSerializer):
    team_name = serializers.CharField(source="team.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    total_iterations = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = ["id", "name", "team", "team_name", "owner", "status", "priority", "config", "config_version",
                  "resources", "preemptible", "expected_duration_s", "created_at", "started_at", "finished_at",
                  "iterations_done", "total_iterations", "cancel_requested", "summary", "error", "last_seq",
                  "cloned_from", "queue", "preemptions", "preempt_requested"]
        read_only_fields = fields

    def to_representation(self, run: Run) -> dict[str, Any]:
        data = super().to_representation(run)
        # The scheduler's last word matters only while the run waits; afterwards it would be stale.
        if run.status != Run.Status.QUEUED:
            data["queue"] = None
        return data

    def get_total_iterations(self, run: Run) -> int | None:
        value = run.config.get("iterations") if isinstance(run.config, dict) else None
        return value if isinstance(value, int) else None


def unstorable_errors(value: Any, field: str, *, depth: int = 0) -> list[dict[str, Any]]:
    """Every place in a JSON value holding text with a NUL character, an integer beyond a float, or nesting deeper
    than MAX_DEPTH.

    No field accepts any of them, and the database (PostgreSQL stores no NUL), float arithmetic or Python's
    recursion limit (a message quoting the value) would fail on them before any check could name the field.
    """
    if depth > MAX_DEPTH:
        return [{"field": field, "message": f"nested deeper than {MAX_DEPTH} levels",
                 "allowed": f"at most {MAX_DEPTH} levels of objects and lists"}]
    if isinstance(value, str) and "\x00" in value:
        return [{"field": field.replace("\x00", "\\u0000"), "message": "contains a NUL character",
                 "allowed": "text without \\u0000"}]
    if isinstance(value, int) and value.bit_length() > FLOAT_MAX_BITS:
        return [{"field": field, "message": f"an integer of {value.bit_length()} bits is too large",
                 "allowed": "a number below 1.8e308"}]
    errors: list[dict[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            errors += (unstorable_errors(key, f"{field}.{key}")
                       or unstorable_errors(item, f"{field}.{key}", depth=depth + 1))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            errors += unstorable_errors(item, f"{field}[{i}]", depth=depth + 1)
    return errors


def team_for(user: Any, value: Any) -> Team:
    """The team named by id or slug among the user's teams; a field error listing them otherwise."""
    mine = Team.objects.filter(memberships__user=user).distinct()
    team = None
    if isinstance(value, bool):
        team = None
    elif isinstance(value, int) or (isinstance(value, str) and value.isascii() and value.isdecimal()):
        team = mine.filter(pk=int(value)).first() if int(value) < 2**63 else None
    elif isinstance(value, str) and "\x00" not in value:  # PostgreSQL cannot even compare text holding NUL
        team = mine.filter(slug=value).first()
    if team is None:
        allowed = ", ".join(f"{t.pk} ({t.slug})" for t in mine) or "none: you belong to no team"
        raise FieldErrors([{"field": "team", "message": f"{value!r} is not one of your teams", "allowed": allowed}])
    return team


def service_config_errors(config: Any) -> list[dict[str, Any]]:
    """Core validation of every field, plus the service's own rules."""
    errors = config_field_errors(config_errors(config))
    if isinstance(config, dict):
        for key, why in SERVICE_OWNED.items():
            if key in config:
                errors.insert(0, {"field": f"config.{key}", "message": why, "allowed": "leave it out"})
        path = (config.get("model") or {}).get("path") if isinstance(config.get("model"), dict) else None
        if isinstance(path, str) and not _allowed_model_path(path):
            errors.append({"field": "config.model.path", "message": f"{path!r} is outside the shared model folder",
                           "allowed": f"a folder under {settings.EARL_MODELS_DIR}, or a hub id like org/name"})
    return errors


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _allowed_model_path(path: str) -> bool:
    """Local paths only from the shared models folder (a run must not read another team's files).

    A hub id ("org/name") is allowed only when no such folder exists relative to the worker's working folder:
    from_pretrained would load that folder first (runs/service/run-000007 would pass for a hub id).
    """
    if _HUB_ID.match(path) and not Path(path).exists() and ".." not in PurePosixPath(path).parts:
        return True
    root = settings.EARL_MODELS_DIR.resolve()
    try:
        return Path(path).expanduser().resolve().is_relative_to(root)
    except (OSError, RuntimeError, ValueError):  # ValueError: a NUL character in the path
        return False


class RunCreateSerializer(serializers.Serializer):
    """Every field is checked in `validate`, so one answer names every bad field at once."""

    name = serializers.JSONField(required=False, help_text="1-100 characters (default: config.name or 'run')")
    team = serializers.JSONField(required=False, help_text="team id or slug")
    config = serializers.JSONField(required=False, help_text="the core run config (see README's config reference)")
    priority = serializers.JSONField(required=False, help_text="low | normal | high | urgent (team admins)")
    resources = serializers.JSONField(required=False, help_text=f"the run's gang of bundles: {SHAPES}")
    preemptible = serializers.JSONField(required=False, help_text="true: a higher-priority run may checkpoint it "
                                        "and requeue it (it resumes from the checkpoint); default false")
    expected_duration_s = serializers.JSONField(required=False, help_text="your estimate of its run time in "
                                                f"seconds (1..{MAX_EXPECTED_S}); lets it backfill; default null")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        user = self.context["request"].user
        # Refused before anything else reads the values: they would fail the database or the arithmetic, not a check.
        errors = [e for key, value in attrs.items() for e in unstorable_errors(value, key)]
        if errors:
            self.field_errors = errors
            raise serializers.ValidationError({e["field"]: [e["message"]] for e in errors})
        name = attrs.get("name")
        if name is not None and not (isinstance(name, str) and 1 <= len(name.strip()) <= 100):
            errors.append({"field": "name", "message": f"invalid name {str(name)[:40]!r}", "allowed": "1-100 characters"})
        priority = attrs.get("priority", Run.Priority.NORMAL)
        if priority not in Run.Priority.values:
            errors.append({"field": "priority", "message": f"unknown priority {str(priority)[:40]!r}",
                           "allowed": ", ".join(Run.Priority.values)})
        team = None
        if "team" not in attrs:
            errors.append({"field": "team", "message": "required", "allowed": "one of your teams' ids or slugs"})
        else:
            try:
                team = team_for(user, attrs["team"])
            except FieldErrors as exc:
                errors += exc.errors
        if team is not None:
            member = Membership.objects.get(user=user, team=team)
            if not member.can_launch:
                errors.append({"field": "team", "message": f"your role in {team.slug} is {member.role}; it cannot launch runs",
                               "allowed": "a team where you are admin or member"})
            elif priority == Run.Priority.URGENT and member.role != Membership.Role.ADMIN:
                errors.append({"field": "priority", "message": "urgent is for team admins", "allowed": "low, normal, high"})
        if "config" not in attrs:
            errors.append({"field": "config", "message": "required", "allowed": "a JSON object (the run config)"})
        else:
            errors += service_config_errors(attrs["config"])
        errors += config_field_errors(resources_errors(attrs.get("resources")), prefix="")
        preemptible = attrs.get("preemptible", False)
        if not isinstance(preemptible, bool):
            errors.append({"field": "preemptible", "message": f"got {str(preemptible)[:40]!r}",
                           "allowed": "true or false"})
        expected = attrs.get("expected_duration_s")
        if expected is not None and (isinstance(expected, bool) or not isinstance(expected, (int, float))
                                     or not 1 <= expected <= MAX_EXPECTED_S):
            errors.append({"field": "expected_duration_s", "message": f"got {str(expected)[:40]!r}",
                           "allowed": f"seconds from 1 to {MAX_EXPECTED_S}, or null (unknown)"})
        if errors:
            self.field_errors = errors
            raise serializers.ValidationError({e["field"]: [e["message"]] for e in errors})
        config = attrs["config"]
        return {"team": team, "config": config, "priority": priority, "resources": attrs.get("resources") or {},
                "preemptible": preemptible, "expected_duration_s": None if expected is None else float(expected),
                "name": (name or "").strip() or str(config.get("name") or "run")[:100]}


def validated(serializer: serializers.Serializer) -> dict[str, Any]:
    """The serializer's data, or a FieldErrors 400 that keeps each error's allowed values."""
    if serializer.is_valid():
        return serializer.validated_data
    rich = list(getattr(serializer, "field_errors", []))
    raise FieldErrors(rich or [{"field": f, "message": str(m[0] if isinstance(m, list) else m), "allowed": None}
                               for f, m in serializer.errors.items()])


class CloneSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)


class GameSerializer(serializers.ModelSerializer):
    class Meta:
        model = Game
        fields = ["id", "iteration", "index", "opponent", "agent_side", "result", "reward", "moves", "transcript"]


class EventSerializer(serializers.Serializer):
    """One stored event in the core's envelope (documents the events page; the view writes the dicts itself)."""

    v = serializers.IntegerField()
    run = serializers.IntegerField()
    seq = serializers.IntegerField()
    ts = serializers.CharField(help_text="ISO 8601, UTC")
    type = serializers.CharField()
    data = serializers.DictField()


class EventPageSerializer(serializers.Serializer):
    events = EventSerializer(many=True)
    last_seq = serializers.IntegerField()
    next_after = serializers.IntegerField(help_text="pass as ?after= for the next page")
    status = serializers.CharField(help_text="the run's status now")


class MetricsRowSerializer(serializers.Serializer):
    iteration = serializers.IntegerField()
    values = serializers.DictField(help_text="namespaced metric keys (losses/kl, rollout/win_rate, ...) -> values")


class MetricsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    metrics = MetricsRowSerializer(many=True)


class CheckpointSerializer(serializers.ModelSerializer):
    download = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["iteration", "size_bytes", "created_at", "download"]

    def get_download(self, ckpt: Checkpoint) -> str:
        return f"/api/runs/{ckpt.run_id}/checkpoints/{ckpt.iteration}/download/"
