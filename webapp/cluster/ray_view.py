"""Nodes of the Ray cluster as Ray's own state API reports them (over the dashboard's HTTP endpoint)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings


def ray_nodes(timeout_s: float = 2.0) -> dict[str, Any]:
    """{"source", "nodes": [...], "error"}; never raises: the cluster page must render even when Ray is down."""
    base = settings.RAY_DASHBOARD_URL
    if not base:
        return {"source": None, "nodes": [], "error": "RAY_DASHBOARD_URL is not set; node details are unavailable"}
    url = base.rstrip("/") + "/api/v0/nodes?limit=1000&detail=true"
    try:
        request = urllib.request.Request(url)
        # A cluster with Ray's token auth on answers its dashboard only with the cluster's token.
        if os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get("RAY_AUTH_TOKEN"):
            request.add_header("Authorization", "Bearer " + os.environ["RAY_AUTH_TOKEN"])
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (a configured internal URL)
            body = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"source": base, "nodes": [], "error": f"Ray dashboard unreachable: {exc}"}
    rows = (((body.get("data") or {}).get("result") or {}).get("result")) or []
    return {"source": base, "nodes": [_node(r) for r in rows], "error": None}


def _node(row: dict[str, Any]) -> dict[str, Any]:
    total = row.get("resources_total") or {}
    return {
        "node_id": row.get("node_id"),
        "ip": row.get("node_ip"),
        "head": bool(row.get("is_head_node")),
        "state": row.get("state"),
        "cpus": total.get("CPU", 0),
        "gpus": total.get("GPU", 0),
        "memory_bytes": total.get("memory", 0),
        "custom": {k: v for k, v in total.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")
                   and not k.startswith("node:")},
    }
