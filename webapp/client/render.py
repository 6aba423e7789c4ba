"""Plain-text shapes of runs, events and metrics for a terminal (tables, one line per event)."""

from __future__ import annotations

import json
from typing import Any

# The metrics a person watching a run looks at first, with short labels.
KEY_METRICS = {
    "rollout/win_rate": "win",
    "rollout/reward_mean": "reward",
    "perf/tokens_per_s": "tok/s",
    "context/mean": "ctx",
}


def number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [header, *rows]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def when(iso: str | None) -> str:
    """`2026-01-02T03:04:05.678Z` as `2026-01-02 03:04` (UTC, like the service)."""
    return iso[:16].replace("T", " ") if iso else "-"


def progress(run: dict[str, Any]) -> str:
    total = run.get("total_iterations")
    return f"{run.get('iterations_done', 0)}/{total if total is not None else '?'}"


def runs_table(runs: list[dict[str, Any]]) -> str:
    rows = [[str(r["id"]), r["name"], r.get("team_name") or str(r["team"]), r["status"], progress(r), when(r["created_at"])]
            for r in runs]
    return table(rows, ["ID", "NAME", "TEAM", "STATUS", "ITERATIONS", "CREATED"])


def run_details(run: dict[str, Any]) -> str:
    fields = [
        ("run", f"{run['id']}  {run['name']}"),
        ("team", run.get("team_name") or str(run["team"])),
        ("owner", run.get("owner", "")),
        ("status", run["status"] + ("  (cancel requested)" if run.get("cancel_requested") and run["status"] != "cancelled" else "")),
        ("priority", run.get("priority", "")),
        ("iterations", progress(run)),
        ("created", when(run.get("created_at"))),
        ("started", when(run.get("started_at"))),
        ("finished", when(run.get("finished_at"))),
        ("events", str(run.get("last_seq", 0))),
    ]
    if run.get("cloned_from"):
        fields.append(("cloned from", f"run {run['cloned_from']}"))
    if run.get("error"):
        fields.append(("error", run["error"].strip().splitlines()[-1]))
    for key, value in (run.get("summary") or {}).items():
        fields.append((f"summary.{key}", number(value)))
    width = max(len(k) for k, _ in fields)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in fields)


def metric_values(values: dict[str, Any], keys: dict[str, str] = KEY_METRICS) -> str:
    return "  ".join(f"{label}={number(values[k])}" for k, label in keys.items() if k in values)


def _event_text(kind: str, d: dict[str, Any]) -> str:
    if kind == "run.status":
        return d.get("status", "") + (f": {d['message']}" if d.get("message") else "")
    if kind == "metrics":
        shown = metric_values(d.get("values", {})) or metric_values(d.get("values", {}), {k: k for k in d.get("values", {})})
        return f"iteration {d.get('iteration')}  {shown}"
    if kind == "log":
        return f"[{d.get('level', '')}] {d.get('message', '')}"
    if kind == "error":
        return f"{d.get('kind') or 'error'}: {d.get('message', '')}"
    if kind == "game.end":
        return (f"iteration {d.get('iteration')} game {d.get('game')}: {d.get('result')} vs {d.get('opponent')} "
                f"reward={number(d.get('reward'))} moves={d.get('moves')}")
    if kind == "game.move":
        return f"iteration {d.get('iteration')} game {d.get('game')} ply {d.get('ply')}: {d.get('player')} -> {d.get('column')}"
    if kind == "selector.decision":
        verb = "switched to" if d.get("switched") else "kept"
        return f"{d.get('stage')}: {verb} {json.dumps(d.get('new_layout'), sort_keys=True)} ({d.get('reason', '')})"
    if kind == "dispatch":
        return f"iteration {d.get('iteration')}: {d.get('bytes_moved')} bytes in {number(d.get('seconds'))} s"
    if kind == "memory":
        return f"iteration {d.get('iteration')}: {len(d.get('workers', []))} workers"
    return json.dumps(d, sort_keys=True)


def event_line(envelope: dict[str, Any]) -> str:
    """`#12  2026-01-02T03:04:05Z  metrics  iteration 3  win=0.5 ...`"""
    return f"#{envelope['seq']}  {envelope.get('ts', '')}  {envelope['type']}  {_event_text(envelope['type'], envelope.get('data') or {})}"


def metrics_table(rows: list[dict[str, Any]]) -> str:
    keys = sorted({k for r in rows for k in r["values"]})
    return table([[str(r["iteration"]), *(number(r["values"].get(k)) for k in keys)] for r in rows], ["iteration", *keys])
