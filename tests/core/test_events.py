"""Events: gap-free numbering and every event type valid against the shared JSON Schema."""

from __future__ import annotations

import jsonschema
import pytest

from earl_core import events as ev

SAMPLES = [
    ev.RunStatus("running", "ok"),
    ev.SelectorDecision(stage="rollout", old_layout=None, new_layout={"tp": 1, "dp": 2}, reason="start", switched=True),
    ev.MemoryReading(iteration=0, workers=[{"worker": "rollout-0", "stage": "rollout", "used": 1, "peak": 2, "budget": None}]),
    ev.Metrics(iteration=3, values={"rollout/win_rate": 0.5, "context/turn01_mean": 120.0}),
    ev.Dispatch(iteration=1, bytes_moved=10, bytes_via_driver=0, seconds=0.1, fields={"token_ids": 10}),
    ev.GameMove(iteration=0, game=0, ply=0, player="agent", column=3, board=". . .", text="[col 3]", context_tokens=80),
    ev.GameEnd(iteration=0, game=0, result="win", reward=1.0, moves="4455", agent_side=1, opponent="random"),
    ev.Log("info", "hello"),
    ev.Error(message="boom", kind="RuntimeError"),
]


def test_every_type_has_a_sample() -> None:
    assert {type(s).type for s in SAMPLES} == set(ev.EVENT_TYPES)


def test_stream_numbers_without_gaps_and_matches_schema() -> None:
    got: list[dict] = []
    stream = ev.EventStream(7, got.append, start_seq=4)
    for sample in SAMPLES:
        stream.emit(sample)
    assert [e["seq"] for e in got] == list(range(5, 5 + len(SAMPLES)))
    validator = jsonschema.Draft202012Validator(ev.load_schema())
    for envelope in got:
        validator.validate(envelope)


@pytest.mark.parametrize("bad", [
    {"type": "metrics", "data": {"iteration": 0, "values": {"NoNamespace": 1.0}}},
    {"type": "game.end", "data": {"iteration": 0, "game": 0, "result": "won", "reward": 1, "moves": "", "agent_side": 1, "opponent": "x"}},
    {"type": "nonsense", "data": {}},
])
def test_schema_rejects_bad_events(bad: dict) -> None:
    envelope = {"v": 1, "run": 1, "seq": 1, "ts": "2026-01-01T00:00:00Z", **bad}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(envelope, ev.load_schema())
