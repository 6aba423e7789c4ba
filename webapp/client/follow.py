"""Follows a run's event stream over its websocket: in seq order, no duplicate, no gap, resuming after a drop."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from webapp.client.api import EVENTS_PAGE, EarlApi
from webapp.client.errors import ClientError, ServerError, Unreachable

FINAL_STATUSES = ("succeeded", "failed", "cancelled")


def final_status(envelope: dict[str, Any]) -> str | None:
    """The run's final status if this event announces it."""
    if envelope.get("type") == "run.status" and envelope.get("data", {}).get("status") in FINAL_STATUSES:
        return str(envelope["data"]["status"])
    return None


class RunFollower:
    """Iterating yields every event after `after` once, in order, until the run's final `run.status`.

    The server sends the stored backlog after `?after=` and then live events; a live message can still be lost
    (channel layers deliver at most once), so a seq jump is filled from the REST API, and a quiet stream is checked
    against the database every `quiet_check_s` so that a lost final event cannot leave us waiting forever.
    """

    def __init__(self, api: EarlApi, run_id: int, *, after: int = 0, quiet_check_s: float = 5.0,
                 give_up_after_s: float = 120.0, on_notice: Callable[[str], None] | None = None) -> None:
        self.api = api
        self.run_id = run_id
        self.last_seq = after
        self.final_status: str | None = None
        self.quiet_check_s = quiet_check_s
        self.give_up_after_s = give_up_after_s
        self.on_notice = on_notice or (lambda message: None)
        # Until the service has answered once, a failure is an error at once; after that it is a drop to ride out.
        self._last_contact: float | None = None
        self._delay = 0.5

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.final_status is None:
            try:
                yield from self._catch_up()
                if self.final_status is None:
                    yield from self._stream()
            except (ConnectionClosed, InvalidHandshake, OSError, Unreachable, ServerError) as exc:
                if isinstance(exc, InvalidStatus):
                    self._refused(exc)
                if self._last_contact is None:
                    raise
                if time.monotonic() - self._last_contact > self.give_up_after_s:
                    raise Unreachable(self.api.url) from exc
                self.on_notice(f"connection lost ({_reason(exc)}); reconnecting after seq {self.last_seq}")
                time.sleep(self._delay)  # back off: the service may be restarting
                self._delay = min(self._delay * 2, 5.0)

    def _contact(self) -> None:
        self._last_contact = time.monotonic()
        self._delay = 0.5

    def _catch_up(self) -> Iterator[dict[str, Any]]:
        """What the database holds after our last seq; also notices a run that ended while nobody listened."""
        while self.final_status is None:
            page = self.api.events(self.run_id, after=self.last_seq)
            self._contact()
            for envelope in page.events:
                yield from self._accept(envelope)
                if self.final_status is not None:
                    return
            if len(page.events) < EVENTS_PAGE:
                if page.status in FINAL_STATUSES and self.last_seq >= page.last_seq:
                    self.final_status = page.status  # its final event lies before `after`
                return

    def _stream(self) -> Iterator[dict[str, Any]]:
        with connect(self.api.ws_url(f"/ws/runs/{self.run_id}/?after={self.last_seq}"), origin=Origin(self.api.origin),
                     additional_headers=self.api.auth_headers, open_timeout=self.api.timeout_s) as ws:
            self._contact()
            while self.final_status is None:
                try:
                    # a timeout also lets Ctrl-C through promptly
                    raw = ws.recv(timeout=self.quiet_check_s)
                except TimeoutError:
                    yield from self._catch_up()
                    continue
                self._contact()
                envelope = _envelope(raw)
                if envelope is not None:
                    yield from self._accept(envelope)

    def _accept(self, envelope: dict[str, Any]) -> Iterator[dict[str, Any]]:
        seq = int(envelope["seq"])
        if seq <= self.last_seq:
            return  # already seen (a backlog overlapping a live message)
        if seq > self.last_seq + 1:
            missing_from = self.last_seq + 1
            for stored in self.api.all_events(self.run_id, after=self.last_seq, upto=seq - 1):
                yield from self._accept(stored)
            if self.final_status is not None:
                return
            if self.last_seq != seq - 1:
                raise ClientError(f"run {self.run_id}: events {missing_from}..{seq - 1} are missing on the server")
        self.last_seq = seq
        yield envelope
        self.final_status = final_status(envelope)

    def _refused(self, exc: InvalidStatus) -> None:
        """The handshake was refused; the REST API says why in words (401 / 404) and raises that."""
        self.api.run(self.run_id)
        raise ClientError(f"the service refused the event stream of run {self.run_id} "
                          f"(HTTP {exc.response.status_code})") from exc


def _envelope(raw: str | bytes) -> dict[str, Any] | None:
    """An event envelope, or None for the protocol's other frames (pong, protocol.error)."""
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if isinstance(message, dict) and isinstance(message.get("seq"), int) and "data" in message:
        return message
    return None


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
