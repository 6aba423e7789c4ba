"""Security rules: a revoked token stops working everywhere, sign-in is throttled (API and page) and not by a header
the client writes, forms and session-authenticated API calls need the CSRF token, oversize bodies get a 413, and a
checkpoint download serves only files inside its own run's folder."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from earl_core.checkpoints import STATE_FILE
from tests.webapp.conftest import TINY_CONFIG
from tests.webapp.sockets import open_socket, refusal_code
from webapp.accounts.models import ApiToken, Team
from webapp.runs.models import Checkpoint, Run

RATE = 3


@pytest.fixture(autouse=True)
def fresh_limits(settings: Any) -> Iterator[None]:
    """A low sign-in rate (the throttles read it live) and an empty cache: throttles count there, across tests."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"login": f"{RATE}/min"}}
    cache.clear()
    yield
    cache.clear()


def _run(owner: Any, team: Team) -> Run:
    return Run.objects.create(team=team, owner=owner, name="r", config=TINY_CONFIG)


# ---- token revoke ---------------------------------------------------------------------------------------------

@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_revoked_token_opens_neither_the_api_nor_a_websocket(alice: Any, ants: Team) -> None:
    run = await sync_to_async(_run)(alice, ants)
    _, key = await sync_to_async(ApiToken.issue)(alice)
    before = open_socket(f"/ws/runs/{run.pk}/", key)
    assert (await before.connect(timeout=5))[0]
    await before.disconnect()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert (await sync_to_async(client.delete)("/api/auth/token/")).status_code == 204
    assert (await sync_to_async(client.get)("/api/runs/")).status_code == 401
    assert await refusal_code(f"/ws/runs/{run.pk}/", key) == 4401


# ---- throttling -------------------------------------------------------------------------------------------------

def _token_request(client: APIClient, password: str = "wrong", **extra: Any) -> int:
    return client.post("/api/auth/token/", {"username": "alice", "password": password}, format="json",
                       **extra).status_code


@pytest.mark.django_db
def test_the_token_endpoint_answers_429_past_the_login_rate(alice: Any) -> None:
    client = APIClient()
    assert [_token_request(client) for _ in range(RATE)] == [400] * RATE
    assert _token_request(client, "alice-password-123") == 429  # even the right password waits
    assert _token_request(client, REMOTE_ADDR="10.0.0.9") == 400  # another address has its own count


@pytest.mark.django_db
def test_a_made_up_forwarded_for_header_does_not_reset_the_count(alice: Any) -> None:
    client = APIClient()
    codes = [_token_request(client, HTTP_X_FORWARDED_FOR=f"203.0.113.{i}") for i in range(RATE + 2)]
    assert codes == [400] * RATE + [429, 429]


def _sign_in(client: Client, password: str, **extra: Any) -> Any:
    return client.post("/login/", {"username": "alice", "password": password}, **extra)


@pytest.mark.django_db
def test_the_sign_in_page_refuses_an_address_after_too_many_failures(alice: Any) -> None:
    browser = Client()
    assert [_sign_in(browser, "wrong").status_code for _ in range(RATE)] == [200] * RATE  # form with the error
    refused = _sign_in(browser, "alice-password-123")
    assert refused.status_code == 429 and b"Too many failed sign-ins" in refused.content
    assert "_auth_user_id" not in browser.session
    other = Client(REMOTE_ADDR="10.0.0.9")
    assert _sign_in(other, "alice-password-123").status_code == 302  # another address signs in


@pytest.mark.django_db
def test_successful_sign_ins_are_not_counted(alice: Any) -> None:
    for _ in range(RATE + 1):
        browser = Client()
        assert _sign_in(browser, "alice-password-123").status_code == 302


# ---- CSRF ------------------------------------------------------------------------------------------------------

def _csrf_from(client: Client, page: str) -> str:
    client.get(page)
    return client.cookies["csrftoken"].value


@pytest.mark.django_db
def test_the_sign_in_form_needs_its_csrf_token(alice: Any) -> None:
    browser = Client(enforce_csrf_checks=True)
    assert _sign_in(browser, "alice-password-123").status_code == 403
    token = _csrf_from(browser, "/login/")
    assert browser.post("/login/", {"username": "alice", "password": "alice-password-123",
                                    "csrfmiddlewaretoken": token}).status_code == 302
    assert browser.post("/logout/").status_code == 403  # signing out is a form too
    assert browser.post("/logout/", {"csrfmiddlewaretoken": _csrf_from(browser, "/")}).status_code == 302


@pytest.mark.django_db
def test_session_calls_to_the_api_need_the_csrf_header(alice: Any, ants: Team) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    run = _run(alice, ants)
    body = {"team": "ants", "config": TINY_CONFIG}
    assert browser.post("/api/runs/", body, content_type="application/json").status_code == 403
    assert browser.post(f"/api/runs/{run.pk}/cancel/").status_code == 403
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED
    token = _csrf_from(browser, "/")
    assert browser.post("/api/runs/", body, content_type="application/json",
                        headers={"X-CSRFToken": token}).status_code == 201
    assert browser.post(f"/api/runs/{run.pk}/cancel/", headers={"X-CSRFToken": token}).status_code == 200


@pytest.mark.django_db
def test_token_calls_to_the_api_need_no_csrf(as_alice: APIClient) -> None:
    as_alice.handler.enforce_csrf_checks = True
    got = as_alice.post("/api/runs/", {"team": "ants", "config": TINY_CONFIG}, format="json")
    assert got.status_code == 201, got.content


# ---- oversize bodies ---------------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("path, method", [("/api/runs/", "post"), ("/api/teams/ants/quota/", "patch"),
                                          ("/api/auth/token/", "post")])
def test_a_body_over_the_limit_is_a_413_naming_the_limit(path: str, method: str, as_alice: APIClient, alice: Any,
                                                         settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    alice.is_staff = True  # quotas are staff's to write; others are refused before their body is read
    alice.save()
    got = getattr(as_alice, method)(path, {"team": "ants", "config": TINY_CONFIG, "pad": "x" * 5000}, format="json")
    assert got.status_code == 413
    assert got.json()["errors"] == [{"field": "body", "message": "the request body is too large",
                                     "allowed": "at most 4096 bytes"}]


@pytest.mark.django_db
def test_an_oversize_sign_in_form_is_a_400_not_a_500(alice: Any, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    assert Client().post("/login/", {"username": "alice", "password": "x" * 5000}).status_code == 400


# ---- downloads stay inside the run's own folder --------------------------------------------------------------------

def _checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def _download(client: APIClient, run: Run, iteration: int) -> Any:
    return client.get(f"/api/runs/{run.pk}/checkpoints/{iteration}/download/")


@pytest.mark.django_db
def test_a_checkpoint_outside_the_runs_folder_is_never_served(as_alice: APIClient, alice: Any, ants: Team,
                                                              charlie: Any, bees: Team, tmp_path: Path) -> None:
    run, other = _run(alice, ants), _run(charlie, bees)
    inside = _checkpoint(run.run_dir / "checkpoints" / "iter_000001")
    secret = _checkpoint(other.run_dir / "checkpoints" / "iter_000001")
    (run.run_dir / "checkpoints" / "iter_000003").symlink_to(secret, target_is_directory=True)
    traversal = run.run_dir / "checkpoints" / ".." / ".." / other.run_dir.name / "checkpoints" / "iter_000001"
    rows = {1: inside, 2: traversal, 3: run.run_dir / "checkpoints" / "iter_000003", 4: secret, 5: tmp_path}
    for iteration, path in rows.items():
        Checkpoint.objects.create(run=run, iteration=iteration, path=str(path))
    assert _download(as_alice, run, 1).status_code == 200
    for iteration in (2, 3, 4, 5):  # traversal, a symlink out, another run's folder, a folder elsewhere
        assert _download(as_alice, run, iteration).status_code == 404, iteration


@pytest.mark.django_db
def test_links_inside_a_checkpoint_are_left_out_of_the_zip(as_alice: APIClient, alice: Any, ants: Team,
                                                          tmp_path: Path) -> None:
    run = _run(alice, ants)
    folder = _checkpoint(run.run_dir / "checkpoints" / "iter_000001")
    (tmp_path / "secret.txt").write_text("not yours")
    (folder / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (folder / "leak_dir").symlink_to(tmp_path, target_is_directory=True)
    Checkpoint.objects.create(run=run, iteration=1, path=str(folder))
    got = _download(as_alice, run, 1)
    names = zipfile.ZipFile(io.BytesIO(b"".join(got))).namelist()  # a streamed response
    assert sorted(names) == ["iter_000001/earl_state.json", "iter_000001/model.safetensors"]
