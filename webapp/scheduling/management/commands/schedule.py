"""`manage.py schedule`: every few seconds (or once with --once), recover runs whose worker was lost, then run an
admission pass.

Passes already run on every submit, cancel and run end; this loop catches what no such event announces: a worker
that died (its run's lease went stale: webapp.runs.leases), a node that joined or left the cluster, a cluster view
that could not be read at the last pass, a pass that failed.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.runs.leases import recover_lost_runs
from webapp.scheduling.admission import admission_pass


class Command(BaseCommand):
    help = "Recover runs of lost workers and run the scheduler's admission pass, periodically (or once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=15.0, help="seconds between passes (default 15)")
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    def handle(self, *args: Any, every: float, once: bool, **options: Any) -> None:
        if not every > 0:
            raise CommandError(f"--every must be a positive number of seconds, got {every:g}")
        stopping = False

        def stop(*_: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while not stopping:
            try:
                for recovery in recover_lost_runs():
                    self.stdout.write(f"run {recovery.run_id} {recovery.message}")
                result = admission_pass()
                if result.admitted or result.preempted or once:
                    self.stdout.write(f"admitted {list(result.admitted)}, preempting {list(result.preempted)}, "
                                      f"{result.waiting} waiting"
                                      + ("" if result.capacity_known else " (cluster view unavailable)"))
            except Exception as exc:  # a database or dashboard hiccup: say so and try again next time
                if once:
                    raise CommandError(f"scheduling pass failed: {type(exc).__name__}: {exc}") from exc
                self.stderr.write(f"scheduling pass failed: {type(exc).__name__}: {exc}")
            if once:
                return
            deadline = time.monotonic() + every
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.2)
