"""Carries core events to the database and to live viewers in batches, from a thread of its own."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from django.db import close_old_connections, connection

from webapp.runs.live import publish_events
from webapp.runs.services import store_events

log = logging.getLogger(__name__)


class EventRelay:
    """A sink for the core: `relay(envelope)` returns at once; a thread stores and publishes batches.

    Batches are stored (committed) before they are published, so a viewer that notices a gap can always
    fill it from the database.
    """

    def __init__(self, run_id: int, *, lease: str | None = None, max_batch: int = 200,
                 max_delay_s: float = 0.1) -> None:
        self.run_id = run_id
        self.lease = lease
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"event-relay-{run_id}", daemon=True)
        self._thread.start()

    def __call__(self, envelope: dict[str, Any]) -> None:
        if self._error is not None:
            raise RuntimeError(f"event relay of run {self.run_id} failed: {self._error}") from self._error
        self._queue.put(envelope)

    def close(self, timeout: float = 600.0) -> None:
        """Flush what is queued and stop the thread; an error if it cannot (events would be lost silently)."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"event relay of run {self.run_id} did not flush within {timeout:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"event relay of run {self.run_id} failed: {self._error}") from self._error

    def _loop(self) -> None:
        try:
            done = False
            while not done:
                first = self._queue.get()
                if first is None:
                    break
                batch = [first]
                deadline = time.monotonic() + self.max_delay_s
                while len(batch) < self.max_batch:
                    try:
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if item is None:
                        done = True
                        break
                    batch.append(item)
                self._flush(batch)
        except BaseException as exc:  # reported to the run's thread at its next event or at close
            log.exception("event relay of run %s failed", self.run_id)
            self._error = exc
        finally:
            connection.close()

    def _flush(self, batch: list[dict[str, Any]]) -> None:
        close_old_connections()
        stored = store_events(self.run_id, batch, lease=self.lease)
        try:
            publish_events(self.run_id, stored)
        except Exception:  # live delivery is best effort; viewers catch up from the database by seq
            log.warning("could not publish %d events of run %s", len(stored), self.run_id, exc_info=True)
