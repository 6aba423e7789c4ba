"""Typed errors raised by the EARL core; callers (CLI, REST API) map them to clear messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class EarlError(Exception):
    """Base class of every error the core raises on purpose."""


class ConfigError(EarlError, ValueError):
    """A config field holds a value outside what it allows.

    ``field`` is the dotted path of the field (``rollout.temperature``), ``allowed`` a human
    description of the accepted values; both end up in the API's 400 response.
    """

    def __init__(self, field: str, message: str, *, allowed: str | Sequence[Any] | None = None) -> None:
        self.field = field
        self.reason = message
        if allowed is not None and not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.allowed = allowed
        text = f"{field}: {message}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description for APIs."""
        return {"field": self.field, "reason": self.reason, "allowed": self.allowed}


class IllegalMove(EarlError, ValueError):
    """A move into a full column or outside the board, or a move after the game ended."""


class ModelLoadError(EarlError):
    """A model directory or hub id could not be loaded (missing files, wrong architecture)."""


class EngineError(EarlError):
    """A rollout engine failed to start or to generate."""


class BudgetExceeded(EarlError):
    """A worker's measured memory went over its configured budget (the CPU analogue of an OOM)."""


class PlacementError(EarlError):
    """A worker group's resources could not all be reserved on the cluster (gang placement timed out)."""


class WorkerLostError(EarlError, RuntimeError):
    """A Ray worker of the run died more often than the run may rebuild its worker groups (max_worker_restarts)."""
