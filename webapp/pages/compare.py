"""Compare page logic: which runs were asked for, and how their configs differ (flattened dotted keys)."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import QuerySet

from earl_core.config import RunConfig
from earl_core.errors import ConfigError
from webapp.runs.models import Run

MIN_RUNS, MAX_RUNS = 2, 4
MISSING = "—"


class CompareError(Exception):
    """The request does not name 2-4 visible runs; `status` is the HTTP answer (400 bad input, 404 unknown run)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


def parse_run_ids(values: list[str]) -> list[int]:
    """Ids from `?runs=1,2,3` (or repeated `?runs=1&runs=2`), in order, without repeats."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not (part.isascii() and part.isdecimal()) or len(part) > 18:
                raise CompareError(f"{part[:20]!r} is not a run id; give run numbers like ?runs=12,15", status=400)
            if int(part) not in ids:
                ids.append(int(part))
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise CompareError(f"compare needs {MIN_RUNS} to {MAX_RUNS} different runs, got {len(ids)}", status=400)
    return ids


def runs_to_compare(visible: QuerySet[Run], ids: list[int]) -> list[Run]:
    """The runs in the order asked; an id the user cannot see is reported exactly like a missing one."""
    found = {r.pk: r for r in visible.filter(pk__in=ids).select_related("team", "owner")}
    unknown = [i for i in ids if i not in found]
    if unknown:
        raise CompareError(f"no run {', '.join(map(str, unknown))} among your teams' runs", status=404)
    return [found[i] for i in ids]


def effective_config(config: Any) -> dict[str, Any]:
    """The config with the core's defaults filled in, so "left out" and "set to the default" compare equal."""
    try:
        return RunConfig.from_dict(config).to_dict()
    except ConfigError:
        return config if isinstance(config, dict) else {"config": config}


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def config_diff(configs: list[Any]) -> list[dict[str, Any]]:
    """Rows {"key", "values"} for every dotted key whose value is not the same in all configs."""
    flat = [flatten(effective_config(c)) for c in configs]
    keys = sorted({k for f in flat for k in f})
    rows = []
    for key in keys:
        values = [_shown(f[key]) if key in f else MISSING for f in flat]
        if len(set(values)) > 1:
            rows.append({"key": key, "values": values})
    return rows
