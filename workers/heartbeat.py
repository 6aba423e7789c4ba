"""A worker's heartbeat: a thread renewing the lease of the run it holds, noticing when the lease was taken away."""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, connection

from webapp.runs.leases import renew

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews `lease` on the run every `every_s` from a thread of its own (a long core step never delays it).

    A renewal that finds the lease gone sets `lost`: the scheduler declared this worker dead and gave the run to
    another attempt, so this one must stop writing. A database error is not a loss: it is retried at the next beat
    (the lease outlives several missed beats).
    """

    def __init__(self, run_id: int, lease: str, *, every_s: float) -> None:
        self.run_id, self.lease, self.every_s = run_id, lease, every_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.every_s + 30)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.every_s):
                try:
                    if not renew(self.run_id, self.lease):
                        log.error("run %s: lease %s was taken away; this worker stops", self.run_id, self.lease)
                        self.lost.set()
                        return
                except DatabaseError:
                    log.warning("run %s: heartbeat not recorded; retrying", self.run_id, exc_info=True)
                    connection.close()  # a broken connection is reopened at the next beat
        finally:
            connection.close()
