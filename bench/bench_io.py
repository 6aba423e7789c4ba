"""What the benchmarks share: writing a result as JSON next to the others, and Django on a private database."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_result(result: dict[str, Any], out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return path


def django_on_private_sqlite(db_path: str) -> str:
    """A private SQLite database and a reachable Redis (database 8, never a running service's), then Django and its
    tables; returns the Redis URL."""
    from webapp.localredis import ensure_redis

    os.environ["DATABASE_URL"] = f"sqlite:///{db_path}"
    url, _local = ensure_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0").rsplit("/", 1)[0] + "/8")
    os.environ["REDIS_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return url
