"""REST API: auth, validation messages, team isolation, filters, pagination and state changes."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.webapp.conftest import TINY_CONFIG, client_for
from webapp.accounts.models import ApiToken, Membership
from webapp.runs.models import Run, RunEvent
from webapp.runs.services import store_events

pytestmark = pytest.mark.django_db


def submit(client: APIClient, team: str = "ants", config: dict[str, Any] | None = None, **extra: Any) -> Any:
    return client.post("/api/runs/", {"team": team, "config": config or TINY_CONFIG, "name": "first", **extra},
                       format="json")


def fields(response: Any) -> dict[str, dict[str, Any]]:
    return {e["field"]: e for e in response.json()["errors"]}


# ---- authentication -------------------------------------------------------------------------------

def test_token_from_password_then_api_access(alice: Any) -> None:
    anon = APIClient()
    got = anon.post("/api/auth/token/", {"username": "alice", "password": "alice-password-123"}, format="json")
    assert got.status_code == 200
    anon.credentials(HTTP_AUTHORIZATION=f"Token {got.json()['token']}")
    assert anon.get("/api/teams/").json()["results"][0]["slug"] == "ants"


def test_wrong_password_is_a_field_error_not_a_500(alice: Any) -> None:
    got = APIClient().post("/api/auth/token/", {"username": "alice", "password": "nope"}, format="json")
    assert got.status_code == 400
    assert "password" in fields(got)


@pytest.mark.parametrize("path", ["/api/runs/", "/api/teams/", "/api/cluster/", "/api/runs/1/", "/api/runs/1/events/"])
def test_every_endpoint_needs_auth(path: str, db: None) -> None:
    assert APIClient().get(path).status_code == 401


def test_bad_and_revoked_tokens_are_refused(alice: Any) -> None:
    token, key = ApiToken.issue(alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-key")
    assert client.get("/api/runs/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200
    assert client.delete("/api/auth/token/").status_code == 204
    assert client.get("/api/runs/").status_code == 401
    token.refresh_from_db()
    assert token.revoked_at is not None


# ---- submission and validation ---------------------------------------------------------------------

def test_submit_creates_a_queued_run_with_its_first_event(as_alice: APIClient) -> None:
    got = submit(as_alice)
    assert got.status_code == 201, got.json()
    body = got.json()
    assert body["status"] == "queued" and body["team_name"] == "Ants" and body["owner"] == "alice"
    run = Run.objects.get(pk=body["id"])
    assert [(e.seq, e.type, e.data["status"]) for e in run.events.all()] == [(1, "run.status", "queued")]
    assert run.last_seq == 1


def test_every_bad_config_field_is_named_with_allowed_values(as_alice: APIClient) -> None:
    bad = {"rollout": {"temperature": 9, "groups": 0}, "algo": {"name": "ppo"}, "colour": "red", "output_dir": "/etc"}
    got = submit(as_alice, config=bad)
    assert got.status_code == 400
    errors = fields(got)
    assert set(errors) >= {"config.rollout.temperature", "config.rollout.groups", "config.algo.name", "config.colour",
                           "config.output_dir"}
    assert "grpo" in errors["config.algo.name"]["allowed"]
    assert errors["config.rollout.temperature"]["allowed"] == "0.0..2.0"


@pytest.mark.parametrize("payload, field", [
    ({"team": "ants", "config": "iterations: 3"}, "config"),
    ({"team": "ants"}, "config"),
    ({"config": TINY_CONFIG}, "team"),
    ({"team": "ants", "config": TINY_CONFIG, "priority": "asap"}, "priority"),
    ({"team": "ants", "config": TINY_CONFIG, "name": "x" * 101}, "name"),
    ({"team": [1, 2], "config": TINY_CONFIG}, "team"),
])
def test_malformed_submissions_name_the_field(as_alice: APIClient, payload: dict[str, Any], field: str) -> None:
    got = as_alice.post("/api/runs/", payload, format="json")
    assert got.status_code == 400, got.content
    assert field in fields(got)


def test_non_json_body_is_a_400(as_alice: APIClient) -> None:
    got = as_alice.post("/api/runs/", "{not json", content_type="application/json")
    assert got.status_code == 400


def test_local_model_paths_outside_the_shared_folder_are_refused(as_alice: APIClient) -> None:
    got = submit(as_alice, config={**TINY_CONFIG, "model": {"path": "/etc"}})
    assert got.status_code == 400 and "config.model.path" in fields(got)


def test_cannot_launch_in_a_team_you_are_not_in(as_charlie: APIClient, alice: Any) -> None:
    got = submit(as_charlie, team="ants")
    assert got.status_code == 400
    assert "bees" in fields(got)["team"]["allowed"]


def test_viewers_cannot_launch_and_members_cannot_use_urgent(as_bob: APIClient, bob: Any, ants: Any) -> None:
    assert fields(submit(as_bob, priority="urgent"))["priority"]["allowed"] == "low, normal, high"
    Membership.objects.filter(user=bob).update(role="viewer")
    assert "team" in fields(submit(as_bob))


# ---- isolation -----------------------------------------------------------------------------------------

def test_teammates_share_runs_and_other_teams_see_nothing(as_alice: APIClient, as_bob: APIClient,
                                                           as_charlie: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    assert as_bob.get(f"/api/runs/{run_id}/").status_code == 200
    assert as_charlie.get("/api/runs/").json()["count"] == 0
    for path in ("", "events/", "metrics/", "games/", "checkpoints/", "checkpoints/0/download/"):
        assert as_charlie.get(f"/api/runs/{run_id}/{path}").status_code == 404, path
    for path in ("cancel/", "clone/"):
        assert as_charlie.post(f"/api/runs/{run_id}/{path}", {}, format="json").status_code == 404, path
    # exactly what a missing run looks like
    assert as_charlie.get("/api/runs/999999/").json() == as_charlie.get(f"/api/runs/{run_id}/").json()
    assert Run.objects.get(pk=run_id).status == "queued"


# ---- listing -------------------------------------------------------------------------------------------

def test_filters_search_and_pagination(as_alice: APIClient) -> None:
    for name in ("alpha", "beta", "gamma"):
        submit(as_alice, name=name)
    Run.objects.filter(name="beta").update(status="succeeded")
    page = as_alice.get("/api/runs/?page_size=2").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert [r["name"] for r in as_alice.get("/api/runs/?page_size=2&page=2").json()["results"]] == ["alpha"]
    assert as_alice.get("/api/runs/?page=9").status_code == 404
    assert [r["name"] for r in as_alice.get("/api/runs/?status=succeeded").json()["results"]] == ["beta"]
    assert [r["name"] for r in as_alice.get("/api/runs/?search=amm").json()["results"]] == ["gamma"]
    assert as_alice.get("/api/runs/?team=ants").json()["count"] == 3
    assert "status" in fields(as_alice.get("/api/runs/?status=done"))
    assert "team" in fields(as_alice.get("/api/runs/?team=bees"))


# ---- state changes ---------------------------------------------------------------------------------------

def test_cancel_queued_run_then_409(as_alice: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    got = as_alice.post(f"/api/runs/{run_id}/cancel/")
    assert got.status_code == 200 and got.json()["status"] == "cancelled"
    assert [e.data["status"] for e in RunEvent.objects.filter(run_id=run_id)] == ["queued", "cancelled"]
    again = as_alice.post(f"/api/runs/{run_id}/cancel/")
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_viewers_cannot_cancel(as_alice: APIClient, as_bob: APIClient, bob: Any) -> None:
    run_id = submit(as_alice).json()["id"]
    Membership.objects.filter(user=bob).update(role="viewer")
    assert as_bob.post(f"/api/runs/{run_id}/cancel/").status_code == 403
    assert Run.objects.get(pk=run_id).status == "queued"


@pytest.mark.parametrize("team", ["²", "٣", True, "99999999999999999999999"])
def test_odd_team_values_are_field_errors(as_alice: APIClient, team: Any) -> None:
    got = submit(as_alice, team=team)
    assert got.status_code == 400 and "team" in fields(got)
    assert "team" in fields(as_alice.get("/api/runs/", {"team": "²"}))


def test_a_relative_path_into_the_runs_folder_is_not_a_hub_id(as_alice: APIClient, runs_dir: Any, tmp_path: Any,
                                                              monkeypatch: Any) -> None:
    ckpt = tmp_path / "runs" / "run-000007" / "checkpoints"
    ckpt.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    got = submit(as_alice, config={**TINY_CONFIG, "model": {"path": "runs/run-000007"}})
    assert got.status_code == 400 and "config.model.path" in fields(got)
    assert submit(as_alice, config={**TINY_CONFIG, "model": {"path": "Qwen/Qwen2.5-0.5B"}}).status_code == 201


def test_cancel_running_run_flags_it_for_the_worker(as_alice: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    Run.objects.filter(pk=run_id).update(status="running")
    got = as_alice.post(f"/api/runs/{run_id}/cancel/").json()
    assert got["status"] == "cancelling" and got["cancel_requested"] is True
    # a late "running" status from the core does not undo the user's cancel
    store_events(run_id, [{"seq": 2, "ts": "2026-01-01T00:00:00Z", "type": "run.status", "data": {"status": "running"}}])
    assert Run.objects.get(pk=run_id).status == "cancelling"


def test_clone_copies_config_as_a_new_queued_run(as_alice: APIClient, as_bob: APIClient) -> None:
    source = submit(as_alice).json()
    got = as_bob.post(f"/api/runs/{source['id']}/clone/", {"name": "again"}, format="json")
    assert got.status_code == 201
    clone = got.json()
    assert clone["id"] != source["id"] and clone["config"] == source["config"] and clone["owner"] == "bob"
    assert clone["cloned_from"] == source["id"] and clone["status"] == "queued" and clone["name"] == "again"


# ---- events, metrics, games ----------------------------------------------------------------------------

def _core_events(run_id: int) -> None:
    ts = "2026-01-01T00:00:00Z"
    store_events(run_id, [
        {"seq": 2, "ts": ts, "type": "run.status", "data": {"status": "starting", "message": ""}},
        {"seq": 3, "ts": ts, "type": "metrics", "data": {"iteration": 0, "values": {"rollout/win_rate": 0.25}}},
        {"seq": 4, "ts": ts, "type": "game.move", "data": {"iteration": 0, "game": 3, "ply": 1, "player": "agent",
                                                           "column": 3, "board": "b", "text": "[col 3]"}},
        {"seq": 5, "ts": ts, "type": "game.end", "data": {"iteration": 0, "game": 3, "result": "win", "reward": 1.0,
                                                          "moves": "4", "agent_side": 1, "opponent": "random"}},
        {"seq": 6, "ts": ts, "type": "metrics", "data": {"iteration": 1, "values": {"rollout/win_rate": 0.5,
                                                                                    "losses/kl": 0.1}}},
    ])


def test_events_after_type_limit(as_alice: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    _core_events(run_id)
    every = as_alice.get(f"/api/runs/{run_id}/events/").json()
    assert [e["seq"] for e in every["events"]] == [1, 2, 3, 4, 5, 6] and every["last_seq"] == 6
    page = as_alice.get(f"/api/runs/{run_id}/events/?after=2&limit=2").json()
    assert [e["seq"] for e in page["events"]] == [3, 4] and page["next_after"] == 4
    assert [e["seq"] for e in as_alice.get(f"/api/runs/{run_id}/events/?type=metrics").json()["events"]] == [3, 6]
    assert "type" in fields(as_alice.get(f"/api/runs/{run_id}/events/?type=bogus"))
    assert fields(as_alice.get(f"/api/runs/{run_id}/events/?limit=0"))["limit"]["allowed"] == "1..1000"
    assert "after" in fields(as_alice.get(f"/api/runs/{run_id}/events/?after=x"))
    assert Run.objects.get(pk=run_id).status == "starting"


def test_replayed_batch_is_not_stored_twice(as_alice: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    _core_events(run_id)
    _core_events(run_id)
    assert RunEvent.objects.filter(run_id=run_id).count() == 6


def test_metrics_json_and_csv(as_alice: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    _core_events(run_id)
    rows = as_alice.get(f"/api/runs/{run_id}/metrics/").json()["metrics"]
    assert rows == [{"iteration": 0, "values": {"rollout/win_rate": 0.25}},
                    {"iteration": 1, "values": {"rollout/win_rate": 0.5, "losses/kl": 0.1}}]
    csv_text = as_alice.get(f"/api/runs/{run_id}/metrics/?format=csv").content.decode()
    assert csv_text.splitlines() == ["iteration,losses/kl,rollout/win_rate", "0,,0.25", "1,0.1,0.5"]
    assert as_alice.get(f"/api/runs/{run_id}/metrics/?format=xml").status_code == 404  # DRF: no such format


def test_games_are_assembled_from_move_events(as_alice: APIClient) -> None:
    run_id = submit(as_alice).json()["id"]
    _core_events(run_id)
    games = as_alice.get(f"/api/runs/{run_id}/games/").json()["results"]
    assert len(games) == 1
    assert games[0]["result"] == "win" and games[0]["moves"] == "4" and games[0]["transcript"][0]["text"] == "[col 3]"


def test_schema_and_docs_are_served(as_alice: APIClient) -> None:
    schema = as_alice.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/runs/{id}/cancel/" in paths and "/api/auth/token/" in paths
    docs = as_alice.get("/api/docs/").content.decode()
    assert "cdn." not in docs and "sidecar" in docs  # served offline


def test_events_holding_nul_characters_are_stored_on_every_database(as_alice: APIClient) -> None:
    """An untrained model's answer may hold U+0000, which PostgreSQL text cannot: stored (and relayed) as U+FFFD."""
    run_id = as_alice.post("/api/runs/", {"team": "ants", "config": TINY_CONFIG}, format="json").json()["id"]
    move = {"v": 1, "run": run_id, "seq": 2, "ts": "2026-12-04T12:00:00Z", "type": "game.move",
            "data": {"iteration": 0, "game": 0, "ply": 1, "column": 4, "by": "agent", "answer": "col\x00umn 4",
                     "notes": ["a\x00b"]}}
    stored = store_events(run_id, [move])
    assert stored[0]["data"]["answer"] == "col\ufffdumn 4" and stored[0]["data"]["notes"] == ["a\ufffdb"]
    event = RunEvent.objects.get(run_id=run_id, seq=2)
    assert event.data["answer"] == "col\ufffdumn 4"
    assert Run.objects.get(pk=run_id).games.get().transcript[0]["answer"] == "col\ufffdumn 4"
