"""Websocket routes."""

from __future__ import annotations

from django.urls import path

from webapp.cluster.consumers import ClusterConsumer
from webapp.runs.consumers import RunEventsConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunEventsConsumer.as_asgi()),
    path("ws/cluster/", ClusterConsumer.as_asgi()),
]
