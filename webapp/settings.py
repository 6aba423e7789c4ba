"""Django settings, read from environment variables (strictly: a bad value stops start-up naming the variable)."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from webapp.env import database_from_url, env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "insecure-dev-only-secret-key-set-SECRET_KEY-in-production"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if SECRET_KEY == _DEV_SECRET and env_bool("EARL_REQUIRE_SECRET", False):
    raise ImproperlyConfigured("SECRET_KEY must be set (EARL_REQUIRE_SECRET is on)")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Where runs write checkpoints and logs (one folder per run).
EARL_RUNS_DIR = Path(env_str("EARL_RUNS_DIR", str(BASE_DIR / "runs" / "service")))
# Local models every team may start from (model.path must lie under it or be a hub id).
EARL_MODELS_DIR = Path(env_str("EARL_MODELS_DIR", str(BASE_DIR / "models")))
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
RAY_ADDRESS = env_str("RAY_ADDRESS", "")
# Ray dashboard (its state API lists the nodes for the cluster page); empty: node details unavailable.
RAY_DASHBOARD_URL = env_str("RAY_DASHBOARD_URL", "")
# How often (s) a running task looks for a cancel request; cancel takes effect at the next safe point.
EARL_CANCEL_POLL_S = env_int("EARL_CANCEL_POLL_S", 1, minimum=1)
# A worker renews its run's lease every EARL_HEARTBEAT_S; a run whose lease is EARL_LEASE_S old lost its worker
# (killed, or cut off): the scheduler requeues it to resume from its checkpoint, up to EARL_MAX_RECOVERIES times,
# then marks it failed. The scheduler looks every 15 s, so a lost worker is noticed within lease + 15 s.
EARL_HEARTBEAT_S = env_int("EARL_HEARTBEAT_S", 5, minimum=1)
EARL_LEASE_S = env_int("EARL_LEASE_S", max(30, 3 * EARL_HEARTBEAT_S), minimum=3 * EARL_HEARTBEAT_S)
EARL_MAX_RECOVERIES = env_int("EARL_MAX_RECOVERIES", 3, minimum=0)
# Fair share compares the teams' usage over this trailing window (one value for the cluster, so shares compare).
EARL_FAIR_SHARE_WINDOW_S = env_int("EARL_FAIR_SHARE_WINDOW_S", 24 * 3600, minimum=60)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "webapp.accounts",
    "webapp.runs",
    "webapp.cluster",
    "webapp.scheduling",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(env_str("DATABASE_URL", "sqlite:///db.sqlite3"), base_dir=str(BASE_DIR))}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not memory, so that test worker processes (Celery, the ASGI server) see the test database too.
    DATABASES["default"]["TEST"] = {"NAME": str(DATABASES["default"]["NAME"]) + ".test"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
# Serve /static/ from the ASGI app itself (one-machine mode); deployments put a web server or CDN in front instead.
EARL_SERVE_STATIC = env_bool("EARL_SERVE_STATIC", DEBUG)
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "runs" / "staticfiles")))
# Bodies above this are refused (413/400) before they reach a view.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 1_000_000, minimum=1024)

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "webapp.channel_layer.RedisChannelLayer",
        # redis-py's default 5 s socket timeout equals channels_redis' blocking receive: an idle websocket would
        # then die with TimeoutError every 5 s. A longer socket timeout keeps quiet runs' viewers connected.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 2000, "expiry": 60},
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "webapp.accounts.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "webapp.pagination.Pages",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "webapp.api_errors.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"login": env_str("EARL_LOGIN_RATE", "20/min")},
    # JSON nested past Python's parser is a 400 on every view (DRF's own JSON parser lets RecursionError out).
    "DEFAULT_PARSER_CLASSES": ["webapp.parsers.JSONBodyParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    # Throttles count by the address the server saw (webapp.accounts.throttle); never trust client-written hops.
    "NUM_PROXIES": 0,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "EARL service API",
    "DESCRIPTION": "Launch and watch agentic RL runs (EARL). Authenticate with `Authorization: Token <key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from the installed sidecar package, never a CDN (machines are offline).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery: Redis broker, results unused (state lives in the database). Late acks so a killed worker's run is redelivered.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A run can take hours; with the Redis broker an unacked task is redelivered after this many seconds. The run row's
# claim (queued -> starting under a lock) keeps a redelivered task from running a run twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT_S", 24 * 3600, minimum=60)}
# Ray and vLLM need real stdout/stderr file descriptors; Celery would replace them with logging proxies.
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}
