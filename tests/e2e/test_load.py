"""The service under a short load: 2 concurrent runs, 20 websocket viewers and REST pollers on the real processes;
every viewer gets every event of its run exactly once, in order, and the API never answers 5xx. The same code as
bench/load_bench.py (run as a script, on its own SQLite file and the session's Redis database), with small numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "load_bench.py"
sys.path.insert(0, str(ROOT / "bench"))  # the bench's modules are scripts' neighbours, not a package

from load_clients import ViewerLog  # noqa: E402


@pytest.mark.slow
def test_every_viewer_gets_every_event_once_in_order_under_load(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    # Start-up (Ray head, Celery, daphne, two vLLM engines) takes ~35 s here; then 20 s with both runs training.
    argv = [sys.executable, str(BENCH), "--runs", "2", "--viewers", "20", "--duration", "20",
            "--database-url", f"sqlite:///{tmp_path / 'db.sqlite3'}", "--out", str(out),
            "--redis-db", os.environ.get("EARL_TEST_REDIS_DB", "9"), "--start-timeout", "150", "--drain-timeout", "90"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert out.exists(), f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(out.read_text())
    context = f"logs in {result['logs']}; errors {result['errors']}"

    assert result["errors"] == [], context
    runs = result["runs"]
    # Both trained at the same time, long enough to matter, and stopped when cancelled.
    assert [r["status_when_load_ended"] for r in runs] == ["running", "running"], context
    assert [r["status"] for r in runs] == ["cancelled", "cancelled"], context
    assert all(r["stored_gap_free"] and r["events"] >= 30 for r in runs), runs

    viewers = result["viewers"]
    assert viewers["count"] == 20 and viewers["exact"] == 20, viewers["failures"]
    assert viewers["with_loss"] == viewers["with_duplicates"] == viewers["out_of_order"] == 0
    assert viewers["frames_total"] == 10 * sum(r["events"] for r in runs)  # 10 viewers per run
    assert result["event_latency_ms"]["n"] > 0

    api = result["api_latency_ms"]
    assert {"GET /api/runs/", "GET /api/runs/<id>/", "GET /api/runs/<id>/events/?after="} <= set(api)
    assert result["api_5xx"] == 0 and result["api_no_answer"] == 0, api
    assert result["api_events_page_gaps"] == []
    assert result["ok"] and done.returncode == 0


def test_the_viewer_check_catches_a_lost_a_duplicated_and_a_reordered_event() -> None:
    assert ViewerLog(1, seqs=[1, 2, 3]).check(3)["ok"]
    assert ViewerLog(1, seqs=[1, 3]).check(3)["lost"] == 1
    assert ViewerLog(1, seqs=[1, 2, 2, 3]).check(3)["duplicated"] == 1
    assert not ViewerLog(1, seqs=[2, 1, 3]).check(3)["in_order"]
    assert not ViewerLog(1, seqs=[1, 2, 3, 4]).check(3)["ok"]  # more than the database holds
