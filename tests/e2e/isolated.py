"""Running a script in a network namespace of its own, where loopback is the only interface: Ray advertises the
machine's interface address even when told 127.0.0.1, so multi-node clusters in tests live there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def can_isolate() -> bool:
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


needs_isolation = pytest.mark.skipif(not can_isolate(),
                                     reason="needs `unshare -n` (root or user namespaces) for a loopback cluster")


def run_isolated(script: Path, *args: object, timeout_s: float = 600) -> dict[str, Any]:
    """Run ``script args`` inside its own network namespace; the JSON of its last ``RESULT `` line.

    The service's addresses (database, Redis, Ray) of the test process are not passed on: from inside the namespace
    they are unreachable, so a script makes its own."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "RAY_ADDRESS", "RAY_DASHBOARD_URL"):
        env.pop(name, None)
    cmd = f"ip link set lo up && exec {sys.executable} {script} {' '.join(str(a) for a in args)}"
    done = subprocess.run(["unshare", "-n", "bash", "-c", cmd], capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])
