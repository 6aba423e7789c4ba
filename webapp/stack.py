"""The one-machine stack as child processes: a Ray head, Celery workers and the ASGI server (used by `make run` and tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    """Poll `check` until it holds; a clear error naming `what` when the deadline passes or the process dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with code {proc.returncode}")
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not ready after {timeout_s:.0f} s")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (loopback)
            return resp.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError):
        return False


def database_url(db: dict[str, object]) -> str:
    """A Django DATABASES entry as the DATABASE_URL a child process needs to reach the same database."""
    if str(db["ENGINE"]).endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"  # NAME is absolute, so this is sqlite:////abs/path
    auth = str(db["USER"]) + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@dataclass
class Stack:
    """Child processes started in order and stopped in reverse; `env` is what every child sees."""

    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    log_dir: Path = field(default_factory=lambda: ROOT / "runs" / "service" / "logs")
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # A process group of its own, so stopping it also stops what it started (vLLM, raylets).
        with (self.log_dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def start_ray_head(self, *, port: int = 6380, dashboard_port: int = 8265, num_cpus: int | None = None) -> str:
        """A Ray head on loopback (auth off, as for any local cluster); sets RAY_ADDRESS and RAY_DASHBOARD_URL."""
        self.env["RAY_AUTH_MODE"] = "disabled"
        # Draining on SIGTERM is for Ray Serve replicas (none here); it would hold every stop for 30 s.
        self.env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
        argv = [str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
                "--disable-usage-stats"]
        if num_cpus is not None:
            argv.append(f"--num-cpus={num_cpus}")
        proc = self.spawn("ray", argv)
        dashboard = f"http://127.0.0.1:{dashboard_port}"
        wait_until(lambda: http_ok(dashboard + "/api/version"), timeout_s=90, what="Ray head", proc=proc)
        self.env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        self.env["RAY_DASHBOARD_URL"] = dashboard
        return self.env["RAY_ADDRESS"]

    def start_celery_worker(self, *, name: str = "worker", concurrency: int = 1) -> subprocess.Popen[bytes]:
        """A Celery worker; each run gets a fresh child process (Ray and torch state never leak between runs)."""
        return self.spawn(name, [str(BIN / "celery"), "-A", "workers.celery_app", "worker", "-l", "INFO",
                                 "-n", f"{name}@%h", "-P", "prefork", "-c", str(concurrency),
                                 "--max-tasks-per-child=1", "--without-gossip", "--without-mingle"])

    def start_asgi(self, *, host: str = "127.0.0.1", port: int = 8000) -> str:
        proc = self.spawn("web", [str(BIN / "daphne"), "-b", host, "-p", str(port), "webapp.asgi:application"])
        url = f"http://{host}:{port}"
        wait_until(lambda: http_ok(url + "/login/"), timeout_s=60, what="ASGI server", proc=proc)
        return url

    def stop(self, timeout_s: float = 30.0) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + timeout_s
        for name, proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    print(f"{name} (pid {proc.pid}) did not exit after SIGKILL")
        self.procs.clear()

    def kill(self, name: str) -> None:
        """SIGKILL a child and everything it started (a crash, not a shutdown); it is no longer this stack's."""
        for entry in [p for p in self.procs if p[0] == name]:
            try:
                os.killpg(entry[1].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            entry[1].wait(30)
            self.procs.remove(entry)

    def start_scheduler(self, *, every_s: float = 15.0) -> subprocess.Popen[bytes]:
        """`manage.py schedule`: recovers runs of lost workers and runs admission passes, as `make run` does."""
        return self.spawn("scheduler", [sys.executable, "manage.py", "schedule", "--every", str(every_s)])

    def first_dead(self) -> tuple[str, int] | None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                return name, proc.returncode
        return None
