"""Team isolation on every API operation, page, websocket and download: another team's objects look exactly like
missing ones (404, never 403), and anonymous callers get 401 (API), the sign-in page (pages) or a closed socket.

The operations come from the OpenAPI schema and the routes from the URLconfs, so a new endpoint without a probe here
fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from rest_framework.test import APIClient

from earl_core.checkpoints import STATE_FILE
from tests.webapp.conftest import TINY_CONFIG
from tests.webapp.sockets import open_socket, refusal_code
from webapp.accounts.models import ApiToken, Team
from webapp.pages.urls import urlpatterns as page_routes
from webapp.routing import websocket_urlpatterns
from webapp.runs.models import Run
from webapp.runs.services import sync_checkpoints

MISSING_RUN = 999_999
MISSING_TEAM = "no-such-team"


@dataclass(frozen=True)
class Target:
    """What one probe points at: a run id and a team (id or slug)."""

    run: int
    team: str


# Operations on one run or one team: `call(client, target)`. Another team's object must answer like a missing one.
ObjectCall = Callable[[APIClient, Target], Any]
OBJECT_OPERATIONS: dict[tuple[str, str], ObjectCall] = {
    ("GET", "/api/runs/{id}/"): lambda c, t: c.get(f"/api/runs/{t.run}/"),
    ("POST", "/api/runs/{id}/cancel/"): lambda c, t: c.post(f"/api/runs/{t.run}/cancel/"),
    ("POST", "/api/runs/{id}/clone/"): lambda c, t: c.post(f"/api/runs/{t.run}/clone/", {}, format="json"),
    ("GET", "/api/runs/{id}/events/"): lambda c, t: c.get(f"/api/runs/{t.run}/events/"),
    ("GET", "/api/runs/{id}/metrics/"): lambda c, t: c.get(f"/api/runs/{t.run}/metrics/"),
    ("GET", "/api/runs/{id}/games/"): lambda c, t: c.get(f"/api/runs/{t.run}/games/"),
    ("GET", "/api/runs/{id}/checkpoints/"): lambda c, t: c.get(f"/api/runs/{t.run}/checkpoints/"),
    ("GET", "/api/runs/{id}/checkpoints/{iteration}/download/"):
        lambda c, t: c.get(f"/api/runs/{t.run}/checkpoints/1/download/"),
    ("GET", "/api/teams/{team}/quota/"): lambda c, t: c.get(f"/api/teams/{t.team}/quota/"),
    ("PUT", "/api/teams/{team}/quota/"): lambda c, t: c.put(f"/api/teams/{t.team}/quota/", {}, format="json"),
    ("PATCH", "/api/teams/{team}/quota/"): lambda c, t: c.patch(f"/api/teams/{t.team}/quota/", {}, format="json"),
}
# Operations on collections: what another team's member sees is checked one by one below.
COLLECTION_OPERATIONS = {("GET", "/api/runs/"), ("POST", "/api/runs/"), ("GET", "/api/teams/"),
                         ("GET", "/api/cluster/"), ("POST", "/api/auth/token/"), ("DELETE", "/api/auth/token/")}
PUBLIC_OPERATIONS = {("POST", "/api/auth/token/")}  # signing in; it holds no team's data
PUBLIC_PAGES = {"login/", "logout/", "vendor/plotly.min.js"}


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # people are made per test


def schema_operations() -> set[tuple[str, str]]:
    paths = APIClient().get("/api/schema/?format=json").json()["paths"]
    return {(method.upper(), path) for path, ops in paths.items() for method in ops}


def anonymous_call(method: str, path: str, target: Target) -> Any:
    url = path.replace("{id}", str(target.run)).replace("{team}", target.team).replace("{iteration}", "1")
    return APIClient().generic(method, url, "{}", content_type="application/json")


@pytest.fixture
def alice_run(alice: Any, ants: Team, runs_dir: Any) -> Run:
    run = Run.objects.create(team=ants, owner=alice, name="alice-run", config=TINY_CONFIG)
    folder = run.run_dir / "checkpoints" / "iter_000001"
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text("{}")
    sync_checkpoints(run)  # what the worker does when the run ends
    return run


# ---- the API -----------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_every_operation_of_the_schema_has_an_isolation_probe() -> None:
    assert schema_operations() == set(OBJECT_OPERATIONS) | COLLECTION_OPERATIONS


@pytest.mark.django_db
@pytest.mark.parametrize("operation", sorted(set(OBJECT_OPERATIONS) | COLLECTION_OPERATIONS), ids=" ".join)
def test_anonymous_callers_get_401(operation: tuple[str, str], alice_run: Run) -> None:
    got = anonymous_call(*operation, Target(alice_run.pk, "ants"))
    expected = 400 if operation in PUBLIC_OPERATIONS else 401  # signing in answers, naming the missing fields
    assert got.status_code == expected, (operation, got.content)


@pytest.mark.django_db
@pytest.mark.parametrize("operation", sorted(OBJECT_OPERATIONS), ids=" ".join)
def test_another_teams_object_answers_like_a_missing_one(operation: tuple[str, str], alice_run: Run,
                                                         as_alice: APIClient, as_charlie: APIClient) -> None:
    call = OBJECT_OPERATIONS[operation]
    theirs = call(as_charlie, Target(alice_run.pk, "ants"))
    missing = call(as_charlie, Target(MISSING_RUN, MISSING_TEAM))
    assert theirs.status_code == missing.status_code == 404, (theirs.content, missing.content)
    assert theirs.json() == missing.json()
    assert Run.objects.get(pk=alice_run.pk).status == Run.Status.QUEUED  # nothing charlie sent changed it
    # ... and the same call reaches the object for its own team (so the 404 is isolation, not a broken probe).
    assert call(as_alice, Target(alice_run.pk, "ants")).status_code != 404


@pytest.mark.django_db
def test_run_list_and_teams_hold_only_your_teams(alice_run: Run, as_charlie: APIClient, bees: Team) -> None:
    assert as_charlie.get("/api/runs/").json()["count"] == 0
    assert [t["slug"] for t in as_charlie.get("/api/teams/").json()["results"]] == ["bees"]
    theirs, missing = (as_charlie.get("/api/runs/", {"team": value}).json() for value in ("ants", MISSING_TEAM))
    assert theirs["errors"][0]["allowed"] == missing["errors"][0]["allowed"] == f"{bees.pk} (bees)"


@pytest.mark.django_db
def test_submitting_into_another_team_is_refused_like_an_unknown_team(alice_run: Run, as_charlie: APIClient) -> None:
    answers = [as_charlie.post("/api/runs/", {"team": team, "config": TINY_CONFIG}, format="json")
               for team in ("ants", MISSING_TEAM)]
    assert [a.status_code for a in answers] == [400, 400]
    theirs, missing = (a.json()["errors"][0] for a in answers)
    assert theirs["field"] == missing["field"] == "team" and theirs["allowed"] == missing["allowed"]
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_the_cluster_view_shows_another_teams_run_without_its_name(alice_run: Run, as_charlie: APIClient) -> None:
    Run.objects.filter(pk=alice_run.pk).update(queue={"position": 1, "message": "waits for run 7 of ants"})
    queue = as_charlie.get("/api/cluster/").json()["queue"]
    assert [(r["id"], r["name"], r["message"], r["mine"]) for r in queue] == [(None, None, None, False)]


@pytest.mark.django_db
def test_revoking_a_token_touches_only_the_callers_token(alice: Any, as_charlie: APIClient) -> None:
    _, key = ApiToken.issue(alice)
    assert as_charlie.delete("/api/auth/token/").status_code == 204
    assert as_charlie.get("/api/runs/").status_code == 401
    alice_client = APIClient()
    alice_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert alice_client.get("/api/runs/").status_code == 200


# ---- pages ---------------------------------------------------------------------------------------------------

def _page_url(route: str, run: int) -> str:
    return "/" + route.replace("<int:run_id>", str(run))


@pytest.mark.django_db
@pytest.mark.parametrize("route", [str(p.pattern) for p in page_routes if str(p.pattern) not in PUBLIC_PAGES])
def test_every_page_sends_anonymous_callers_to_sign_in(route: str, alice_run: Run) -> None:
    got = Client().get(_page_url(route, alice_run.pk))
    assert got.status_code == 302 and got["Location"].startswith("/login/?next="), route


@pytest.mark.django_db
@pytest.mark.parametrize("route", [str(p.pattern) for p in page_routes if "run_id" in str(p.pattern)])
def test_pages_of_another_teams_run_are_404_like_a_missing_one(route: str, alice_run: Run, alice: Any,
                                                               charlie: Any) -> None:
    browser = Client()
    browser.force_login(charlie)
    assert browser.get(_page_url(route, alice_run.pk)).status_code == 404
    assert browser.get(_page_url(route, MISSING_RUN)).status_code == 404
    browser.force_login(alice)
    assert browser.get(_page_url(route, alice_run.pk)).status_code == 200


@pytest.mark.django_db
def test_compare_with_another_teams_run_is_404_like_a_missing_one(alice_run: Run, charlie: Any, bees: Team) -> None:
    own = Run.objects.create(team=bees, owner=charlie, name="mine", config=TINY_CONFIG)
    browser = Client()
    browser.force_login(charlie)
    theirs = browser.get(f"/compare/?runs={own.pk},{alice_run.pk}")
    missing = browser.get(f"/compare/?runs={own.pk},{MISSING_RUN}")
    assert theirs.status_code == missing.status_code == 404
    assert b"alice-run" not in theirs.content


# ---- websockets ---------------------------------------------------------------------------------------------

def _key(user: Any) -> str:
    return ApiToken.issue(user)[1]


def test_every_websocket_route_is_probed() -> None:
    assert sorted(str(p.pattern) for p in websocket_urlpatterns) == ["ws/cluster/", "ws/runs/<int:run_id>/"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_run_socket_closes_for_anonymous_and_other_teams_like_a_missing_run(alice_run: Run, alice: Any,
                                                                                 charlie: Any) -> None:
    charlie_key = await sync_to_async(_key)(charlie)
    for path, key, code in ((f"/ws/runs/{alice_run.pk}/", None, 4401),
                            (f"/ws/runs/{alice_run.pk}/", charlie_key, 4404),
                            (f"/ws/runs/{MISSING_RUN}/", charlie_key, 4404)):
        assert await refusal_code(path, key) == code, (path, code)
    own = open_socket(f"/ws/runs/{alice_run.pk}/", await sync_to_async(_key)(alice))
    assert (await own.connect(timeout=5))[0]
    await own.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db
async def test_cluster_socket_closes_for_anonymous_callers() -> None:
    assert await refusal_code("/ws/cluster/", None) == 4401
