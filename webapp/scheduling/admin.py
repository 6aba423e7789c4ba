"""Admin for team quotas: site admins set each team's limits here (or over PUT /api/teams/<team>/quota/)."""

from django.contrib import admin

from webapp.scheduling.models import Quota


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["team", "max_gpus", "max_cpus", "max_queued", "updated_at"]
    list_select_related = ["team"]
    search_fields = ["team__name", "team__slug"]
