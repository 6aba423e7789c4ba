"""ASGI entry point: HTTP through Django, websockets through Channels (session or token auth)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_http = get_asgi_application()  # sets Django up before the consumers import models

from django.conf import settings  # noqa: E402

if settings.EARL_SERVE_STATIC:
    # One-machine mode: the ASGI server also serves /static/ (from the app and static/ folders).
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

    django_http = ASGIStaticFilesHandler(django_http)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from webapp.routing import websocket_urlpatterns  # noqa: E402
from webapp.accounts.auth import websocket_auth  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_http,
    "websocket": AllowedHostsOriginValidator(websocket_auth(URLRouter(websocket_urlpatterns))),
})
