"""Websocket of the cluster page: a snapshot on connect and again whenever the queue or holdings change."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from webapp.cluster.api import cluster_snapshot
from webapp.runs.consumers import CLOSE_UNAUTHENTICATED
from webapp.runs.live import CLUSTER_GROUP


class ClusterConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.joined = False
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.channel_layer.group_add(CLUSTER_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(CLUSTER_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self._send_snapshot()  # any message asks for a fresh snapshot

    async def cluster_changed(self, message: dict[str, Any]) -> None:
        await self._send_snapshot()

    async def _send_snapshot(self) -> None:
        snapshot = await database_sync_to_async(cluster_snapshot)(self.scope["user"])
        await self.send(text_data=json.dumps({"type": "cluster.snapshot", "data": snapshot}, default=str))
