"""Typed REST client of the EARL service: one method per endpoint, HTTP failures raised as ClientErrors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests

from webapp.client.errors import (ClientError, Conflict, FieldError, InvalidInput, NotFound, NotLoggedIn, ServerError,
                                  Unreachable)

EVENTS_PAGE = 1000  # the server's largest page of events
RUNS_PAGE = 200  # the server's largest page of runs


@dataclass(frozen=True)
class EventPage:
    events: list[dict[str, Any]]
    last_seq: int  # the run's newest seq (of any type)
    next_after: int
    status: str  # the run's status when the page was read


class EarlApi:
    """Calls the service at `url` as the token's user; `what` names the object in a 404's message."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._session = requests.Session()

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}"} if self.token else {}

    @property
    def origin(self) -> str:
        """The service's own origin: the websocket checks it against the allowed hosts."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    def ws_url(self, path: str) -> str:
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}{path}"

    # ---- transport -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, what: str = "", json: Any = None,
              params: dict[str, Any] | None = None, auth: bool = True) -> requests.Response:
        if auth and not self.token:
            raise NotLoggedIn()
        try:
            response = self._session.request(method, self.url + path, json=json, params=params,
                                             headers=self.auth_headers if auth else {}, timeout=self.timeout_s)
        except requests.ConnectionError as exc:
            raise Unreachable(self.url) from exc
        except requests.Timeout as exc:
            raise ClientError(f"{self.url} did not answer within {self.timeout_s:.0f} s") from exc
        except requests.RequestException as exc:
            raise ClientError(f"request to {self.url} failed: {exc}") from exc
        if response.status_code >= 400:
            raise _error_for(response, what or path)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._call(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise ClientError(f"{self.url}{path} answered {response.status_code} without JSON: "
                              "is EARL_URL the service's address?") from exc

    # ---- accounts --------------------------------------------------------------------------------

    def login(self, username: str, password: str, *, label: str = "cli") -> str:
        body = self._json("POST", "/api/auth/token/", auth=False,
                          json={"username": username, "password": password, "name": label})
        return str(body["token"])

    def logout(self) -> None:
        self._call("DELETE", "/api/auth/token/")

    # ---- runs ------------------------------------------------------------------------------------

    def runs(self, *, team: str | None = None, status: str | None = None, search: str | None = None,
             limit: int = 50) -> tuple[list[dict[str, Any]], int]:
        """Newest first, at most `limit` rows (0: all), and how many match in total."""
        params = {k: v for k, v in {"team": team, "status": status, "search": search}.items() if v}
        rows: list[dict[str, Any]] = []
        page, count = 1, 0
        while True:
            size = RUNS_PAGE if limit == 0 else min(RUNS_PAGE, limit)
            body = self._json("GET", "/api/runs/", params={**params, "page": page, "page_size": size})
            rows += body["results"]
            count = int(body["count"])
            if not body.get("next") or (limit and len(rows) >= limit):
                return (rows[:limit] if limit else rows), count
            page += 1

    def run(self, run_id: int) -> dict[str, Any]:
        return self._json("GET", f"/api/runs/{run_id}/", what=f"run {run_id}")

    def submit(self, *, team: str, config: Any, name: str | None = None, priority: str | None = None) -> dict[str, Any]:
        body = {"team": team, "config": config, **({"name": name} if name else {}),
                **({"priority": priority} if priority else {})}
        return self._json("POST", "/api/runs/", json=body)

    def cancel(self, run_id: int) -> dict[str, Any]:
        return self._json("POST", f"/api/runs/{run_id}/cancel/", what=f"run {run_id}")

    def clone(self, run_id: int, *, name: str | None = None) -> dict[str, Any]:
        return self._json("POST", f"/api/runs/{run_id}/clone/", what=f"run {run_id}", json={"name": name} if name else {})

    def events(self, run_id: int, *, after: int = 0, types: str | None = None, limit: int = EVENTS_PAGE) -> EventPage:
        params: dict[str, Any] = {"after": after, "limit": limit, **({"type": types} if types else {})}
        body = self._json("GET", f"/api/runs/{run_id}/events/", what=f"run {run_id}", params=params)
        return EventPage(events=body["events"], last_seq=int(body["last_seq"]), next_after=int(body["next_after"]),
                         status=str(body["status"]))

    def all_events(self, run_id: int, *, after: int = 0, types: str | None = None,
                   upto: int | None = None) -> Iterator[dict[str, Any]]:
        """Stored events after `after` (and up to `upto`), page by page, in seq order."""
        while True:
            page = self.events(run_id, after=after, types=types)
            for envelope in page.events:
                if upto is not None and envelope["seq"] > upto:
                    return
                yield envelope
            if len(page.events) < EVENTS_PAGE:
                return
            after = page.next_after

    def metrics(self, run_id: int) -> list[dict[str, Any]]:
        return self._json("GET", f"/api/runs/{run_id}/metrics/", what=f"run {run_id}")["metrics"]

    def metrics_csv(self, run_id: int) -> str:
        return self._call("GET", f"/api/runs/{run_id}/metrics/", what=f"run {run_id}", params={"format": "csv"}).text


def _error_for(response: requests.Response, what: str) -> ClientError:
    """The API's error body ({"detail", "errors": [...]}) as the matching ClientError."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = str(body.get("detail", "")) if isinstance(body, dict) else ""
    code = response.status_code
    if code == 401:
        return NotLoggedIn()
    if code == 404:
        return NotFound(what)
    if code == 409:
        return Conflict(detail or f"{what}: conflict with its current state")
    if code == 400 and isinstance(body, dict):
        return InvalidInput([FieldError.from_json(e) for e in body.get("errors", [])], detail or "invalid input")
    if code == 403:
        return ClientError(f"not allowed: {detail or 'permission denied'}")
    if code == 429:
        return ClientError(f"too many requests: {detail or 'try again later'}")
    failed = ServerError if code >= 500 else ClientError
    return failed(f"{response.request.method} {response.url} failed with HTTP {code}" + (f": {detail}" if detail else ""))
