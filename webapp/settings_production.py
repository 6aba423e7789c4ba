"""Production settings: webapp.settings hardened for HTTPS; secrets and hosts must come from the environment."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from webapp.env import env_bool, env_int, env_list, env_str
from webapp.settings import *  # noqa: F403 (Django's documented way to layer settings)
from webapp.settings import _DEV_SECRET  # the star import skips private names

# Refuse rather than override: a DEBUG=1 left in a deployment's environment is a mistake worth stopping for.
if env_bool("DEBUG", False):
    raise ImproperlyConfigured("DEBUG is on: webapp.settings_production never runs with DEBUG (unset DEBUG or set 0)")
DEBUG = False

# Django's own deploy check (security.W009) wants 50+ characters, 5+ distinct ones, no "django-insecure-" prefix.
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set (50+ random characters) for webapp.settings_production")
if SECRET_KEY == _DEV_SECRET or "change-me" in SECRET_KEY.lower() or SECRET_KEY.startswith("django-insecure-"):
    raise ImproperlyConfigured("SECRET_KEY is a development or placeholder value: generate a new one "
                               "(python -c 'import secrets; print(secrets.token_urlsafe(64))')")
if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
    raise ImproperlyConfigured(f"SECRET_KEY is too weak ({len(SECRET_KEY)} characters, {len(set(SECRET_KEY))} "
                               "distinct): use 50+ random characters")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set: the comma-separated host names the service answers to")

# Without it every container would quietly use its own SQLite file inside the image.
if not os.environ.get("DATABASE_URL"):
    raise ImproperlyConfigured("DATABASE_URL must be set (postgres://user:password@host:5432/name)")

# TLS ends at a reverse proxy in front of daphne; it must set X-Forwarded-Proto (and strip a client's own).
# EARL_BEHIND_PROXY=0 when clients reach daphne directly: then nobody may claim https by header.
EARL_BEHIND_PROXY = env_bool("EARL_BEHIND_PROXY", True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if EARL_BEHIND_PROXY else None
# Off only when the proxy itself redirects http to https (check --deploy then reports security.W008).
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
# The header's preload flag enrols nobody by itself (that takes a submission to the browsers' list).
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SECURE = True
# The pages take the CSRF token from a <meta> tag (static/js/api.js), so scripts never need the cookie.
CSRF_COOKIE_HTTPONLY = True

# One cache for every web process (sign-in throttle counts, among others): the default in-memory cache would count
# per process and forget at each restart. EARL_CACHE_URL defaults to Redis database 1 of REDIS_URL's server.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                      "LOCATION": env_str("EARL_CACHE_URL", REDIS_URL.rsplit("/", 1)[0] + "/1")}}
