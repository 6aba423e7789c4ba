"""Sends work to the Celery workers by task name, so the web side never imports the workers package."""

from __future__ import annotations

from functools import lru_cache

from celery import Celery
from django.conf import settings

EXECUTE_RUN = "workers.execute_run"


@lru_cache(maxsize=1)
def _producer() -> Celery:
    return Celery("earl", broker=settings.CELERY_BROKER_URL)


def enqueue_run(run_id: int) -> None:
    """Queue a run for a worker; the argument is the run's id, never an ORM object."""
    _producer().send_task(EXECUTE_RUN, args=[run_id])
