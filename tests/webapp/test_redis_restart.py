"""Redis restarted under a live service: followers reconnect and catch up from the database by seq, with no gap and
no duplicate, and live delivery resumes. A private redis-server is killed (SIGKILL) and started again on its port."""

from __future__ import annotations

from typing import Any

import pytest
from channels.layers import channel_layers

from earl_core.events import Log, RunStatus
from tests.webapp.test_client_cli import (InBackground, alice_run, emit, json_lines, start_server,  # noqa: F401
                                          stop_server, use_token, viewers, wait_until)
from webapp.localredis import LocalRedis, start_local_redis
from webapp.runs.live import publish_events
from webapp.stack import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def private_redis(settings: Any) -> Any:
    """The channel layer on a redis-server of this test's own (the shared one must not be restarted)."""
    port = free_port()
    holder = {"redis": start_local_redis(port), "port": port}
    config = settings.CHANNEL_LAYERS["default"]
    settings.CHANNEL_LAYERS = {"default": {**config, "CONFIG": {
        **config["CONFIG"], "hosts": [{"address": holder["redis"].url, "socket_timeout": 30}]}}}
    channel_layers.backends.clear()
    yield holder
    holder["redis"].stop()
    channel_layers.backends.clear()


def _kill(redis: LocalRedis) -> None:
    redis.process.kill()
    redis.process.wait(10)


def test_a_follower_catches_up_after_redis_restarts_and_gets_live_events_again(
        alice: Any, alice_run: int, private_redis: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    server = start_server()
    try:
        use_token(monkeypatch, f"http://127.0.0.1:{server.port.value}", alice)
        follow = InBackground("runs", "events", alice_run, "--follow", "--json")
        wait_until(lambda: viewers(private_redis["redis"].url, alice_run) >= 1, "the follower's websocket")
        emit(alice_run, RunStatus("starting"))  # seq 2, live

        _kill(private_redis["redis"])
        stored = emit(alice_run, RunStatus("running"), Log("info", "while Redis is down"), publish=False)  # 3-4
        with pytest.raises(Exception):  # noqa: B017 - what the worker's relay meets (it logs it and goes on)
            publish_events(alice_run, stored)
        channel_layers.backends.clear()  # the test's own connection pool died with the server
        private_redis["redis"] = start_local_redis(private_redis["port"])

        # Live delivery is back once the follower's websocket sits in the run's group of the new Redis.
        wait_until(lambda: viewers(private_redis["redis"].url, alice_run) >= 1, "the follower to rejoin")
        emit(alice_run, Log("info", "live again"), RunStatus("succeeded"))  # seq 5-6
        assert follow.wait() == 0
    finally:
        stop_server(server)
    captured = capsys.readouterr()
    assert [e["seq"] for e in json_lines(captured.out)] == [1, 2, 3, 4, 5, 6]
