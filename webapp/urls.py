"""URL map: REST API under /api/, OpenAPI schema and offline docs, admin, and the browser pages."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from webapp.accounts.api import TeamListView, TokenView
from webapp.cluster.api import ClusterView
from webapp.runs.api import RunViewSet
from webapp.scheduling.api import TeamQuotaView

router = DefaultRouter(trailing_slash=True)
router.register("runs", RunViewSet, basename="run")

api = [
    path("auth/token/", TokenView.as_view(), name="api-token"),
    path("teams/", TeamListView.as_view(), name="api-teams"),
    # A team id or slug; anything else (a NUL the database cannot compare, say) is a 404 like a missing team.
    path("teams/<slug:team>/quota/", TeamQuotaView.as_view(), name="api-team-quota"),
    path("cluster/", ClusterView.as_view(), name="api-cluster"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include(router.urls)),
]

urlpatterns = [
    path("api/", include(api)),
    path("admin/", admin.site.urls),
    path("", include("webapp.pages.urls")),
]

handler404 = "webapp.api_errors.not_found"
