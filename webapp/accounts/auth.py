"""Token authentication for the REST API (`Authorization: Token <key>`) and for websockets (same header)."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from webapp.accounts.models import ApiToken

KEYWORD = "Token"


def token_for_key(key: str) -> ApiToken | None:
    """The active token of an active user for this key, or None; marks it used."""
    token = ApiToken.find(key)
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


def user_for_key(key: str) -> Any | None:
    token = token_for_key(key)
    return token.user if token else None


def key_from_header(value: str) -> str | None:
    parts = value.split()
    if len(parts) == 2 and parts[0] == KEYWORD:
        return parts[1]
    return None


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """DRF authentication against hashed ApiToken rows."""

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        key = key_from_header(header)
        if key is None:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <key>'")
        token = token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return KEYWORD  # so a missing token gives 401 with WWW-Authenticate, not 403


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes the token header."""

    target_class = "webapp.accounts.auth.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "Token-based authentication: `Authorization: Token <key>`"}


class TokenAuthMiddleware:
    """Channels middleware: a websocket with `Authorization: Token <key>` is that token's user; else the session decides."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"authorization")
        if raw:
            key = key_from_header(raw.decode("latin-1"))
            user = await database_sync_to_async(user_for_key)(key) if key else None
            if user is not None:
                scope = {**scope, "user": user}
        return await self.inner(scope, receive, send)


def websocket_auth(inner: Any) -> Any:
    """Session auth first (browsers), then a token header overrides (CLI)."""
    return AuthMiddlewareStack(TokenAuthMiddleware(inner))
