"""Admin for runs (read-mostly: runs change through the API and the workers)."""

from django.contrib import admin

from webapp.runs.models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "team", "owner", "status", "priority", "created_at", "iterations_done"]
    list_filter = ["status", "priority", "team"]
    search_fields = ["name", "owner__username"]
    readonly_fields = ["last_seq", "summary", "error", "started_at", "finished_at"]
