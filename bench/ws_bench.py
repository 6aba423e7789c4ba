"""ws_bench: latency from an event leaving the worker to its arrival at websocket viewers of one run.

The real path: the worker's EventRelay stores each batch in the database and publishes it on the Redis channel
layer; a real ASGI server (daphne) runs the run's consumer; viewers are websocket clients with API tokens.
Each event carries the time it was handed to the relay; a viewer's latency is its arrival time minus that.
Runs with 1 and with 50 viewers (same event stream), checks every viewer got every seq exactly once, in order.

    .venv/bin/python bench/ws_bench.py [--events 2000] [--rate 200] [--viewers 1,50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_io import django_on_private_sqlite  # noqa: E402


def _make_run() -> tuple[int, str]:
    from django.contrib.auth import get_user_model

    from webapp.accounts.models import ApiToken, Membership, Team
    from webapp.runs.models import Run

    user = get_user_model().objects.create_user("bench", password="bench-password-123")
    team = Team.objects.create(name="Bench", slug="bench")
    Membership.objects.create(user=user, team=team, role="admin")
    run = Run.objects.create(team=team, owner=user, name="ws-bench", config={}, status="running")
    return run.pk, ApiToken.issue(user)[1]


async def _viewer(url: str, key: str, expect: int, arrivals: list[tuple[int, float, float]], ready: asyncio.Event,
                  counter: list[int], total: int) -> None:
    from websockets.asyncio.client import connect

    origin = url.replace("ws://", "http://").split("/ws/")[0]  # Channels checks Origin against ALLOWED_HOSTS
    async with connect(url, additional_headers={"Authorization": f"Token {key}"}, origin=origin,
                       max_queue=None) as ws:
        counter[0] += 1
        if counter[0] == total:
            ready.set()
        while len(arrivals) < expect:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
            arrivals.append((frame["seq"], time.time(), frame["data"]["t_sent"]))


def _emit(run_id: int, events: int, rate: float, start_seq: int) -> float:
    """The worker side: the real EventRelay, fed at `rate` events/s; returns seconds spent emitting."""
    from django.utils import timezone

    from workers.relay import EventRelay

    relay = EventRelay(run_id)
    t0 = time.perf_counter()
    for i in range(events):
        target = t0 + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        relay({"v": 1, "run": run_id, "seq": start_seq + i + 1, "ts": timezone.now().isoformat(), "type": "log",
               "data": {"level": "info", "message": f"event {i}", "t_sent": time.time()}})
    relay.close()
    return time.perf_counter() - t0


def _measure(ws_url: str, key: str, run_id: int, viewers: int, events: int, rate: float, start_seq: int) -> dict[str, Any]:
    arrivals: list[list[tuple[int, float, float]]] = [[] for _ in range(viewers)]

    async def main() -> float:
        ready, counter = asyncio.Event(), [0]
        url = f"{ws_url}/ws/runs/{run_id}/?after={start_seq}"
        tasks = [asyncio.create_task(_viewer(url, key, events, arrivals[i], ready, counter, viewers))
                 for i in range(viewers)]
        await asyncio.wait_for(ready.wait(), 60)
        emit_s = await asyncio.to_thread(_emit, run_id, events, rate, start_seq)
        await asyncio.gather(*tasks)
        return emit_s

    emit_s = asyncio.run(main())
    expected = list(range(start_seq + 1, start_seq + events + 1))
    complete = all([a[0] for a in got] == expected for got in arrivals)
    lat_ms = sorted((recv - sent) * 1000 for got in arrivals for _, recv, sent in got)
    q = statistics.quantiles(lat_ms, n=100)
    return {"viewers": viewers, "events": events, "rate_per_s": rate, "emit_seconds": emit_s,
            "every_viewer_got_every_seq_once_in_order": complete,
            "latency_ms": {"p50": q[49], "p99": q[98], "max": lat_ms[-1], "mean": statistics.fmean(lat_ms)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--rate", type=float, default=200.0, help="events per second from the worker")
    p.add_argument("--viewers", default="1,50")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "ws_bench.json"))
    args = p.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="ws-bench-")
    redis_url = django_on_private_sqlite(str(Path(tmp) / "db.sqlite3"))
    run_id, key = _make_run()
    from webapp.stack import Stack, free_port

    stack = Stack(env={**os.environ}, log_dir=Path(tmp) / "logs")
    try:
        http = stack.start_asgi(port=free_port())
        ws_url = http.replace("http://", "ws://")
        results, seq = [], 0
        for n in (int(v) for v in args.viewers.split(",")):
            results.append(_measure(ws_url, key, run_id, n, args.events, args.rate, seq))
            seq += args.events
    finally:
        stack.stop()
    print(f"{'viewers':>8}{'events':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}  complete")
    for r in results:
        lat = r["latency_ms"]
        print(f"{r['viewers']:>8}{r['events']:>8}{lat['p50']:>9.1f}{lat['p99']:>9.1f}{lat['max']:>9.1f}  "
              f"{r['every_viewer_got_every_seq_once_in_order']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"redis": redis_url, "server": "daphne, 1 process", "results": results}, indent=2))
    print(f"wrote {out}")
    return 0 if all(r["every_viewer_got_every_seq_once_in_order"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
