"""Cluster app: what the Ray cluster holds and the queue in front of it."""

from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "webapp.cluster"
    label = "cluster"
    default_auto_field = "django.db.models.BigAutoField"
