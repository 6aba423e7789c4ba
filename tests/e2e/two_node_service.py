"""The service on a real two-node Ray cluster: a run submitted through the service is admitted with its gang placed
across both nodes, a Celery worker trains it on Ray, and Ray puts its workers on both nodes. Prints what it saw as
JSON. test_two_node_service.py starts it inside a network namespace of its own (loopback only), so the raylets,
the dashboard, a private Redis and everything else stay on 127.0.0.1; the database is a SQLite file in WORKDIR.

    python tests/e2e/two_node_service.py WORKDIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from webapp.localredis import ensure_redis  # noqa: E402
from webapp.stack import BIN, Stack, free_port, wait_until  # noqa: E402

NODE_CPUS = 2
CONFIG = {"iterations": 1, "model": {"preset": "tiny"}, "sft": {"enabled": False},
          # Three 1-CPU workers: more than one 2-CPU node holds, so the gang must span both.
          "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 8, "workers": 2}}


def alive_nodes(dashboard: str) -> int:
    from webapp.cluster.ray_view import ray_nodes

    return len([n for n in ray_nodes(timeout_s=5).get("nodes", []) if n.get("state") == "ALIVE"])


def main(workdir: Path) -> dict[str, Any]:
    redis_url, local_redis = ensure_redis("redis://127.0.0.1:6379/0")
    os.environ.update({"DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}", "REDIS_URL": redis_url,
                       "CELERY_BROKER_URL": redis_url, "EARL_RUNS_DIR": str(workdir / "runs"),
                       "EARL_CANCEL_POLL_S": "1", "DJANGO_SETTINGS_MODULE": "webapp.settings"})
    stack = Stack(env=dict(os.environ), log_dir=workdir / "logs")
    try:
        address = stack.start_ray_head(port=free_port(), dashboard_port=free_port(), num_cpus=NODE_CPUS)
        stack.spawn("ray-node-2", [str(BIN / "ray"), "start", f"--address={address}", "--block",
                                   "--node-ip-address=127.0.0.1", f"--num-cpus={NODE_CPUS}", "--disable-usage-stats"])
        os.environ.update({"RAY_ADDRESS": address, "RAY_DASHBOARD_URL": stack.env["RAY_DASHBOARD_URL"],
                           "RAY_AUTH_MODE": "disabled"})
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        wait_until(lambda: alive_nodes(stack.env["RAY_DASHBOARD_URL"]) == 2, timeout_s=90,
                   what="the second Ray node in the dashboard")
        stack.start_celery_worker(name=f"w{free_port()}")
        return run_one(stack)
    finally:
        stack.stop()
        if local_redis is not None:
            local_redis.stop()


def run_one(stack: Stack) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from webapp.accounts.models import Membership, Team
    from webapp.runs.models import Run
    from webapp.runs.services import submit_run
    from webapp.scheduling.models import Allocation
    from webapp.scheduling.submission import cluster_nodes

    user = get_user_model().objects.create_user("two-node", password="two-node-password-1")
    team = Team.objects.create(name="Two nodes", slug="two-nodes")
    Membership.objects.create(user=user, team=team, role="admin")
    run = submit_run(user=user, team=team, name="across two nodes", config=CONFIG)
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_finished and (run.summary or run.status == Run.Status.FAILED):
            break
        dead = stack.first_dead()
        if dead is not None:
            raise RuntimeError(f"{dead} died; logs in {stack.log_dir}")
        time.sleep(1)
    allocation = Allocation.objects.get(run=run)
    from webapp.cluster.ray_view import ray_nodes

    node_ids = sorted(n.name for n in cluster_nodes(ray_nodes(timeout_s=5)) or ())
    return {"status": run.status, "error": run.error, "iterations_done": run.iterations_done,
            "cluster_nodes": node_ids, "placement": allocation.placement, "allocation_end": allocation.end,
            "worker_nodes": worker_nodes(stack.env["RAY_ADDRESS"])}


def worker_nodes(address: str) -> dict[str, list[str]]:
    """Where Ray ran the run's workers (actors stay listed, dead, after the run): class name -> node ids."""
    import ray
    from ray.util.state import list_actors

    ray.init(address=address, logging_level="ERROR")
    try:
        out: dict[str, list[str]] = {}
        for actor in list_actors(limit=1000, raise_on_missing_output=False):
            if actor.class_name in ("RolloutWorker", "TrainerWorker"):
                out.setdefault(actor.class_name, []).append(actor.node_id)
        return out
    finally:
        ray.shutdown()


if __name__ == "__main__":
    result = main(Path(sys.argv[1]))
    print("RESULT " + json.dumps(result))
