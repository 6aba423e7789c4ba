"""Sign-in attempts limited per client address at the "login" rate (EARL_LOGIN_RATE): the API's token requests, and
the sign-in page's failed attempts, each get that many per period."""

from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.http import HttpRequest
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

SCOPE = "login"


class LoginRateThrottle(ScopedRateThrottle):
    """DRF's scoped throttle, counting by the address the server saw.

    With NUM_PROXIES unset DRF counts by X-Forwarded-For as the client wrote it, so each guess could name a new
    "address". REMOTE_ADDR is the real client: directly, or behind the TLS proxy (daphne --proxy-headers fills it).
    A deployment that sets NUM_PROXIES gets DRF's own reading.
    """

    scope = SCOPE

    def get_rate(self) -> str | None:
        # DRF copies the rates onto the class at import; read live, both sign-in limits follow the one setting.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_ident(self, request: Any) -> str:
        if api_settings.NUM_PROXIES is not None:
            return str(super().get_ident(request))
        return str(request.META.get("REMOTE_ADDR") or "unknown")


class FailedSignIns:
    """Failed sign-ins from one client address within a fixed window of the login rate's period (Django's cache)."""

    def __init__(self, request: HttpRequest) -> None:
        throttle = LoginRateThrottle()
        self.limit, self.period = throttle.parse_rate(throttle.get_rate())
        self.key = f"signin-failures:{throttle.get_ident(request)}"

    def blocked(self) -> bool:
        return self.limit is not None and cache.get(self.key, 0) >= self.limit

    def record(self) -> None:
        if self.limit is None:
            return
        cache.add(self.key, 0, timeout=self.period)  # opens a window only when none is open
        try:
            cache.incr(self.key)
        except ValueError:  # the window closed between the two calls
            cache.set(self.key, 1, timeout=self.period)
