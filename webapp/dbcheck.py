"""`python -m webapp.dbcheck URL`: exit 0 when a PostgreSQL answers at URL (the Makefile's PostgreSQL test pass)."""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

import psycopg


def reachable(url: str) -> bool:
    parts = urlsplit(url)
    # Connect to the server's maintenance database: the test run creates its own test database.
    try:
        with psycopg.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 5432, user=parts.username or "postgres",
                             password=parts.password or None, dbname="postgres", connect_timeout=3):
            return True
    except psycopg.Error:
        return False


if __name__ == "__main__":
    sys.exit(0 if len(sys.argv) == 2 and reachable(sys.argv[1]) else 1)
