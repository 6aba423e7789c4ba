"""Names and message shapes shared by the event writers (workers) and the websocket consumers."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

# Channel-layer message type; the consumer handles it in `run_events` (dots become underscores).
EVENTS_MESSAGE = "run.events"


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


CLUSTER_GROUP = "cluster"


def publish_events(run_id: int, envelopes: list[dict[str, Any]]) -> None:
    """Push stored events to the run's live viewers (at most once; viewers fill gaps from the database)."""
    if envelopes:
        async_to_sync(get_channel_layer().group_send)(run_group(run_id), {"type": EVENTS_MESSAGE, "events": envelopes})


def publish_cluster_change() -> None:
    """Tell cluster-page viewers to refresh (the queue or a run's holdings changed)."""
    async_to_sync(get_channel_layer().group_send)(CLUSTER_GROUP, {"type": "cluster.changed"})
