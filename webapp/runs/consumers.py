"""Websocket of one run: the stored events after `?after=<seq>`, then live ones — never a gap, never a duplicate."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from webapp.runs.live import run_group
from webapp.runs.models import RunEvent
from webapp.runs.services import visible_runs

# Close codes (4000-4999 are the application's): the client can tell "log in" from "no such run".
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400
# Not final: the channel layer (Redis) is unreachable; clients reconnect with backoff and catch up by seq.
CLOSE_TRY_AGAIN = 1011
BACKLOG_CHUNK = 500
# How often a socket renews its group membership and sends what the database holds beyond its last seq. A Redis
# restart forgets every group and may drop live messages; this bounds how long a viewer can miss events.
REJOIN_S = 10.0

log = logging.getLogger(__name__)


class RunEventsConsumer(AsyncWebsocketConsumer):
    """Joins the run's group first, then sends the backlog from the database, then live batches.

    Channel layers deliver at most once, so the database is the source of truth: a live event whose seq is ahead
    of the last one sent makes the consumer read the missing ones from the database first.
    """

    async def connect(self) -> None:
        self.run_id: int | None = None
        self.last_sent = 0
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        after = _parse_after(self.scope.get("query_string", b""))
        if after is None:
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        if not await database_sync_to_async(_can_view)(user, run_id):
            await self.close(code=CLOSE_NOT_FOUND)  # another team's run looks exactly like a missing one
            return
        self.run_id = run_id
        self.last_sent = after
        if not await self._join():
            await self.accept()
            await self.close(code=CLOSE_TRY_AGAIN)
            return
        await self.accept()
        # The backlog may be long (a slow browser reading 40k events): send it from a task so the connect handler
        # returns and the consumer keeps reading its channel; the lock keeps backlog and live events in order.
        self.order = asyncio.Lock()
        self.backlog = asyncio.create_task(self._send_backlog())
        self.rejoin = asyncio.create_task(self._keep_joined())

    async def _join(self) -> bool:
        try:
            await self.channel_layer.group_add(run_group(self.run_id), self.channel_name)
            return True
        except Exception:  # Redis down or restarting: the client retries and catches up from the database
            log.warning("run %s: could not join the live group", self.run_id, exc_info=True)
            return False

    async def _send_backlog(self) -> None:
        async with self.order:
            await self._send_stored(upto=None)

    async def _keep_joined(self) -> None:
        """Renew the group membership (a restarted Redis forgot it) and send what the database holds beyond the
        last seq sent (live messages lost meanwhile); close for a reconnect while the channel layer is gone."""
        while True:
            await asyncio.sleep(REJOIN_S)
            if not await self._join():
                await self.close(code=CLOSE_TRY_AGAIN)
                return
            async with self.order:
                await self._send_stored(upto=None)

    async def disconnect(self, code: int) -> None:
        for task in (getattr(self, "backlog", None), getattr(self, "rejoin", None)):
            if task is not None:
                task.cancel()
        if self.run_id is not None:
            try:
                await self.channel_layer.group_discard(run_group(self.run_id), self.channel_name)
            except Exception:  # the membership expires on its own; a dead Redis must not fail the disconnect
                log.warning("run %s: could not leave the live group", self.run_id, exc_info=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Clients may ping; anything else gets an error frame, and the stream goes on."""
        try:
            message = json.loads(text_data) if text_data is not None else None
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested deeper than the parser goes
            message = None
        if isinstance(message, dict) and message.get("type") == "ping":
            await self.send(text_data=json.dumps({"type": "pong", "last_seq": self.last_sent}))
            return
        await self.send(text_data=json.dumps({"type": "protocol.error",
                                              "message": 'expected a JSON object {"type": "ping"}'}))

    async def run_events(self, message: dict[str, Any]) -> None:
        """A live batch from the worker (already stored in the database)."""
        async with self.order:
            await self._send_live(message["events"])

    async def _send_live(self, events: list[dict[str, Any]]) -> None:
        for envelope in events:
            seq = envelope["seq"]
            if seq <= self.last_sent:
                continue
            if seq > self.last_sent + 1:
                await self._send_stored(upto=seq - 1)
            if seq == self.last_sent + 1:
                await self.send(text_data=json.dumps(envelope))
                self.last_sent = seq

    async def _send_stored(self, *, upto: int | None) -> None:
        while True:
            chunk = await database_sync_to_async(_stored_after)(self.run_id, self.last_sent, upto)
            for envelope in chunk:
                await self.send(text_data=json.dumps(envelope))
                self.last_sent = envelope["seq"]
            if len(chunk) < BACKLOG_CHUNK:
                return


def _parse_after(query: bytes) -> int | None:
    values = parse_qs(query.decode("latin-1")).get("after", ["0"])
    try:
        after = int(values[-1])
    except ValueError:
        return None
    return after if after >= 0 else None


def _can_view(user: Any, run_id: int) -> bool:
    return visible_runs(user).filter(pk=run_id).exists()


def _stored_after(run_id: int, after: int, upto: int | None) -> list[dict[str, Any]]:
    events = RunEvent.objects.filter(run_id=run_id, seq__gt=after)
    if upto is not None:
        events = events.filter(seq__lte=upto)
    return [e.envelope() for e in events.order_by("seq")[:BACKLOG_CHUNK]]
