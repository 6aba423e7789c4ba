"""The REST API fuzzed from its own OpenAPI schema (schemathesis): no operation answers 5xx or contradicts it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler
from schemathesis import GenerationMode

from tests.webapp.api_fuzzing import MODES, Tally, build_world, fuzz_operation, in_process_app, load_schema, operations

pytestmark = pytest.mark.django_db

EXAMPLES_PER_OPERATION = 12  # x 17 operations x 2 modes: about 400 requests; bench/api_fuzz.py runs many more


@pytest.fixture
def app() -> Iterator[WSGIHandler]:
    with in_process_app() as handler:
        yield handler


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_no_operation_answers_5xx_or_off_schema(app: WSGIHandler, runs_dir: Any, mode: GenerationMode) -> None:
    world = build_world(runs_dir)
    schema = load_schema(app)
    tally = Tally()
    ops = operations(schema)
    failures = [f for op in ops if (f := fuzz_operation(op, app=app, world=world, tally=tally, mode=mode,
                                                        max_examples=EXAMPLES_PER_OPERATION))]
    assert not failures, "\n\n".join(failures)
    # Every operation was exercised, except where the mode has nothing to vary (no parameters, no body).
    assert len(ops) >= 17 and len(tally.per_operation) + len(tally.no_cases) == len(ops), tally.no_cases
    # The fuzzing got past authentication and the 404s into the real code paths.
    assert tally.statuses[400] and (mode is GenerationMode.NEGATIVE or (tally.statuses[200] and tally.statuses[201]))
