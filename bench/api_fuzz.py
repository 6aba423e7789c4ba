"""api_fuzz: a long fuzz run of the REST API from its own OpenAPI schema (tests/webapp/test_api_fuzz.py's generator).

Every operation, positive and negative cases (schemathesis), sent in-process to Django's WSGI handler as a signed-in
team member, on a private SQLite database inside one transaction that is rolled back at the end (so submitted runs
never reach the queue). Prints a table and a JSON summary: operations, requests, status counts, 5xx count.

    .venv/bin/python bench/api_fuzz.py [--examples 200] [--seed N] [--out bench/results/api_fuzz.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_io import django_on_private_sqlite, write_result  # noqa: E402


def fuzz(examples: int, random_seed: int, runs_dir: Path) -> dict[str, Any]:
    from django.db import transaction

    from tests.webapp.api_fuzzing import (MODES, Tally, build_world, fuzz_operation, in_process_app, load_schema,
                                          operations)

    tally = Tally()
    failures: list[str] = []
    started = time.perf_counter()
    with transaction.atomic(), in_process_app() as app:
        world = build_world(runs_dir)
        ops = operations(load_schema(app))
        for mode in MODES:
            for op in ops:
                found = fuzz_operation(op, app=app, world=world, tally=tally, mode=mode, max_examples=examples,
                                       random_seed=random_seed)
                if found:
                    failures.append(f"[{mode.value}] {found}")
        transaction.set_rollback(True)
    return {"seed": random_seed, "examples_per_operation_and_mode": examples,
            "seconds": round(time.perf_counter() - started, 1), **tally.summary(), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="Hypothesis examples per operation and mode")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a new one, printed)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "api_fuzz.json"))
    args = parser.parse_args()
    random_seed = args.seed if args.seed is not None else random.randrange(2**32)
    with tempfile.TemporaryDirectory(prefix="api-fuzz-") as tmp:
        os.environ["EARL_RUNS_DIR"] = str(Path(tmp) / "runs")
        django_on_private_sqlite(str(Path(tmp) / "db.sqlite3"))
        result = fuzz(args.examples, random_seed, Path(tmp) / "runs")
    print(f"{'operation':<52} {'requests':>8}  statuses")
    for op, counts in result["per_operation"].items():
        print(f"{op:<52} {sum(counts.values()):>8}  {counts}")
    for failure in result["failures"]:
        print("\nFAILURE", failure[:2000])
    summary = {k: result[k] for k in ("seed", "operations", "requests", "statuses", "server_errors", "nonconforming",
                                      "seconds")}
    print(json.dumps(summary))
    write_result(result, args.out)
    sys.exit(1 if result["failures"] else 0)


if __name__ == "__main__":
    main()
