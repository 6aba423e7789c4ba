"""Browser tests: Debian's Chromium driven by Playwright against the whole stack (daphne, Celery, Ray, Redis).

They run in their own pytest process (`make test` does this): Playwright's sync API and pytest-asyncio's loops
do not share one process well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.webapp.conftest import alice, ants, redis_url, runs_dir  # noqa: F401 (fixtures)
from webapp.stack import Stack, database_url, free_port

# Playwright's sync API keeps an event loop in the test thread; the ORM calls the tests make are plain sync ones.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


@pytest.fixture
def service(redis_url: str, runs_dir: Any, transactional_db: None, tmp_path: Any) -> Iterator[str]:
    """The one-machine stack on the test database; yields the web URL."""
    stack = Stack(env={**os.environ, "DATABASE_URL": database_url(connection.settings_dict), "REDIS_URL": redis_url,
                       "CELERY_BROKER_URL": redis_url, "EARL_RUNS_DIR": str(runs_dir), "EARL_SERVE_STATIC": "1"},
                  log_dir=tmp_path / "logs")
    try:
        stack.start_ray_head(port=free_port(), dashboard_port=free_port(), num_cpus=4)
        stack.start_celery_worker(name=f"w{free_port()}")
        yield stack.start_asgi(port=free_port())
    finally:
        stack.stop()


@pytest.fixture
def page(service: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make browser-deps` installs Debian's chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(base_url=service, viewport={"width": 1400, "height": 1000})
        tab = context.new_page()
        tab.set_default_timeout(30_000)
        yield tab
        context.close()
        browser.close()
