"""Page views: thin; the pages fetch their data from the REST API and the websockets."""

from __future__ import annotations

import json
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_safe

from webapp.accounts.models import Membership, Team
from webapp.pages.assets import plotly_url
from webapp.pages.compare import CompareError, config_diff, parse_run_ids, runs_to_compare
from webapp.pages.presets import load_presets
from webapp.runs.models import Run
from webapp.runs.services import visible_runs

# Runs offered by the compare page's picker when no runs are named yet.
PICKER_RUNS = 50


def _my_teams(request: HttpRequest) -> list[Team]:
    return list(Team.objects.filter(memberships__user=request.user).distinct())


@require_safe
@login_required
def runs_page(request: HttpRequest) -> HttpResponse:
    """The table is filled by static/js/runs.js from /api/runs/ with the same query parameters as this page."""
    return render(request, "runs.html", {
        "teams": _my_teams(request), "statuses": Run.Status.values,
        "team": request.GET.get("team", ""), "status": request.GET.get("status", ""),
        "search": request.GET.get("search", ""),
    })


@require_safe
@login_required
def new_run_page(request: HttpRequest) -> HttpResponse:
    """Presets from configs/*.yaml and the teams this user may launch in; the browser POSTs to /api/runs/."""
    launchable = Membership.objects.filter(
        user=request.user, role__in=[Membership.Role.ADMIN, Membership.Role.MEMBER]).select_related("team")
    presets = load_presets()
    initial = presets[0].config if presets else {}
    return render(request, "run_new.html", {
        "presets": presets,
        "presets_data": {p.key: p.config for p in presets},
        "initial_config": json.dumps(initial, indent=2),
        "initial_name": str(initial.get("name", "")),
        "memberships": list(launchable),
        "priorities": Run.Priority.values,
    })


@require_safe
@login_required
def run_page(request: HttpRequest, run_id: int) -> HttpResponse:
    """Another team's run is a 404, exactly like a missing one."""
    run = get_object_or_404(visible_runs(request.user).select_related("team", "owner"), pk=run_id)
    return render(request, "run_detail.html", {
        "run": run, "plotly_url": plotly_url(),
        "config_json": json.dumps(run.config, indent=2),
        "page_data": {"id": run.pk, "status": run.status, "last_seq": run.last_seq,
                      "cancel_requested": run.cancel_requested, "finished": list(Run.FINISHED),
                      "queue": run.queue if run.status == Run.Status.QUEUED else None},
    })


@require_safe
@login_required
def compare_page(request: HttpRequest) -> HttpResponse:
    """2-4 runs overlaid; with no runs named, a picker. Bad input is a 400, an unknown run a 404, both explained."""
    requested = request.GET.getlist("runs")
    if not any(v.strip() for v in requested):
        picker = visible_runs(request.user).select_related("team")[:PICKER_RUNS]
        return render(request, "compare.html", {"picker": picker})
    try:
        runs = runs_to_compare(visible_runs(request.user), parse_run_ids(requested))
    except CompareError as exc:
        return render(request, "compare.html", {"error": str(exc), "requested": ",".join(requested)},
                      status=exc.status)
    return render(request, "compare.html", {
        "runs": runs, "diff": config_diff([r.config for r in runs]), "plotly_url": plotly_url(),
        "compare_data": [{"id": r.pk, "name": r.name} for r in runs],
    })


@require_safe
@login_required
def cluster_page(request: HttpRequest) -> HttpResponse:
    return render(request, "cluster.html", {"plotly_url": plotly_url()})
