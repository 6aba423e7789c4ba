"""Routes of the browser pages."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.pages import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.runs_page, name="runs"),
]
