"""Typed events the core reports through one callback, and the versioned envelope they travel in."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

ENVELOPE_VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "events.v1.json"


@dataclass(frozen=True)
class Event:
    """Base of every event; `type` is the wire name."""

    type: ClassVar[str] = ""

    def data(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunStatus(Event):
    type: ClassVar[str] = "run.status"
    status: str  # queued | starting | running | paused | cancelling | cancelled | succeeded | failed
    message: str = ""


@dataclass(frozen=True)
class SelectorDecision(Event):
    type: ClassVar[str] = "selector.decision"
    stage: str  # rollout | experience | train
    old_layout: dict[str, Any] | None
    new_layout: dict[str, Any]
    reason: str
    switched: bool
    candidates: list[dict[str, Any]] = field(default_factory=list)  # predicted throughput/memory per layout
    iteration: int | None = None  # the iteration the layout is chosen for (None: before the first)


@dataclass(frozen=True)
class MemoryReading(Event):
    type: ClassVar[str] = "memory"
    iteration: int
    workers: list[dict[str, Any]]  # [{"worker": "rollout-0", "stage": ..., "used": bytes, "peak": bytes, "budget": bytes|None}]


@dataclass(frozen=True)
class Metrics(Event):
    type: ClassVar[str] = "metrics"
    iteration: int
    values: dict[str, float]  # namespaced keys: rollout/win_rate, losses/policy_loss, perf/tokens_per_s, ...


@dataclass(frozen=True)
class Dispatch(Event):
    type: ClassVar[str] = "dispatch"
    iteration: int
    bytes_moved: int
    bytes_via_driver: int
    seconds: float
    fields: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GameMove(Event):
    type: ClassVar[str] = "game.move"
    iteration: int
    game: int
    ply: int
    player: str  # agent | opponent
    column: int | None  # None for an invalid agent answer
    board: str
    text: str = ""
    context_tokens: int = 0


@dataclass(frozen=True)
class GameEnd(Event):
    type: ClassVar[str] = "game.end"
    iteration: int
    game: int
    result: str  # win | loss | draw
    reward: float
    moves: str  # 1-7 digits, first player first
    agent_side: int  # 1 = first player, 2 = second
    opponent: str


@dataclass(frozen=True)
class Log(Event):
    type: ClassVar[str] = "log"
    level: str
    message: str


@dataclass(frozen=True)
class Error(Event):
    type: ClassVar[str] = "error"
    message: str
    kind: str = ""
    traceback: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls for cls in (RunStatus, SelectorDecision, MemoryReading, Metrics, Dispatch, GameMove, GameEnd, Log, Error)
}

EventSink = Callable[[dict[str, Any]], None]


class EventStream:
    """Numbers events 1, 2, 3... without gaps and hands each envelope to the sink (thread-safe)."""

    def __init__(self, run_id: int | str, sink: EventSink, *, start_seq: int = 0) -> None:
        self.run_id = run_id
        self._sink = sink
        self._seq = start_seq
        self._lock = threading.Lock()

    @property
    def last_seq(self) -> int:
        return self._seq

    def emit(self, event: Event) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            envelope = {
                "v": ENVELOPE_VERSION,
                "run": self.run_id,
                "seq": self._seq,
                "ts": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
                "type": event.type,
                "data": event.data(),
            }
            self._sink(envelope)
        return envelope


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the envelope, shared with the browser side."""
    return json.loads(SCHEMA_PATH.read_text())


def jsonl_sink(path: Path) -> EventSink:
    """A sink appending one JSON line per event (the CLI's record of a run)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(envelope: dict[str, Any]) -> None:
        with path.open("a") as fh:
            fh.write(json.dumps(envelope) + "\n")

    return write
