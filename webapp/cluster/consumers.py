"""Websocket of the cluster page: a snapshot on connect and again whenever the queue or holdings change (at most one
every MIN_INTERVAL_S: a snapshot asks the database and Ray's dashboard, so requests in between are coalesced)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from webapp.cluster.api import cluster_snapshot
from webapp.runs.consumers import CLOSE_UNAUTHENTICATED
from webapp.runs.live import CLUSTER_GROUP

MIN_INTERVAL_S = 2.0


class ClusterConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.joined = False
        self.last_sent = float("-inf")
        self.pending: asyncio.Task[None] | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(CLUSTER_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "pending", None) is not None:
            self.pending.cancel()
        if self.joined:
            await self.channel_layer.group_discard(CLUSTER_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self._request_snapshot()  # any message asks for a fresh snapshot

    async def cluster_changed(self, message: dict[str, Any]) -> None:
        await self._request_snapshot()

    async def _request_snapshot(self) -> None:
        """Now if the last one is old enough, else one snapshot at the end of the interval for all requests."""
        if self.pending is not None:
            return
        wait = self.last_sent + MIN_INTERVAL_S - asyncio.get_running_loop().time()
        if wait <= 0:
            await self._send_snapshot()
        else:
            self.pending = asyncio.create_task(self._snapshot_after(wait))

    async def _snapshot_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        self.pending = None
        await self._send_snapshot()

    async def _send_snapshot(self) -> None:
        self.last_sent = asyncio.get_running_loop().time()
        snapshot = await database_sync_to_async(cluster_snapshot)(self.scope["user"])
        await self.send(text_data=json.dumps({"type": "cluster.snapshot", "data": snapshot}, default=str))
