"""Clients of the load bench: websocket viewers that record every seq they receive, and REST pollers that time requests."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import requests
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

# Close codes the consumer uses for "this will never work" (webapp.runs.consumers): a viewer stops instead of retrying.
FINAL_CLOSE_CODES = {4400, 4401, 4404}
RECONNECT_PAUSE_S = 0.5


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | int]:
    """p50/p95/p99/max (scaled: seconds -> ms by default) and the sample count; empty: just the count."""
    if not values:
        return {"n": 0}
    ordered = sorted(v * scale for v in values)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 99
    return {"n": len(ordered), "p50": round(q[49], 1), "p95": round(q[94], 1), "p99": round(q[98], 1),
            "max": round(ordered[-1], 1)}


@dataclass
class ViewerLog:
    """What one viewer of one run saw: every event seq in arrival order, and the latency of events made after it
    first connected (arrival time at this client minus the envelope's `ts`, stamped where the event was made)."""

    run_id: int
    seqs: list[int] = field(default_factory=list)
    latencies_s: dict[int, float] = field(default_factory=dict)  # seq -> seconds
    reconnects: int = 0
    closes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connected_at: float | None = None

    def check(self, last_seq: int) -> dict[str, Any]:
        """Exactly 1..last_seq, each once, in order?"""
        seen = Counter(self.seqs)
        lost = [s for s in range(1, last_seq + 1) if s not in seen]
        duplicated = sorted(s for s, n in seen.items() if n > 1)
        extra = sorted(s for s in seen if not 1 <= s <= last_seq)
        in_order = all(a < b for a, b in zip(self.seqs, self.seqs[1:]))
        return {"frames": len(self.seqs), "lost": len(lost), "duplicated": len(duplicated), "beyond_stored": len(extra),
                "in_order": in_order, "ok": not lost and not duplicated and not extra and in_order,
                "first_lost": lost[:5], "first_duplicated": duplicated[:5]}


def first_arrivals(logs: list[ViewerLog]) -> list[float]:
    """Per event, the latency of the first viewer that got it: the worker -> server part, without the fan-out."""
    first: dict[tuple[int, int], float] = {}
    for log in logs:
        for seq, latency in log.latencies_s.items():
            key = (log.run_id, seq)
            first[key] = min(latency, first.get(key, latency))
    return list(first.values())


class Viewers:
    """`count` websocket viewers spread round-robin over runs, in one asyncio loop on a thread of their own.

    Each reads `/ws/runs/<id>/?after=0` and, after a drop it did not ask for, reconnects with `after=<last seq seen>`
    (what a client is meant to do). `finish(targets)` tells each to stop once it has seen its run's last stored seq.
    """

    def __init__(self, ws_url: str, key: str, run_ids: list[int], count: int) -> None:
        self.ws_url, self.key = ws_url, key
        self.logs = [ViewerLog(run_ids[i % len(run_ids)]) for i in range(count)]
        self.targets: dict[int, int] = {}
        self.connected = threading.Event()
        self._stop_all = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="viewers", daemon=True)

    def start(self, *, timeout_s: float) -> None:
        self._thread.start()
        if not self.connected.wait(timeout_s):
            raise RuntimeError(f"not all {len(self.logs)} viewers connected within {timeout_s:.0f} s")

    def finish(self, targets: dict[int, int], *, timeout_s: float) -> bool:
        """Let every viewer read up to its run's last stored seq; False when some did not within the deadline."""
        self.targets.update(targets)  # read by the viewers' loop between frames (a dict update is atomic)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._stop_all = True
            self._thread.join(30)
            return False
        return True

    async def _main(self) -> None:
        opened = [0]
        await asyncio.gather(*(self._watch(log, opened) for log in self.logs))

    def _done(self, log: ViewerLog) -> bool:
        target = self.targets.get(log.run_id)
        return self._stop_all or (target is not None and (log.seqs[-1] if log.seqs else 0) >= target)

    async def _watch(self, log: ViewerLog, opened: list[int]) -> None:
        origin = self.ws_url.replace("ws://", "http://")  # Channels checks Origin against ALLOWED_HOSTS
        while not self._done(log):
            after = log.seqs[-1] if log.seqs else 0
            try:
                # No client pings, like a browser; max_queue=None: never push back on the server from the client.
                async with connect(f"{self.ws_url}/ws/runs/{log.run_id}/?after={after}", origin=origin,
                                   additional_headers={"Authorization": f"Token {self.key}"}, max_queue=None,
                                   ping_interval=None, open_timeout=60) as ws:
                    if log.connected_at is None:
                        log.connected_at = time.time()
                        opened[0] += 1
                        if opened[0] == len(self.logs):
                            self.connected.set()
                    else:
                        log.reconnects += 1
                    await self._read(ws, log)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                log.closes.append(f"{code}: {exc.rcvd.reason if exc.rcvd else 'no close frame'}")
                if code in FINAL_CLOSE_CODES:
                    log.errors.append(f"closed with {code}")
                    return
            except InvalidStatus as exc:  # refused by the server (403 origin, 500): retrying will not help
                log.errors.append(f"refused: {exc}")
                return
            except (OSError, TimeoutError) as exc:
                log.errors.append(f"connect: {type(exc).__name__}: {exc}")
            except Exception as exc:  # a bad frame: recorded on this viewer (its check then fails), the others go on
                log.errors.append(f"{type(exc).__name__}: {exc}")
                return
            if not self._done(log):
                await asyncio.sleep(RECONNECT_PAUSE_S)  # back off before reconnecting (a pace, not a wait for state)

    async def _read(self, ws: Any, log: ViewerLog) -> None:
        while not self._done(log):
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=1.0)  # wakes up to look at the targets
            except TimeoutError:
                continue
            arrived = time.time()
            frame = json.loads(raw)
            if "seq" not in frame:
                continue  # pong / protocol.error frames carry no event
            log.seqs.append(frame["seq"])
            made = datetime.fromisoformat(frame["ts"]).timestamp()
            if log.connected_at is not None and made >= log.connected_at:
                log.latencies_s[frame["seq"]] = arrived - made


@dataclass
class ApiSample:
    endpoint: str
    status: int  # 0: no answer (connection error, timeout)
    latency_s: float


@dataclass
class ApiLog:
    """Every timed REST request: its endpoint (the path's pattern), status and latency."""

    samples: list[ApiSample] = field(default_factory=list)

    def timed(self, session: requests.Session, endpoint: str, method: str, url: str,
              body: dict[str, Any] | None = None) -> requests.Response | None:
        start = time.perf_counter()
        try:
            resp = session.request(method, url, json=body, timeout=60)
        except requests.RequestException:
            self.samples.append(ApiSample(endpoint, 0, time.perf_counter() - start))  # list.append: thread-safe
            return None
        self.samples.append(ApiSample(endpoint, resp.status_code, time.perf_counter() - start))
        return resp

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for endpoint in sorted({s.endpoint for s in self.samples}):
            mine = [s for s in self.samples if s.endpoint == endpoint]
            out[endpoint] = {**percentiles([s.latency_s for s in mine]),
                             "status": dict(sorted(Counter(str(s.status) for s in mine).items()))}
        return out

    def count(self, *, server_error: bool) -> int:
        """Answers of 5xx (server_error) or requests that got no answer at all."""
        return sum((s.status >= 500) if server_error else (s.status == 0) for s in self.samples)


def api_session(key: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {key}"
    return session


class Pollers:
    """`clients` threads, each sending one GET every `interval_s` in turn: the run list, a run, the run's events
    after the last seq that client read (checking each page continues exactly where the last one ended)."""

    def __init__(self, http_url: str, key: str, run_ids: list[int], api: ApiLog, *, clients: int,
                 interval_s: float) -> None:
        self.http_url, self.key, self.run_ids, self.api = http_url, key, run_ids, api
        self.interval_s = interval_s
        self.event_gaps: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, args=(i,), name=f"poller-{i}", daemon=True)
                         for i in range(clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _poll(self, index: int) -> None:
        session, base = api_session(self.key), self.http_url
        cursors = {run_id: 0 for run_id in self.run_ids}
        tick, turn = time.monotonic(), index  # clients start at different points of the rotation
        while not self._stop.is_set():
            run_id = self.run_ids[(turn // 3) % len(self.run_ids)]
            kind = turn % 3
            if kind == 0:
                self.api.timed(session, "GET /api/runs/", "GET", f"{base}/api/runs/")
            elif kind == 1:
                self.api.timed(session, "GET /api/runs/<id>/", "GET", f"{base}/api/runs/{run_id}/")
            else:
                resp = self.api.timed(session, "GET /api/runs/<id>/events/?after=", "GET",
                                      f"{base}/api/runs/{run_id}/events/?after={cursors[run_id]}&limit=1000")
                if resp is not None and resp.status_code == 200:
                    seqs = [e["seq"] for e in resp.json()["events"]]
                    if seqs and seqs != list(range(cursors[run_id] + 1, cursors[run_id] + len(seqs) + 1)):
                        self.event_gaps.append(f"run {run_id} after {cursors[run_id]}: {seqs[:5]}...")
                    cursors[run_id] = seqs[-1] if seqs else cursors[run_id]
            turn += 1
            # At most one request per interval per client; a slow answer delays the next one (no catch-up burst).
            tick = max(tick + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, tick - time.monotonic()))
