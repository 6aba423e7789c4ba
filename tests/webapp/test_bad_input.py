"""Bad input: malformed websocket messages get an error frame and the server goes on serving; fuzzed run configs get
a typed error naming the field, from the core and from the API (a 400, never a 500)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, get_type_hints

import pytest
from asgiref.sync import sync_to_async
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from earl_core.config import RunConfig, config_errors
from earl_core.errors import ConfigError
from tests.webapp.conftest import TINY_CONFIG
from tests.webapp.sockets import open_socket, refusal_code
from webapp.accounts.models import ApiToken
from webapp.runs.live import publish_events
from webapp.runs.models import Run
from webapp.runs.services import store_events

# ---- websockets ------------------------------------------------------------------------------------------------

GARBAGE_TEXT = ["not json", "[1, 2]", "null", "42", '"ping"', "{", "[" * 100_000, "x" * 1_000_000,
                json.dumps({"type": "subscribe"}), json.dumps({"type": 5}), json.dumps({"type": ["ping"]}),
                json.dumps({"type": None}), json.dumps({"kind": "ping"}), "\x00\xff\ud7ff"]


def _viewer_keys(alice: Any, bob: Any) -> tuple[str, str]:
    return ApiToken.issue(alice)[1], ApiToken.issue(bob)[1]


def _log(seq: int) -> dict[str, Any]:
    return {"v": 1, "run": 0, "seq": seq, "ts": "2026-01-01T00:00:00Z", "type": "log",
            "data": {"level": "info", "message": f"e{seq}"}}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_malformed_messages_get_error_frames_and_other_sockets_keep_streaming(alice: Any, bob: Any,
                                                                                   ants: Any) -> None:
    run = await sync_to_async(Run.objects.create)(team=ants, owner=alice, name="watched", config=TINY_CONFIG)
    alice_key, bob_key = await sync_to_async(_viewer_keys)(alice, bob)
    noisy, quiet = open_socket(f"/ws/runs/{run.pk}/", alice_key), open_socket(f"/ws/runs/{run.pk}/", bob_key)
    assert (await noisy.connect(timeout=5))[0] and (await quiet.connect(timeout=5))[0]
    await noisy.send_input({"type": "websocket.receive", "text": ""})  # an empty frame (send_to cannot send one)
    for junk in ["", *GARBAGE_TEXT]:
        if junk:
            await noisy.send_to(text_data=junk)
        frame = json.loads(await noisy.receive_from(timeout=10))
        assert frame["type"] == "protocol.error" and "ping" in frame["message"], junk[:40]
    await noisy.send_to(bytes_data=b"\x00\x01binary")
    assert json.loads(await noisy.receive_from(timeout=5))["type"] == "protocol.error"
    # The noisy socket still answers, and the other viewer still gets the run's events.
    await noisy.send_to(text_data=json.dumps({"type": "ping", "extra": [1, {"x": None}]}))
    assert json.loads(await noisy.receive_from(timeout=5)) == {"type": "pong", "last_seq": 0}
    stored = await sync_to_async(store_events)(run.pk, [_log(1)])
    await sync_to_async(publish_events)(run.pk, stored)
    assert json.loads(await quiet.receive_from(timeout=5))["seq"] == 1
    assert json.loads(await noisy.receive_from(timeout=5))["seq"] == 1
    late = open_socket(f"/ws/runs/{run.pk}/", bob_key)
    assert (await late.connect(timeout=5))[0]  # and new sockets are served
    for comm in (noisy, quiet, late):
        await comm.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["after=x", "after=-1", "after=" + "9" * 5000, "after=1.5", "after=%00"])
async def test_a_malformed_resume_point_closes_with_4400(query: str, alice: Any, ants: Any) -> None:
    run = await sync_to_async(Run.objects.create)(team=ants, owner=alice, name="watched", config=TINY_CONFIG)
    key = (await sync_to_async(ApiToken.issue)(alice))[1]
    assert await refusal_code(f"/ws/runs/{run.pk}/?{query}", key) == 4400


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_cluster_socket_answers_any_message_with_a_snapshot(alice: Any) -> None:
    comm = open_socket("/ws/cluster/", (await sync_to_async(ApiToken.issue)(alice))[1])
    assert (await comm.connect(timeout=5))[0]
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "cluster.snapshot"
    for junk in ("not json", "[" * 100_000):
        await comm.send_to(text_data=junk)
        assert json.loads(await comm.receive_from(timeout=5))["type"] == "cluster.snapshot"
    await comm.send_to(bytes_data=b"\xff")
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "cluster.snapshot"
    await comm.disconnect()


# ---- config fuzzing ----------------------------------------------------------------------------------------------

JSON_LEAVES = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
               | st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
NEAR_VALID = {int: st.integers(-3, 5000), float: st.floats(-1.0, 3.0), str: st.sampled_from(
    ["random", "heuristic", "solver:3", "grpo", "vllm", "hf", "auto", "static", "both", "tiny", "1,2", "", "x y"]),
    bool: st.booleans()}


def config_dicts(cls: type = RunConfig) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts shaped like the config (its real field names, a section as a dict) with values near and far from valid."""
    hints = get_type_hints(cls)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            optional[f.name] = config_dicts(hint) | JSON_VALUES
        else:
            optional[f.name] = NEAR_VALID.get(hint, st.nothing()) | JSON_VALUES
    optional["junk"] = JSON_VALUES
    return st.fixed_dictionaries({}, optional=optional)


PYTHON_ONLY = (st.integers(min_value=2**1024, max_value=2**1100) | st.just(float("nan")) | st.just(float("inf"))
               | st.tuples(st.integers()) | st.sets(st.integers(), max_size=2))
"""What only a direct caller (or YAML) can hand the core: numbers JSON has no spelling for, odd containers."""


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=config_dicts() | st.dictionaries(st.integers() | st.none() | st.text(max_size=4), JSON_VALUES, max_size=3)
       | JSON_VALUES, extra=st.dictionaries(st.sampled_from(["iterations", "seed", "name", "rollout"]), PYTHON_ONLY,
                                            max_size=1))
def test_the_core_config_fails_only_with_a_config_error_naming_the_field(data: Any, extra: dict[str, Any]) -> None:
    if isinstance(data, dict) and extra:
        data = {**data, **extra}
    try:
        RunConfig.from_dict(data)
    except ConfigError as exc:
        assert isinstance(exc.field, str) and exc.field and isinstance(exc.reason, str) and exc.reason
        assert str(exc).startswith(exc.field)
    for err in config_errors(data):
        assert isinstance(err, ConfigError) and err.field


@pytest.fixture
def as_member(alice: Any, settings: Any) -> APIClient:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)[1]}")
    return client


@pytest.mark.django_db
def test_fuzzed_configs_posted_to_the_api_are_accepted_or_a_400_naming_config_fields(as_member: APIClient) -> None:
    seen: set[int] = set()

    @settings(max_examples=80, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(config=config_dicts() | JSON_VALUES)
    def post(config: Any) -> None:
        got = as_member.post("/api/runs/", {"team": "ants", "config": config}, format="json")
        seen.add(got.status_code)
        assert got.status_code in (201, 400), (config, got.status_code)
        if got.status_code == 400:
            errors = got.json()["errors"]
            assert errors and all(isinstance(e["message"], str) and e["message"] for e in errors)
            assert all(re.match(r"config($|\.|\[)", e["field"]) for e in errors), errors

    post()
    assert seen == {201, 400}  # the fuzzing reached both answers


# ---- what the fuzzing found (each of these was a 500, or an untyped exception from the core) ----------------------

@pytest.mark.parametrize("data, field", [
    ({1: 2}, "1"), ({1: 2, "a": 3}, "1"), ({"rollout": {None: 1}}, "rollout.None"), ({"": 1}, '""'),
    ({"rollout": {"temperature": 10**400}}, "rollout.temperature"), ({"iterations": 10**5000}, "iterations"),
])
def test_odd_keys_and_huge_numbers_are_config_errors(data: dict[Any, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(data)
    assert caught.value.field == field
    assert [e.field for e in config_errors(data)] == [field]


BIG = "1" + "0" * 400  # a JSON integer no float can hold
REGRESSIONS = [
    ("search NUL", "get", "/api/runs/?search=a%00b", None, "search"),
    ("team NUL", "get", "/api/runs/?team=a%00b", None, "team"),
    ("name NUL", "post", "/api/runs/", {"team": "ants", "config": TINY_CONFIG, "name": "a\x00b"}, "name"),
    ("team body NUL", "post", "/api/runs/", {"team": "a\x00b", "config": TINY_CONFIG}, "team"),
    ("model path NUL", "post", "/api/runs/", {"team": "ants", "config": {"model": {"path": "a\x00b"}}},
     "config.model.path"),
    ("config key NUL", "post", "/api/runs/", {"team": "ants", "config": {"a\x00": 1}}, "config.a\\u0000"),
    ("huge temperature", "post", "/api/runs/",
     '{"team": "ants", "config": {"rollout": {"temperature": %s}}}' % BIG, "config.rollout.temperature"),
    ("huge cpus", "post", "/api/runs/", '{"team": "ants", "config": {}, "resources": {"cpus": %s}}' % BIG,
     "resources.cpus"),
    ("deep body", "post", "/api/runs/", "[" * 100_000, "body"),
    ("deep token body", "post", "/api/auth/token/", "[" * 100_000, "body"),
    ("deep config", "post", "/api/runs/", '{"team": "ants", "config": {"model": %s%s}}' % ("[" * 900, "]" * 900),
     "config.model" + "[0]" * 16),
]


@pytest.mark.django_db
@pytest.mark.parametrize("label, method, url, body, field", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_inputs_that_were_500s_are_400s_naming_the_field(label: str, method: str, url: str, body: Any, field: str,
                                                         as_member: APIClient) -> None:
    if isinstance(body, str):
        got = getattr(as_member, method)(url, body, content_type="application/json")
    else:
        got = getattr(as_member, method)(url, body, format="json")
    assert got.status_code == 400, got.content
    assert field in [e["field"] for e in got.json()["errors"]]


@pytest.mark.django_db
def test_paths_that_were_500s_are_404s(as_member: APIClient, alice: Any, ants: Any) -> None:
    run = Run.objects.create(team=ants, owner=alice, name="r", config=TINY_CONFIG)
    assert as_member.get(f"/api/runs/{run.pk}/checkpoints/{'9' * 5000}/download/").status_code == 404
    assert as_member.get("/api/teams/a%00b/quota/").status_code == 404


def test_a_url_no_api_endpoint_serves_is_a_json_404(as_alice: Any, client: Any) -> None:
    answer = as_alice.get("/api/no-such-thing/")
    assert answer.status_code == 404 and answer["Content-Type"] == "application/json"
    assert "no API endpoint at /api/no-such-thing/" in answer.json()["detail"]
    assert client.get("/no-such-page/").status_code == 404  # pages keep Django's own 404 page
