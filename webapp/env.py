"""Strict readers of environment variables for settings: a bad value stops start-up with the variable's name."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be >= {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str, *, base_dir: str) -> dict[str, object]:
    """Django DATABASES entry for ``sqlite:///path`` (relative to base_dir) or ``postgres://user:pw@host:port/name``."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # sqlite:///rel/path has path "/rel/path"; sqlite:////abs/path has "//abs/path"
        raw = unquote(parts.path)
        path = raw[1:]  # strip the slash that separates the empty host from the path
        if parts.netloc or not path:
            raise ImproperlyConfigured(f"DATABASE_URL={url!r}: expected sqlite:///relative/path or sqlite:////absolute/path")
        if not path.startswith("/"):
            path = os.path.join(base_dir, path)
        # A longer lock wait: the web process and the worker write the same file.
        # IMMEDIATE: a transaction takes the write lock when it starts, so two writers wait for each other instead of
        # one failing at once with "database is locked" (a cancel racing the event relay).
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": path,
                "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"}}
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL={url!r}: the database name is missing")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(f"DATABASE_URL={url!r}: scheme must be one of sqlite, postgres, postgresql")
