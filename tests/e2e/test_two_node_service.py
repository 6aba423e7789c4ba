"""The service on a real two-node Ray cluster (two raylets in a network namespace of the test's own, on loopback): a
run's gang is admitted across both nodes, and Ray runs its workers on both (two_node_service.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_dispatch import _isolated_network

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("two_node_service.py")


@pytest.mark.skipif(not _isolated_network(), reason="needs `unshare -n` (root or user namespaces) for a loopback cluster")
def test_a_run_is_admitted_and_trained_across_two_nodes(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "RAY_ADDRESS", "RAY_DASHBOARD_URL"):
        env.pop(name, None)  # the script makes its own, inside the namespace
    cmd = f"ip link set lo up && exec {sys.executable} {SCRIPT} {tmp_path}"
    done = subprocess.run(["unshare", "-n", "bash", "-c", cmd], capture_output=True, text=True, timeout=600, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["status"] == "succeeded" and out["iterations_done"] == 1, out["error"]
    assert len(out["cluster_nodes"]) == 2
    # The scheduler placed the 3-CPU gang across both 2-CPU nodes, and gave the room back when the run ended.
    assert sorted(set(out["placement"])) == out["cluster_nodes"] and len(out["placement"]) == 3
    assert out["allocation_end"] == "succeeded"
    # Ray ran the workers on both nodes.
    ran_on = {node for nodes in out["worker_nodes"].values() for node in nodes}
    assert ran_on == set(out["cluster_nodes"]), out["worker_nodes"]
