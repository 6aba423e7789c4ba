"""One error shape for the whole API: {"detail": ..., "errors": [{"field", "message", "allowed"}]}."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from earl_core.errors import ConfigError
from webapp.scheduling.resources import SchedulingError


class Conflict(exceptions.APIException):
    """The object's state does not allow the change asked for."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "conflict with the current state"


class FieldErrors(exceptions.ValidationError):
    """A 400 listing every bad field with the reason and, where known, the allowed values."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__({e["field"]: [e["message"]] for e in errors})


class BodyTooLarge(exceptions.APIException):
    """The request body is over DATA_UPLOAD_MAX_MEMORY_SIZE (Django refuses to read it)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "body_too_large"

    def __init__(self) -> None:
        self.errors = [{"field": "body", "message": "the request body is too large",
                        "allowed": f"at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"}]
        super().__init__(self.errors[0]["message"])


def config_field_errors(errors: list[ConfigError], *, prefix: str = "config.") -> list[dict[str, Any]]:
    # The core calls the whole mapping "config"; under the prefix that is the prefix itself.
    return [{"field": prefix.rstrip(".") if e.field == "config" else prefix + e.field, "message": e.reason,
             "allowed": e.allowed} for e in errors]


def _flatten(detail: Any, path: str = "") -> list[dict[str, Any]]:
    """DRF's nested error dicts/lists as a flat list of field errors."""
    if isinstance(detail, dict):
        out: list[dict[str, Any]] = []
        for key, value in detail.items():
            name = path if key == "non_field_errors" else (f"{path}.{key}" if path else str(key))
            out += _flatten(value, name)
        return out
    if isinstance(detail, list):
        out = []
        for item in detail:
            out += _flatten(item, path)
        return out
    return [{"field": path or "body", "message": str(detail), "allowed": None}]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, SchedulingError):  # a run refused at submit time names the request field at fault
        exc = FieldErrors([{"field": exc.field, "message": exc.reason, "allowed": exc.allowed}])
    # Django's own refusals to read a body would otherwise leave the API as a bare HTML 400.
    if isinstance(exc, RequestDataTooBig):
        exc = BodyTooLarge()
    elif isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        exc = FieldErrors([{"field": "body", "message": str(exc), "allowed": "fewer form fields or files"}])
    elif isinstance(exc, exceptions.ParseError):  # a body that is not JSON (or a broken form)
        exc = FieldErrors([{"field": "body", "message": str(exc.detail), "allowed": "a JSON object"}])
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, BodyTooLarge):
        response.data = {"detail": str(exc.detail), "errors": exc.errors}
    elif isinstance(exc, FieldErrors):
        response.data = {"detail": "invalid input", "errors": exc.errors}
    elif isinstance(exc, exceptions.ValidationError):
        response.data = {"detail": "invalid input", "errors": _flatten(exc.detail)}
    elif isinstance(exc, exceptions.APIException):
        response.data = {"detail": str(exc.detail) if not isinstance(exc.detail, (dict, list)) else exc.detail}
    return response


def not_found(request: Any, exception: Exception | None = None) -> Any:
    """404 for a URL nothing serves: JSON under /api/ (clients parse it like any other error), else the page."""
    if request.path.startswith("/api/"):
        from django.http import JsonResponse

        return JsonResponse({"detail": f"no API endpoint at {request.path[:200]}; see /api/schema/", "errors": []},
                            status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
