"""Web-side fixtures: a real Redis (the configured one, or a private one started here), people and teams, API clients."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from django.conf import settings
from rest_framework.test import APIClient

from webapp.accounts.models import ApiToken, Membership, Team
from webapp.localredis import ensure_redis

# Tests use their own Redis database number so they never meet a running service's queue or groups (another
# number for a second test session on the same Redis: each session flushes its database when it starts).
TEST_REDIS_DB = int(os.environ.get("EARL_TEST_REDIS_DB", "9"))


@pytest.fixture(scope="session", autouse=True)
def redis_url() -> Iterator[str]:
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
    url, local = ensure_redis(f"{base}/{TEST_REDIS_DB}")
    import redis

    redis.Redis.from_url(url).flushdb()
    os.environ["REDIS_URL"] = url  # for worker processes the tests start
    os.environ["CELERY_BROKER_URL"] = url
    settings.REDIS_URL = url
    settings.CELERY_BROKER_URL = url
    settings.CHANNEL_LAYERS = {"default": {**settings.CHANNEL_LAYERS["default"],
                                           "CONFIG": {**settings.CHANNEL_LAYERS["default"]["CONFIG"],
                                                      "hosts": [{"address": url, "socket_timeout": 30}]}}}
    yield url
    if local is not None:
        local.stop()


# How long tasks a test left running get to end once cancelled, before the test is reported with their stacks.
STRAY_TASK_GRACE_S = 10.0


@pytest.fixture(autouse=True)
def no_task_outlives_its_test(request: pytest.FixtureRequest) -> None:
    """Every async test ends what it started, sockets first (see tests/webapp/sockets.py)."""
    if request.node.get_closest_marker("asyncio") is not None:
        request.getfixturevalue("stray_tasks")


@pytest_asyncio.fixture
async def stray_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fails the test that leaves tasks in its event loop (a consumer of a socket never disconnected).

    Why: pytest-asyncio cancels such tasks when it closes the loop and waits for them without a limit; a consumer
    whose cancel was lost in the Redis channel layer once hung CI there for good. Here a leftover is a plain error
    naming the task, and one that does not end once cancelled has its stack printed past output capture first."""
    yield
    left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if not left:
        return
    stacks = io.StringIO()
    for task in left:
        task.print_stack(limit=12, file=stacks)
        task.cancel()
    _, stuck = await asyncio.wait(left, timeout=STRAY_TASK_GRACE_S)
    if stuck:
        where = io.StringIO()
        for task in stuck:
            task.print_stack(limit=30, file=where)
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\n{request.node.nodeid}: {len(stuck)} task(s) did not end within {STRAY_TASK_GRACE_S:.0f} s "
                  f"of being cancelled; the loop teardown will wait for them. They are at:\n{where.getvalue()}",
                  file=sys.stderr, flush=True)
    pytest.fail(f"{len(left)} task(s) outlived the test (a socket never disconnected?):\n{stacks.getvalue()}",
                pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def fast_passwords() -> None:
    """A cheap password hash for the people tests create (the real one costs 0.25 s each). Set for the session,
    before any test server is forked, so servers check passwords the same way."""
    from django.contrib.auth.hashers import get_hashers, get_hashers_by_algorithm

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_hashers.cache_clear()
    get_hashers_by_algorithm.cache_clear()


@pytest.fixture(autouse=True)
def runs_dir(tmp_path: Any, settings: Any) -> Any:
    settings.EARL_RUNS_DIR = tmp_path / "runs"
    return settings.EARL_RUNS_DIR


def _person(django_user_model: Any, name: str, team: Team, role: str = "member") -> Any:
    user = django_user_model.objects.create_user(username=name, password=f"{name}-password-123")
    Membership.objects.create(user=user, team=team, role=role)
    return user


@pytest.fixture
def ants(db: None) -> Team:
    return Team.objects.create(name="Ants", slug="ants")


@pytest.fixture
def bees(db: None) -> Team:
    return Team.objects.create(name="Bees", slug="bees")


@pytest.fixture
def alice(django_user_model: Any, ants: Team) -> Any:
    return _person(django_user_model, "alice", ants, "admin")


@pytest.fixture
def bob(django_user_model: Any, ants: Team) -> Any:
    return _person(django_user_model, "bob", ants, "member")


@pytest.fixture
def charlie(django_user_model: Any, bees: Team) -> Any:
    return _person(django_user_model, "charlie", bees, "member")


def client_for(user: Any) -> APIClient:
    _, key = ApiToken.issue(user, "test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def as_alice(alice: Any) -> APIClient:
    return client_for(alice)


@pytest.fixture
def as_bob(bob: Any) -> APIClient:
    return client_for(bob)


@pytest.fixture
def as_charlie(charlie: Any) -> APIClient:
    return client_for(charlie)


TINY_CONFIG: dict[str, Any] = {
    "iterations": 2,
    "model": {"preset": "tiny"},
    "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 8},
    "sft": {"enabled": False},
}
