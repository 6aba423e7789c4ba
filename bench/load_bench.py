"""load_bench: concurrent runs on the real service with websocket viewers and REST pollers; no event lost or duplicated.

Starts the whole service on loopback, on a private database and a private Redis database number: a Ray head, one
Celery worker with one pool process per run (`-c RUNS`: a run's task holds its process for the run's whole life;
one parent forks them all after importing once, which starts cheaper on 2 cores than RUNS separate workers), the
scheduler and one daphne. Submits RUNS long tiny runs through the REST API, opens VIEWERS websockets spread over
them (`/ws/runs/<id>/?after=0`, API token) and polls the REST API; once every run trains, it keeps that up for
DURATION seconds, then cancels the runs and lets every viewer read to its run's last stored event. Checks that every viewer got exactly seqs 1..last stored
seq of its run (the database's RunEvent rows), in order, once each. Event latency = arrival at the viewer - the
envelope's `ts`, which the worker stamps when the core makes the event (one clock: one machine), for events made
after the viewer connected. Exit status 1 when a viewer lost, duplicated or reordered an event, the API answered
5xx or not at all, or a run failed (every run should train until the bench cancels it).

    .venv/bin/python bench/load_bench.py [--runs 5] [--viewers 100] [--duration 300] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_io import write_result  # noqa: E402
from load_clients import ApiLog, Pollers, Viewers, api_session, first_arrivals, percentiles  # noqa: E402
from webapp.localredis import ensure_redis  # noqa: E402
from webapp.stack import Stack, free_port, wait_until  # noqa: E402

# A run that keeps producing events until it is cancelled: the tiny model, few short games per iteration, no warm
# start, the smallest vLLM KV cache (rounded up to 1 GiB), checkpoints only when it stops.
RUN_CONFIG: dict[str, Any] = {
    "iterations": 100_000,
    "checkpoint_every": 100_000,
    "model": {"preset": "tiny"},
    "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 8, "kv_cache_gib": 0.05},
    "sft": {"enabled": False},
}
FINISHED = {"succeeded", "failed", "cancelled"}
LATENCY_NOTE = ("event latency = arrival time at the viewer minus the envelope's ts, stamped by the worker when the "
                "core makes the event (includes the relay's batching window, the database write, Redis and daphne); "
                "only events made after the viewer connected")


def setup_django(database_url: str, redis_url: str, runs_dir: Path) -> None:
    """This process on the bench's database and Redis (the children inherit the same environment), tables migrated."""
    os.environ.update({"DATABASE_URL": database_url, "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
                       "EARL_RUNS_DIR": str(runs_dir), "EARL_CANCEL_POLL_S": "1",
                       "DJANGO_SETTINGS_MODULE": "webapp.settings"})
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def make_user() -> tuple[str, str]:
    """A team, its admin and an API token; names unique so a reused database (PostgreSQL) takes another bench."""
    from django.contrib.auth import get_user_model

    from webapp.accounts.models import ApiToken, Membership, Team

    tag = f"load-{int(time.time() * 1000)}"
    user = get_user_model().objects.create_user(tag, password=f"{tag}-password")
    team = Team.objects.create(name=tag, slug=tag)
    Membership.objects.create(user=user, team=team, role="admin")
    return team.slug, ApiToken.issue(user)[1]


def start_service(stack: Stack, runs: int) -> str:
    # Ray 2.60's head drains for up to 30 s on SIGTERM (for Serve replicas; there are none here), which outlasts
    # Stack.stop's wait and ends in a SIGKILL anyway: stop at once.
    stack.env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    # Each run places a 1-CPU rollout and a 1-CPU trainer worker; logical CPUs, not cores (2 here).
    stack.start_ray_head(port=free_port(), dashboard_port=free_port(), num_cpus=2 * runs + 2)
    stack.start_celery_worker(name=f"load{free_port()}", concurrency=runs)
    stack.start_scheduler()
    return stack.start_asgi(port=free_port())


def run_states(run_ids: list[int]) -> dict[int, tuple[str, bool, str]]:
    """Each run's status, whether its worker has recorded how it ended (summary written, or failed), its error."""
    from django.db import close_old_connections

    from webapp.runs.models import Run

    close_old_connections()
    return {r.pk: (r.status, r.summary != {} or r.status == "failed", r.error[:400])
            for r in Run.objects.filter(pk__in=run_ids)}


def stored_seqs(run_id: int) -> tuple[list[int], int]:
    from webapp.runs.models import Run, RunEvent

    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    return seqs, Run.objects.get(pk=run_id).last_seq


def submit(http: str, key: str, team: str, runs: int, api: ApiLog) -> list[int]:
    session, ids = api_session(key), []
    for i in range(runs):
        resp = api.timed(session, "POST /api/runs/", "POST", f"{http}/api/runs/",
                         {"team": team, "name": f"load-{i}", "config": {**RUN_CONFIG, "seed": i}})
        if resp is None or resp.status_code != 201:
            raise RuntimeError(f"submit {i}: {resp.status_code if resp else 'no answer'} {resp.text[:500] if resp else ''}")
        ids.append(resp.json()["id"])
    return ids


def load(args: argparse.Namespace, stack: Stack, http: str, team: str, key: str) -> dict[str, Any]:
    """Submit, watch and poll for the duration, cancel, drain; what every client saw, checked against the database."""
    api, errors, seconds = ApiLog(), [], {}
    submitted = time.monotonic()
    run_ids = submit(http, key, team, args.runs, api)
    viewers = Viewers(http.replace("http://", "ws://"), key, run_ids, args.viewers)
    viewers.start(timeout_s=120)
    seconds["submit_to_viewers_connected"] = time.monotonic() - submitted
    pollers = Pollers(http, key, run_ids, api, clients=args.api_clients, interval_s=args.api_interval)
    pollers.start()
    # The duration counts from the moment every run trains (viewers and pollers are already busy with start-up).
    try:
        wait_until(lambda: all(state == "running" or state in FINISHED for state, _, _ in run_states(run_ids).values()),
                   timeout_s=args.start_timeout, what="every run to be running")
    except RuntimeError as exc:
        errors.append(str(exc))
    load_start = time.monotonic()
    seconds["submit_to_all_running"] = load_start - submitted
    while time.monotonic() - load_start < args.duration:
        dead = stack.first_dead()
        if dead is not None:
            errors.append(f"{dead[0]} exited with code {dead[1]} after {time.monotonic() - load_start:.0f} s")
            break
        time.sleep(1)  # the load runs for a fixed time; this loop only watches the service's processes
    seconds["load"] = time.monotonic() - load_start
    pollers.stop()
    when_load_ended = {run_id: state[0] for run_id, state in run_states(run_ids).items()}
    load_average = os.getloadavg()[0]

    cancelled = time.monotonic()
    session = api_session(key)
    for run_id in run_ids:
        api.timed(session, "POST /api/runs/<id>/cancel/", "POST", f"{http}/api/runs/{run_id}/cancel/")
    try:
        wait_until(lambda: all(done for _, done, _ in run_states(run_ids).values()), timeout_s=args.drain_timeout,
                   what="the cancelled runs to stop")
    except RuntimeError as exc:
        errors.append(str(exc))
    stored = {run_id: stored_seqs(run_id) for run_id in run_ids}
    if not viewers.finish({run_id: last for run_id, (_, last) in stored.items()}, timeout_s=120):
        errors.append("some viewers did not receive their run's last stored event within 120 s of the runs' end")
    seconds["cancel_to_viewers_drained"] = time.monotonic() - cancelled
    result = report(args, stored, viewers, api, pollers.event_gaps, when_load_ended=when_load_ended, errors=errors)
    return {**result, "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "load_average_1m_at_end": round(load_average, 1)}


def report(args: argparse.Namespace, stored: dict[int, tuple[list[int], int]], viewers: Viewers, api: ApiLog,
           event_gaps: list[str], *, when_load_ended: dict[int, str], errors: list[str]) -> dict[str, Any]:
    states = run_states(list(stored))
    runs = []
    for run_id, (seqs, last) in stored.items():
        status, _, error = states[run_id]
        runs.append({"id": run_id, "status_when_load_ended": when_load_ended[run_id], "status": status,
                     "events": len(seqs), "last_seq": last, "stored_gap_free": seqs == list(range(1, last + 1)),
                     "error": error})
    checks = [{"run": log.run_id, **log.check(stored[log.run_id][1]), "reconnects": log.reconnects,
               "closes": log.closes[:3], "errors": log.errors[:3]} for log in viewers.logs]
    bad = [c for c in checks if not c["ok"]]
    api_5xx, api_no_answer = api.count(server_error=True), api.count(server_error=False)
    frames = [c["frames"] for c in checks]
    # A run that failed under load is a finding too: every run should train until the bench cancels it.
    runs_ok = all(r["stored_gap_free"] and r["status_when_load_ended"] == "running" and r["status"] == "cancelled"
                  for r in runs)
    return {
        "ok": not bad and runs_ok and not api_5xx and not api_no_answer and not event_gaps and not errors,
        "setup": {"runs": args.runs, "viewers": args.viewers, "duration_s": args.duration,
                  "api_clients": args.api_clients, "api_interval_s": args.api_interval,
                  "database": args.database_url.split("@")[-1], "redis_db": args.redis_db,
                  "server": "daphne, 1 process", "celery": f"1 worker, -c {args.runs} (prefork)",
                  "run_config": RUN_CONFIG},
        "runs": runs,
        "viewers": {"count": len(checks), "exact": len(checks) - len(bad),
                    "with_loss": sum(c["lost"] > 0 for c in checks),
                    "with_duplicates": sum(c["duplicated"] > 0 for c in checks),
                    "out_of_order": sum(not c["in_order"] for c in checks),
                    "reconnects": sum(c["reconnects"] for c in checks),
                    "frames_total": sum(frames), "frames_min": min(frames, default=0),
                    "frames_max": max(frames, default=0), "failures": bad[:10]},
        "event_latency_ms": percentiles([s for log in viewers.logs for s in log.latencies_s.values()]),
        "event_latency_first_viewer_ms": percentiles(first_arrivals(viewers.logs)),
        "event_latency_note": LATENCY_NOTE,
        "api_latency_ms": api.summary(),
        "api_5xx": api_5xx, "api_no_answer": api_no_answer, "api_events_page_gaps": event_gaps[:10],
        "errors": errors,
    }


def print_table(result: dict[str, Any]) -> None:
    v, lat = result["viewers"], result["event_latency_ms"]
    print("runs: " + ", ".join(f"{r['id']} {r['status']} {r['events']} events" for r in result["runs"]))
    print(f"viewers: {v['count']}, exact {v['exact']}/{v['count']}, frames {v['frames_total']} "
          f"({v['frames_min']}-{v['frames_max']} each), reconnects {v['reconnects']}")
    for name, lat in (("every viewer", lat), ("first viewer", result["event_latency_first_viewer_ms"])):
        print(f"event latency ms, {name}: p50 {lat.get('p50')} p95 {lat.get('p95')} p99 {lat.get('p99')} "
              f"max {lat.get('max')} (n={lat['n']})")
    print(f"{'endpoint':<42}{'n':>7}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}  status")
    for endpoint, s in result["api_latency_ms"].items():
        print(f"{endpoint:<42}{s['n']:>7}{s.get('p50', ''):>8}{s.get('p95', ''):>8}{s.get('p99', ''):>8}"
              f"{s.get('max', ''):>8}  {s['status']}")
    for error in result["errors"]:
        print(f"error: {error}")
    print("OK" if result["ok"] else "FAILED")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="concurrent runs (one Celery pool process each)")
    p.add_argument("--viewers", type=int, default=100, help="websocket viewers, spread evenly over the runs")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load once every run trains")
    p.add_argument("--database-url", default=None, help="default: a private SQLite file in a temporary folder")
    p.add_argument("--redis-db", type=int, default=12, help="private Redis database number (flushed at start)")
    p.add_argument("--api-clients", type=int, default=3, help="REST polling threads")
    p.add_argument("--api-interval", type=float, default=0.25, help="seconds between one client's requests")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds every run may take to start")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="seconds the cancelled runs may take to stop")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "load_bench.json"))
    args = p.parse_args(argv)
    if args.redis_db == 0:
        p.error("--redis-db 0 is a running service's database; the bench flushes its own")

    tmp = Path(tempfile.mkdtemp(prefix="load-bench-"))
    args.database_url = args.database_url or f"sqlite:///{tmp / 'db.sqlite3'}"
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0]
    redis_url, local_redis = ensure_redis(f"{base}/{args.redis_db}")  # a private redis-server when none answers
    redis.Redis.from_url(redis_url).flushdb()  # no stale broker messages or groups from an earlier bench
    setup_django(args.database_url, redis_url, tmp / "runs")
    team, key = make_user()
    stack = Stack(env=dict(os.environ), log_dir=tmp / "logs")
    started = time.monotonic()
    try:
        http = start_service(stack, args.runs)
        service_s = time.monotonic() - started
        result = load(args, stack, http, team, key)
    finally:
        stopping = time.monotonic()
        stack.stop()
        if local_redis is not None:
            local_redis.stop()
    result["seconds"] = {"start_service": round(service_s, 1), **result["seconds"],
                         "stop_service": round(time.monotonic() - stopping, 1)}
    result["logs"] = str(stack.log_dir)
    print(json.dumps(result, indent=1))
    print_table(result)
    write_result(result, args.out)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
