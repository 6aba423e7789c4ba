"""Routes of the browser pages (and the assets they load)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.pages import assets, views
from webapp.pages.signin import SignInView

urlpatterns = [
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.runs_page, name="runs"),
    path("runs/new/", views.new_run_page, name="run-new"),
    path("runs/<int:run_id>/", views.run_page, name="run-detail"),
    path("compare/", views.compare_page, name="compare"),
    path("cluster/", views.cluster_page, name="cluster"),
    path("vendor/plotly.min.js", assets.plotly_js, name="plotly-js"),
]
