"""Run websocket on the real Redis channel layer: auth, team isolation, backlog then live, no gap, no duplicate."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from tests.webapp.conftest import TINY_CONFIG
from tests.webapp.sockets import open_socket, refusal_code
from webapp.accounts.models import ApiToken
from webapp.runs.live import publish_events
from webapp.runs.services import store_events, submit_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TS = "2026-01-01T00:00:00Z"


def _log(seq: int) -> dict[str, Any]:
    return {"v": 1, "run": 0, "seq": seq, "ts": TS, "type": "log", "data": {"level": "info", "message": f"e{seq}"}}


async def _receive_seqs(comm: WebsocketCommunicator, n: int) -> list[int]:
    return [json.loads(await comm.receive_from(timeout=5))["seq"] for _ in range(n)]


@pytest.fixture
def alice_run(alice: Any, ants: Any) -> int:
    return submit_run(user=alice, team=ants, name="watched", config=TINY_CONFIG).pk


def _key(user: Any) -> str:
    return ApiToken.issue(user)[1]


async def test_anonymous_and_other_team_are_refused(alice_run: int, charlie: Any) -> None:
    for key, code in ((None, 4401), ("wrong", 4401), (await sync_to_async(_key)(charlie), 4404)):
        assert await refusal_code(f"/ws/runs/{alice_run}/", key) == code
    # the same answer as another team's run
    assert await refusal_code("/ws/runs/999999/", await sync_to_async(_key)(charlie)) == 4404


async def test_backlog_then_live_without_gap_or_duplicate(alice_run: int, alice: Any) -> None:
    await sync_to_async(store_events)(alice_run, [_log(s) for s in (2, 3, 4)])
    comm = open_socket(f"/ws/runs/{alice_run}/?after=1", await sync_to_async(_key)(alice))
    assert (await comm.connect(timeout=5))[0]
    assert await _receive_seqs(comm, 3) == [2, 3, 4]
    # a live batch repeating an old event and adding new ones
    stored = await sync_to_async(store_events)(alice_run, [_log(s) for s in (4, 5, 6)])
    await sync_to_async(publish_events)(alice_run, [_log(4), *stored])
    assert await _receive_seqs(comm, 2) == [5, 6]
    # events stored but never published (a lost live message) are filled in from the database
    await sync_to_async(store_events)(alice_run, [_log(7), _log(8)])
    stored = await sync_to_async(store_events)(alice_run, [_log(9)])
    await sync_to_async(publish_events)(alice_run, stored)
    assert await _receive_seqs(comm, 3) == [7, 8, 9]
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_reconnect_resumes_after_last_seq(alice_run: int, alice: Any) -> None:
    await sync_to_async(store_events)(alice_run, [_log(s) for s in range(2, 8)])
    key = await sync_to_async(_key)(alice)
    comm = open_socket(f"/ws/runs/{alice_run}/?after=5", key)
    assert (await comm.connect(timeout=5))[0]
    assert await _receive_seqs(comm, 2) == [6, 7]
    await comm.disconnect()


async def test_malformed_messages_get_an_error_frame_and_the_stream_goes_on(alice_run: int, alice: Any) -> None:
    comm = open_socket(f"/ws/runs/{alice_run}/", await sync_to_async(_key)(alice))
    assert (await comm.connect(timeout=5))[0]
    assert await _receive_seqs(comm, 1) == [1]
    for junk in ("not json", "[1,2]", json.dumps({"type": "subscribe"})):
        await comm.send_to(text_data=junk)
        assert json.loads(await comm.receive_from(timeout=5))["type"] == "protocol.error"
    await comm.send_to(text_data=json.dumps({"type": "ping"}))
    assert json.loads(await comm.receive_from(timeout=5)) == {"type": "pong", "last_seq": 1}
    await comm.disconnect()


async def test_bad_after_is_refused(alice_run: int, alice: Any) -> None:
    assert await refusal_code(f"/ws/runs/{alice_run}/?after=-3", await sync_to_async(_key)(alice)) == 4400


async def test_cluster_socket_needs_auth_and_sends_a_snapshot(alice_run: int, alice: Any) -> None:
    assert await refusal_code("/ws/cluster/", None) == 4401
    comm = open_socket("/ws/cluster/", await sync_to_async(_key)(alice))
    assert (await comm.connect(timeout=5))[0]
    frame = json.loads(await comm.receive_from(timeout=5))
    assert frame["type"] == "cluster.snapshot"
    # Submitted with no cluster view, the run was admitted at once; it holds its gang until a worker starts it.
    assert [(r["id"], r["status"]) for r in frame["data"]["running"]] == [(alice_run, "admitted")]
    assert frame["data"]["queue"] == [] and "usage" in frame["data"]
    await comm.disconnect()


async def test_cluster_snapshot_requests_are_coalesced(alice_run: int, alice: Any) -> None:
    """A client asking for snapshots in a loop gets one per interval: each asks the database and Ray's dashboard."""
    from webapp.cluster.consumers import MIN_INTERVAL_S

    comm = open_socket("/ws/cluster/", await sync_to_async(_key)(alice))
    assert (await comm.connect(timeout=5))[0]
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "cluster.snapshot"
    for _ in range(20):
        await comm.send_to(text_data="refresh")
    frame = json.loads(await comm.receive_from(timeout=MIN_INTERVAL_S + 5))  # one, at the end of the interval
    assert frame["type"] == "cluster.snapshot"
    assert await comm.receive_nothing(timeout=MIN_INTERVAL_S + 0.5)
    await comm.disconnect()
