"""Page views: thin; the pages fetch their data from the REST API and the websockets."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def runs_page(request: HttpRequest) -> HttpResponse:
    return render(request, "runs.html")
