"""`make run`: Redis (found or started), migrations, a demo login, a local Ray head, a Celery worker and the web server."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from webapp.localredis import ensure_redis

ROOT = Path(__file__).resolve().parent.parent


def _demo_login(state_dir: Path) -> tuple[str, str]:
    """The demo team and user, made on first start; the generated password is kept (0600) to print on every start."""
    from django.contrib.auth import get_user_model

    from webapp.accounts.models import Membership, Team

    secret = state_dir / "demo-login.txt"
    users = get_user_model()
    if users.objects.filter(username="demo").exists() and secret.exists():
        return "demo", secret.read_text().strip()
    password = os.environ.get("EARL_DEMO_PASSWORD") or secrets.token_urlsafe(9)
    user, _ = users.objects.get_or_create(username="demo")
    user.set_password(password)
    user.save()
    team, _ = Team.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
    Membership.objects.get_or_create(user=user, team=team, defaults={"role": Membership.Role.ADMIN})
    state_dir.mkdir(parents=True, exist_ok=True)
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    return "demo", password


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default=os.environ.get("EARL_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("EARL_PORT", "8000")))
    p.add_argument("--workers", type=int, default=1, help="Celery worker processes (runs trained at once)")
    p.add_argument("--ray-port", type=int, default=6380, help="Ray head port (never 6379: that is Redis)")
    args = p.parse_args(argv)

    redis_url, local_redis = ensure_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        return _serve(args, redis_url, started_redis=local_redis is not None)
    finally:
        if local_redis is not None:  # also when migrations or start-up fail
            local_redis.stop()


def _serve(args: argparse.Namespace, redis_url: str, *, started_redis: bool) -> int:
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    os.environ.setdefault("EARL_SERVE_STATIC", "1")  # one machine, no separate static file server

    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    from webapp.stack import Stack

    print(f"redis: {redis_url}" + (" (started here)" if started_redis else ""), flush=True)
    call_command("migrate", interactive=False, verbosity=0)
    user, password = _demo_login(Path(settings.EARL_RUNS_DIR))

    stack = Stack(env=dict(os.environ), log_dir=Path(settings.EARL_RUNS_DIR) / "logs")
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if os.environ.get("RAY_ADDRESS"):
            print(f"ray: using the cluster at {os.environ['RAY_ADDRESS']}", flush=True)
        else:
            print("ray: starting a local head ...", flush=True)
            # Logical CPUs at least 4: a run places a rollout and a trainer worker even on a 2-core machine.
            address = stack.start_ray_head(port=args.ray_port, num_cpus=max(os.cpu_count() or 1, 4))
            print(f"ray: {address} (dashboard {stack.env['RAY_DASHBOARD_URL']})", flush=True)
        for i in range(args.workers):
            stack.start_celery_worker(name=f"worker{i + 1}")
        # Passes run on submit, cancel and run end; this one catches what no event announces (see `schedule`),
        # and recovers the runs of workers that died.
        stack.start_scheduler()
        url = stack.start_asgi(host=args.host, port=args.port)
        print(f"\nEARL service is up: {url}/   (API docs {url}/api/docs/)\n  login: {user} / {password}\n"
              f"  logs: {stack.log_dir}\n  Ctrl-C stops everything.", flush=True)
        while not stopping:
            dead = stack.first_dead()
            if dead:
                print(f"{dead[0]} exited with code {dead[1]}; see {stack.log_dir / (dead[0] + '.log')}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        print("stopping ...", flush=True)
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
