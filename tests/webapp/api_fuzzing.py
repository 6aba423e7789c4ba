"""Requests generated from the service's own OpenAPI schema, sent to the Django app in-process, their answers counted.

Shared by tests/webapp/test_api_fuzz.py (a few examples per operation) and bench/api_fuzz.py (many).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import schemathesis
from django.conf import settings as settings_
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import response_schema_conformance

from earl_core.checkpoints import STATE_FILE
from webapp.accounts.models import ApiToken, Membership, Team
from webapp.runs.models import Run
from webapp.runs.services import sync_checkpoints

SCHEMA_PATH = "/api/schema/?format=json"
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
VALID_CONFIG = {"iterations": 2, "model": {"preset": "tiny"}, "rollout": {"groups": 2, "group_size": 2}}
class _Absent:
    """A key left out of a body (a plain object() would hash differently on each run: its repr holds its address)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()
VALID_SUBMISSION = {"name": "fuzzed", "priority": "high", "resources": {"cpus": 1},
                    "preemptible": True, "expected_duration_s": 600}
SIGN_IN = {"username": "alice", "password": "alice-password-123"}


@dataclass(frozen=True)
class World:
    """What generated requests may point at, so fuzzing gets past the 404 of a random id into the real code."""

    own_run: int
    other_run: int
    """Another team's run: must answer exactly like a missing one, never 5xx."""
    own_team: str
    other_team: str
    checkpoint: int
    """An iteration of own_run with a complete checkpoint folder on disk (the download serves a zip)."""
    new_key: Callable[[], str]
    """A fresh token per request: DELETE /api/auth/token/ revokes the one it is sent with."""


@dataclass
class Tally:
    """Answers per operation and status; 5xx and answers that contradict the schema, with how to reproduce them."""

    statuses: Counter[int] = field(default_factory=Counter)
    per_operation: dict[str, Counter[int]] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    nonconforming: list[str] = field(default_factory=list)
    no_cases: list[str] = field(default_factory=list)
    """Operations the mode can generate nothing for (nothing in a parameterless GET can be made invalid)."""

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def summary(self) -> dict[str, Any]:
        return {"operations": len(self.per_operation), "requests": self.requests,
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "server_errors": len(self.server_errors), "nonconforming": len(self.nonconforming),
                "no_cases": self.no_cases,
                "per_operation": {op: {str(k): v for k, v in sorted(c.items())}
                                  for op, c in sorted(self.per_operation.items())}}


def build_world(runs_dir: Path) -> World:
    """Alice (staff, admin of Ants, so quota writes run too) with a run and a checkpoint; Charlie's run in Bees."""
    users = get_user_model().objects
    ants, bees = Team.objects.create(name="Ants", slug="ants"), Team.objects.create(name="Bees", slug="bees")
    alice = users.create_user(username="alice", password="alice-password-123", is_staff=True)
    charlie = users.create_user(username="charlie", password="charlie-password-123")
    Membership.objects.create(user=alice, team=ants, role="admin")
    Membership.objects.create(user=charlie, team=bees, role="member")
    own = Run.objects.create(team=ants, owner=alice, name="own", config=VALID_CONFIG)
    other = Run.objects.create(team=bees, owner=charlie, name="other", config=VALID_CONFIG)
    ckpt = runs_dir / f"run-{own.pk:06d}" / "checkpoints" / "iter_000001"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights")
    sync_checkpoints(own)
    return World(own_run=own.pk, other_run=other.pk, own_team=ants.slug, other_team=bees.slug, checkpoint=1,
                 new_key=lambda: ApiToken.issue(alice, "fuzz")[1])


@contextmanager
def in_process_app() -> Iterator[WSGIHandler]:
    """Django's own WSGI handler, to be used inside one database transaction that the caller rolls back.

    Like Django's test client, it must not close the connection at each request's end (that would end the
    transaction). The token endpoint checks passwords, so a cheap hasher keeps the run short, and a high sign-in rate
    lets its examples reach the checks instead of the throttle (tests/webapp/test_security.py tests that). The
    throttle counts in the cache: it starts, and is left, empty.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    cache.clear()
    rates = {**settings_.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"login": "1000000/min"}}
    try:
        with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
                               REST_FRAMEWORK=rates):
            yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
        cache.clear()


def load_schema(app: WSGIHandler) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_wsgi(SCHEMA_PATH, app)


def _pick(value: Any, choices: list[Any], *, where: str) -> Any:
    """One of `choices` or the generated value itself, decided by the value and where it goes (so Hypothesis can
    still shrink it, and an empty body does not make the same choice for every field)."""
    slot = int(hashlib.sha1(repr((where, value)).encode()).hexdigest(), 16) % (len(choices) + 1)
    return value if slot == len(choices) else choices[slot]


def _aim_field(body: dict[str, Any], key: str, choices: list[Any]) -> None:
    """Set body[key] to one of `choices` or leave what was generated (including nothing); ABSENT removes it."""
    picked = _pick(body.get(key, ABSENT), choices, where=key)
    if picked is ABSENT:
        body.pop(key, None)
    else:
        body[key] = picked


def aim(case: schemathesis.Case, world: World) -> None:
    """Point most generated path parameters at real objects (our own, another team's, or the generated value), and
    most submissions at a team and a config that pass, so the other fields' checks and the submission run too."""
    body = case.body if isinstance(case.body, dict) else {}
    if case.operation.label == "POST /api/runs/":
        _aim_field(body, "team", [world.own_team, world.own_team, world.other_team])
        _aim_field(body, "config", [VALID_CONFIG, VALID_CONFIG])
        for key, valid in VALID_SUBMISSION.items():
            _aim_field(body, key, [valid, valid, ABSENT])
    if case.operation.label == "POST /api/auth/token/":
        for key, valid in SIGN_IN.items():
            _aim_field(body, key, [valid])
    params = case.path_parameters or {}
    if "id" in params:
        params["id"] = _pick(params["id"], [world.own_run, world.own_run, world.other_run], where="id")
    if "team" in params:
        params["team"] = _pick(params["team"], [world.own_team, world.own_team, world.other_team], where="team")
    if "iteration" in params:
        params["iteration"] = _pick(params["iteration"], [world.checkpoint], where="iteration")


def send(case: schemathesis.Case, *, app: WSGIHandler, world: World, tally: Tally) -> Any:
    """Send one case as a signed-in team member; count it; raise AssertionError on a 5xx or an off-schema answer."""
    aim(case, world)
    response = case.call(app=app, headers={"Authorization": f"Token {world.new_key()}"})
    tally.statuses[response.status_code] += 1
    tally.per_operation.setdefault(case.operation.label, Counter())[response.status_code] += 1
    if response.status_code >= 500:
        report = f"{case.operation.label} -> {response.status_code}\n{case.as_curl_command()}"
        tally.server_errors.append(report)
        raise AssertionError(report)
    try:
        # Checks only the statuses the schema documents (2xx); a 400's error shape is the handler's, tested elsewhere.
        case.validate_response(response, checks=[response_schema_conformance])
    except FailureGroup as group:  # the answer contradicts the published schema
        why = "; ".join(f"{f.title}: {str(f.message).splitlines()[0]}" for f in group.exceptions)
        report = f"{case.operation.label} -> {response.status_code} off-schema: {why}"
        tally.nonconforming.append(report)
        raise AssertionError(report) from None
    return response


def fuzz_operation(operation: Any, *, app: WSGIHandler, world: World, tally: Tally, mode: GenerationMode,
                   max_examples: int, random_seed: int | None = None) -> str | None:
    """Run Hypothesis over one operation; the shrunk failure's report, or None when every answer was fine.

    Without a seed the examples are the same on every run (a test must not pass or fail by chance).
    """

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=random_seed is None,
              print_blob=False, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        send(case, app=app, world=world, tally=tally)

    if random_seed is not None:
        check = seed(random_seed)(check)

    try:
        check()
    except AssertionError as exc:
        return str(exc)
    except ExceptionGroup as group:  # Hypothesis found several distinct failures
        return "\n".join(str(e) for e in group.exceptions)
    except Unsatisfiable:
        tally.no_cases.append(f"{mode.value} {operation.label}")
    return None


def operations(schema: schemathesis.BaseSchema) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]
