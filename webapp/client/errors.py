"""Expected failures of the client, each with the lines it prints and the exit status it ends with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ClientError(Exception):
    """A failure the user can act on: printed as one line on stderr, never as a traceback."""

    exit_code = 1

    def lines(self) -> list[str]:
        return [str(self)]


class NotLoggedIn(ClientError):
    def __init__(self) -> None:
        super().__init__("not logged in or token revoked: run `earl login`")


class NotFound(ClientError):
    def __init__(self, what: str) -> None:
        super().__init__(f"{what} not found")


class Conflict(ClientError):
    """The object's state does not allow the change (HTTP 409); the server's reason is the message."""


class ServerError(ClientError):
    """HTTP 5xx from the service or a proxy in front of it: often a restart, so a follower retries it."""


class Unreachable(ClientError):
    def __init__(self, url: str) -> None:
        super().__init__(f"cannot reach {url}: is the service running?")


@dataclass(frozen=True)
class FieldError:
    """One entry of the API's `errors` list."""

    field: str
    message: str
    allowed: str | None = None

    @classmethod
    def from_json(cls, raw: Any) -> FieldError:
        if not isinstance(raw, dict):
            return cls("body", str(raw))
        allowed = raw.get("allowed")
        return cls(str(raw.get("field") or "body"), str(raw.get("message", "")),
                   None if allowed in (None, "") else str(allowed))

    def describe(self) -> str:
        return f"{self.field}: {self.message}" + (f" (allowed: {self.allowed})" if self.allowed else "")


class InvalidInput(ClientError):
    """A 400: every bad field on its own line, so one fix-up pass can address them all."""

    exit_code = 2

    def __init__(self, errors: list[FieldError], detail: str = "invalid input") -> None:
        super().__init__(detail)
        self.errors = errors

    def lines(self) -> list[str]:
        return [e.describe() for e in self.errors] or [str(self)]
