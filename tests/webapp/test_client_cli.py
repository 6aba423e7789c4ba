"""The `earl` client against a live service (Daphne in a child process): real HTTP, websockets, Redis and database."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from channels.layers import channel_layers
from channels.testing.live import make_application
from daphne.testing import DaphneProcess
from django.db import connections

from earl_core.events import Event, EventStream, Log, Metrics, RunStatus
from tests.webapp.conftest import TINY_CONFIG
from webapp.accounts.models import ApiToken
from webapp.client.cli import main
from webapp.runs.live import publish_events, run_group
from webapp.runs.models import Run
from webapp.runs.services import store_events, submit_run

# The server process reads and writes the test database, so every test commits for real.
pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0


# ---- a live service ----------------------------------------------------------------------------------

def _in_server_process() -> None:
    # The fork inherits settings that already name the test database (pytest-django set them); channels'
    # set_database_connection() would prefix "test_" once more on PostgreSQL.
    # A fork inherits the test process's channel layer and with it its client prefix: two servers forked from one
    # parent would then take each other's messages from Redis. Each server builds its own.
    channel_layers.backends.clear()
    # Nor the parent's Celery producer (an earlier test may have queued a run): its pool is the parent's.
    from webapp.queue import _producer

    _producer.cache_clear()
    # Nor asgiref's thread for database calls: a fork has no threads, so an executor whose thread ran in the parent
    # (an earlier in-process websocket test) would queue every database call of the server forever.
    import weakref
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    SyncToAsync.context_to_thread_executor = weakref.WeakKeyDictionary()


def start_server(port: int = 0) -> DaphneProcess:
    """Daphne serving the ASGI app (HTTP + websockets) in a forked process that sees the test database."""
    connections.close_all()  # a forked process must not share the parent's database sockets
    server = DaphneProcess("127.0.0.1", partial(make_application, static_wrapper=None), setup=_in_server_process,
                           port=port)
    server.start()
    deadline = time.monotonic() + DEADLINE_S
    while not server.ready.wait(timeout=0.2):
        if not server.is_alive() or time.monotonic() > deadline:
            server.terminate()
            raise RuntimeError("the live server did not start")
    return server


def stop_server(server: DaphneProcess) -> None:
    server.terminate()
    server.join(10)
    if server.is_alive():  # a fork can inherit state that hangs its exit; the port must be free for a restart
        server.kill()
        server.join(10)


@pytest.fixture(scope="module")
def daphne_server(django_db_setup: None, django_db_blocker: Any, redis_url: str) -> Iterator[DaphneProcess]:
    with django_db_blocker.unblock():  # the forked server inherits whether database access is allowed
        server = start_server()
    yield server
    stop_server(server)


@pytest.fixture
def live_url(daphne_server: DaphneProcess) -> str:
    return f"http://127.0.0.1:{daphne_server.port.value}"


@pytest.fixture(autouse=True)
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A private credentials file; nothing from the developer's own environment."""
    monkeypatch.delenv("EARL_URL", raising=False)
    monkeypatch.delenv("EARL_TOKEN", raising=False)
    path = tmp_path / "earl" / "config.json"
    monkeypatch.setenv("EARL_CONFIG", str(path))
    return path


def use_token(monkeypatch: pytest.MonkeyPatch, url: str, user: Any) -> str:
    _, key = ApiToken.issue(user, "test")
    monkeypatch.setenv("EARL_URL", url)
    monkeypatch.setenv("EARL_TOKEN", key)
    return key


# ---- running the CLI -----------------------------------------------------------------------------------

@dataclass
class Result:
    code: int
    out: str
    err: str


def earl(capsys: pytest.CaptureFixture[str], *argv: object) -> Result:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


class InBackground:
    """`earl ...` in a thread, so the test thread can write the run's events meanwhile."""

    def __init__(self, *argv: object) -> None:
        self.code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=([str(a) for a in argv],), daemon=True)
        self._thread.start()

    def _run(self, argv: list[str]) -> None:
        try:
            self.code = main(argv)
        except BaseException as exc:  # re-raised in the test thread by wait()
            self.error = exc

    def wait(self) -> int:
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive(), "the command did not finish"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def viewers(redis_url: str, run_id: int) -> int:
    """Websockets in the run's channel-layer group (channels_redis keeps a group as a sorted set)."""
    return int(redis.Redis.from_url(redis_url).zcard(f"asgi:group:{run_group(run_id)}"))


def emit(run_id: int, *events: Event, publish: bool = True) -> list[dict[str, Any]]:
    """What a worker does: number the core's events after the stored ones, store them, then push them live."""
    batch: list[dict[str, Any]] = []
    stream = EventStream(run_id, batch.append, start_seq=Run.objects.get(pk=run_id).last_seq)
    for event in events:
        stream.emit(event)
    stored = store_events(run_id, batch)
    if publish:
        publish_events(run_id, stored)
    return stored


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def alice_run(alice: Any, ants: Any) -> int:
    return submit_run(user=alice, team=ants, name="watched", config=TINY_CONFIG).pk


# ---- login, list, submit -------------------------------------------------------------------------------

def test_login_stores_a_private_token_then_list_and_logout(
        alice: Any, alice_run: int, live_url: str, cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = earl(capsys, "login", "--url", live_url, "--username", "alice", "--password", "alice-password-123")
    assert got.code == 0, got.err
    assert stat.S_IMODE(cli_env.stat().st_mode) == 0o600
    stored = json.loads(cli_env.read_text())
    assert stored["url"] == live_url and ApiToken.find(stored["token"]).user == alice

    listed = earl(capsys, "runs", "list")
    assert listed.code == 0, listed.err
    header, row = listed.out.splitlines()
    assert header.split() == ["ID", "NAME", "TEAM", "STATUS", "ITERATIONS", "CREATED"]
    assert row.split()[:5] == [str(alice_run), "watched", "Ants", "queued", "0/2"]
    assert [r["id"] for r in json.loads(earl(capsys, "runs", "list", "--json").out)] == [alice_run]

    assert earl(capsys, "logout").code == 0
    assert ApiToken.objects.get(user=alice, name__startswith="cli@").revoked_at is not None
    assert "token" not in json.loads(cli_env.read_text())
    after = earl(capsys, "runs", "list")
    assert (after.code, after.err) == (1, "earl: not logged in or token revoked: run `earl login`\n")


def test_wrong_password_is_one_line_without_a_token(alice: Any, live_url: str, cli_env: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    got = earl(capsys, "login", "--url", live_url, "--username", "alice", "--password", "nope")
    assert (got.code, got.err) == (2, "earl: password: unknown username or wrong password\n")
    assert not cli_env.exists()


def test_submit_prints_the_id_of_a_queued_run(alice: Any, live_url: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, alice)
    config = tmp_path / "run.yaml"
    config.write_text("iterations: 2\nmodel: {preset: tiny}\nrollout: {groups: 2, group_size: 2, max_new_tokens: 8}\n"
                      "sft: {enabled: false}\n")
    got = earl(capsys, "submit", config, "--team", "ants", "--name", "from the cli", "--priority", "high")
    assert got.code == 0, got.err
    run = Run.objects.get(pk=int(got.out))
    assert (run.status, run.name, run.priority, run.owner, run.team.slug) == ("queued", "from the cli", "high", alice, "ants")
    assert run.config == TINY_CONFIG


def test_bad_submission_prints_every_field_error_and_exits_2(alice: Any, live_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, alice)
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"rollout": {"temperature": 9, "groups": 0}, "algo": {"name": "ppo"}}))
    got = earl(capsys, "submit", config, "--team", "bees")
    assert got.code == 2 and got.out == ""
    lines = {line.split(":")[1].strip(): line for line in got.err.splitlines()}
    assert set(lines) == {"team", "config.rollout.temperature", "config.rollout.groups", "config.algo.name"}
    assert "(allowed: " in lines["config.algo.name"] and "grpo" in lines["config.algo.name"]
    assert "'bees' is not one of your teams (allowed: " in lines["team"]
    assert not Run.objects.exists()


# ---- cancel, and other teams' runs ---------------------------------------------------------------------

def test_cancel_a_queued_run_then_a_second_cancel_is_a_conflict(
        alice: Any, alice_run: int, live_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, alice)
    first = earl(capsys, "runs", "cancel", alice_run)
    assert (first.code, first.out) == (0, f"run {alice_run} cancelled\n")
    assert Run.objects.get(pk=alice_run).status == "cancelled"
    again = earl(capsys, "runs", "cancel", alice_run)
    assert again.code == 1
    assert again.err == (f"earl: run {alice_run} is already cancelled; "
                         "only queued, starting or running runs can be cancelled\n")


def test_charlie_cannot_see_alices_run(charlie: Any, alice_run: int, live_url: str, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, charlie)
    for argv in (["runs", "show"], ["runs", "cancel"], ["runs", "events", "--follow"], ["runs", "metrics"]):
        got = earl(capsys, *argv[:2], alice_run, *argv[2:])
        assert (got.code, got.err) == (1, f"earl: run {alice_run} not found\n"), argv
    assert earl(capsys, "runs", "list").err == "no runs\n"
    assert Run.objects.get(pk=alice_run).status == "queued"


def test_as_a_subprocess_errors_are_one_line_without_traceback(charlie: Any, alice_run: int, live_url: str) -> None:
    _, key = ApiToken.issue(charlie)
    env = {**os.environ, "EARL_URL": live_url, "EARL_TOKEN": key}

    def run(*argv: object, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "webapp.client.cli", *map(str, argv)], cwd=REPO,
                              env={**env, **extra}, capture_output=True, text=True, timeout=DEADLINE_S)

    hidden = run("runs", "show", alice_run)
    assert (hidden.returncode, hidden.stdout, hidden.stderr) == (1, "", f"earl: run {alice_run} not found\n")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = run("runs", "list", EARL_URL=closed)
    assert (down.returncode, down.stderr) == (1, f"earl: cannot reach {closed}: is the service running?\n")


def test_ctrl_c_stops_following_but_not_the_run(alice: Any, alice_run: int, live_url: str, redis_url: str) -> None:
    _, key = ApiToken.issue(alice)
    follow = subprocess.Popen([sys.executable, "-m", "webapp.client.cli", "runs", "events", str(alice_run), "--follow"],
                              cwd=REPO, env={**os.environ, "EARL_URL": live_url, "EARL_TOKEN": key},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              # A suite started in the background (nohup ... &) inherits SIGINT ignored; a person at
                              # a terminal has it at its default, which is what this test is about.
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: viewers(redis_url, alice_run) >= 1, "the follower's websocket")
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=DEADLINE_S)
    finally:
        follow.kill()
    assert follow.returncode == 130
    assert out.startswith("#1  ") and "run.status  queued: waiting for admission" in out
    assert err == (f"earl: stopped watching; run {alice_run} keeps going "
                   f"(cancel it with `earl runs cancel {alice_run}`)\n")
    assert Run.objects.get(pk=alice_run).status == "queued"


def test_the_client_imports_no_django() -> None:
    code = ("import sys, webapp.client.cli; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'channels', 'rest_framework', "
            "'earl_core') or (m.startswith('webapp.') and not m.startswith('webapp.client'))); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr


# ---- following a run -----------------------------------------------------------------------------------

def test_follow_prints_stored_then_live_events_once_each_until_the_run_succeeds(
        alice: Any, alice_run: int, live_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, alice)
    emit(alice_run, RunStatus("starting"), RunStatus("running"), Log("info", "warming up"))  # seq 2-4, before
    follow = InBackground("runs", "events", alice_run, "--follow", "--json")
    wait_until(lambda: viewers(redis_url, alice_run) >= 1, "the follower's websocket")
    emit(alice_run, Metrics(0, {"rollout/win_rate": 0.25}), Log("info", "halfway"))  # seq 5-6, live
    emit(alice_run, Log("info", "lost"), publish=False)  # seq 7: stored, but its live message never sent
    emit(alice_run, Metrics(1, {"rollout/win_rate": 0.5}))  # seq 8: live, arrives after the gap
    emit(alice_run, RunStatus("succeeded"), Log("info", "after the end"))  # seq 9 ends the stream
    assert follow.wait() == 0
    events = json_lines(capsys.readouterr().out)
    assert [e["seq"] for e in events] == list(range(1, 10))
    assert [e["data"].get("status") for e in events if e["type"] == "run.status"] == [
        "queued", "starting", "running", "succeeded"]

    rows = earl(capsys, "runs", "metrics", alice_run, "--csv").out.splitlines()
    assert rows == ["iteration,rollout/win_rate", "0,0.25", "1,0.5"]
    typed = earl(capsys, "runs", "events", alice_run, "--after", 4, "--type", "metrics")
    assert [line.split()[0] for line in typed.out.splitlines()] == ["#5", "#8"]


def test_a_final_event_whose_live_message_was_lost_still_ends_the_follow(
        alice: Any, alice_run: int, live_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, alice)
    follow = InBackground("runs", "events", alice_run, "--follow", "--json")
    wait_until(lambda: viewers(redis_url, alice_run) >= 1, "the follower's websocket")
    emit(alice_run, RunStatus("failed", "boom"), publish=False)
    assert follow.wait() == 0  # found in the database when the stream stayed quiet
    assert [e["seq"] for e in json_lines(capsys.readouterr().out)] == [1, 2]


def test_follow_resumes_after_the_service_restarts(
        alice: Any, alice_run: int, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    server = start_server()
    port = server.port.value
    use_token(monkeypatch, f"http://127.0.0.1:{port}", alice)
    try:
        follow = InBackground("runs", "events", alice_run, "--follow", "--json")
        wait_until(lambda: viewers(redis_url, alice_run) >= 1, "the follower's websocket")
        server.kill()  # SIGKILL: the connection drops; a killed server leaves its group entry behind
        server.join(10)
        emit(alice_run, RunStatus("starting"), RunStatus("running"))  # seq 2-3 while nobody serves
        server = start_server(port)
        wait_until(lambda: viewers(redis_url, alice_run) >= 2, "the follower to reconnect")
        emit(alice_run, Log("info", "live again"), RunStatus("succeeded"))  # seq 4-5 over the new websocket
        assert follow.wait() == 0
    finally:
        stop_server(server)
    captured = capsys.readouterr()
    assert [e["seq"] for e in json_lines(captured.out)] == [1, 2, 3, 4, 5]
    assert "reconnecting after seq 1" in captured.err


def test_submit_watch_shows_progress_and_exits_0_when_the_run_succeeds(
        alice: Any, live_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    use_token(monkeypatch, live_url, alice)
    config = tmp_path / "run.json"
    config.write_text(json.dumps(TINY_CONFIG))
    watch = InBackground("submit", config, "--team", "ants", "--name", "watched", "--watch")
    wait_until(lambda: Run.objects.filter(name="watched").exists(), "the submitted run")
    run_id = Run.objects.get(name="watched").pk
    wait_until(lambda: viewers(redis_url, run_id) >= 1, "the watcher's websocket")
    emit(run_id, RunStatus("running"), Metrics(0, {"rollout/win_rate": 0.25, "perf/tokens_per_s": 1234.5}))
    emit(run_id, Metrics(1, {"rollout/win_rate": 0.75, "perf/tokens_per_s": 1500.0}), RunStatus("succeeded"))
    assert watch.wait() == 0
    captured = capsys.readouterr()
    assert captured.out == f"{run_id}\n"
    assert "2/2" in captured.err and "win=0.75" in captured.err and "tok/s=1500" in captured.err
    assert f"run {run_id} succeeded" in captured.err
