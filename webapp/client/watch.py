"""`earl submit --watch`: a live progress bar with the key metrics of one run, until it finishes."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from webapp.client.api import EarlApi
from webapp.client.follow import RunFollower
from webapp.client.render import event_line, metric_values


def _say(line: str) -> None:
    # stderr, like the bar: stdout keeps only what scripts read (the run id)
    tqdm.write(line, file=sys.stderr)


def watch_run(api: EarlApi, run: dict[str, Any], *, after: int = 0) -> str:
    """Follow the run's events and return its final status (succeeded | failed | cancelled)."""
    follower = RunFollower(api, run["id"], after=after, on_notice=_say)
    with tqdm(total=run.get("total_iterations"), desc=f"run {run['id']}", unit="it", file=sys.stderr,
              dynamic_ncols=True) as bar:
        for envelope in follower:
            data = envelope.get("data") or {}
            if envelope["type"] == "metrics":
                bar.set_postfix_str(metric_values(data.get("values", {})), refresh=False)
                bar.update(max(0, int(data["iteration"]) + 1 - bar.n))  # iteration is 0-based
            elif envelope["type"] in ("run.status", "error"):
                _say(event_line(envelope))
    return follower.final_status or "unknown"
