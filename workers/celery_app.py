"""The Celery application of the service (Redis broker, settings from Django)."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()

app = Celery("earl")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Tasks live in workers.tasks; importing it registers `workers.execute_run`.
app.conf.imports = ("workers.tasks",)
