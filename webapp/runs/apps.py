"""Runs app: training runs, their events, sample games and checkpoints."""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"
