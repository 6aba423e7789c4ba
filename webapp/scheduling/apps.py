"""Scheduling app: team quotas stored for the pure policy in this package, and the checks made at submit time."""

from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "webapp.scheduling"
    label = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"
