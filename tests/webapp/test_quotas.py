"""Team quotas and submit-time refusal: quota limits, queue length, node and cluster size, the quota endpoint."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.webapp.conftest import TINY_CONFIG, client_for
from webapp.accounts.models import Team
from webapp.runs.models import Run
from webapp.scheduling.models import Quota
from webapp.scheduling.submission import cluster_nodes

pytestmark = pytest.mark.django_db

GIB = 1024**3


@pytest.fixture(autouse=True)
def no_cluster_view(settings: Any) -> None:
    """Unless a test serves a dashboard, the cluster's size is unknown and only team limits apply."""
    settings.RAY_DASHBOARD_URL = ""


@pytest.fixture
def dana(django_user_model: Any) -> Any:
    """A site admin who belongs to no team."""
    return django_user_model.objects.create_user(username="dana", password="dana-password-123", is_staff=True)


@pytest.fixture
def as_dana(dana: Any) -> APIClient:
    return client_for(dana)


def submit(client: APIClient, *, team: str = "ants", config: dict[str, Any] | None = None,
           resources: Any = None) -> Any:
    body: dict[str, Any] = {"team": team, "config": config or TINY_CONFIG, "name": "sweep"}
    if resources is not None:
        body["resources"] = resources
    return client.post("/api/runs/", body, format="json")


def fields(response: Any) -> dict[str, dict[str, Any]]:
    return {e["field"]: e for e in response.json()["errors"]}


def gpu_bundles(*gpus: int) -> dict[str, Any]:
    return {"bundles": [{"cpus": 1, "gpus": n} for n in gpus]}


# ---- quota refusal at submit time ---------------------------------------------------------------------------

def test_a_run_asking_more_gpus_than_the_team_quota_is_refused(as_alice: APIClient, ants: Team) -> None:
    Quota.objects.create(team=ants, max_gpus=2)
    got = submit(as_alice, resources=gpu_bundles(2, 2))
    assert got.status_code == 400, got.json()
    error = fields(got)["resources.gpus"]
    assert error["message"] == "asks 4 GPUs; team 'ants' may use at most 2 at once"
    assert error["allowed"] == "at most 2 GPUs (the team's quota)"
    assert not Run.objects.exists()
    assert submit(as_alice, resources=gpu_bundles(1, 1)).status_code == 201


def test_the_default_gang_counts_one_cpu_per_worker_against_the_cpu_quota(as_alice: APIClient, ants: Team) -> None:
    Quota.objects.create(team=ants, max_cpus=2)
    # 1 rollout worker + 1 trainer worker of 1 CPU: exactly the quota.
    ok = submit(as_alice)
    assert ok.status_code == 201, ok.json()
    assert ok.json()["resources"] == {}
    got = submit(as_alice, config={**TINY_CONFIG, "trainer_workers": 2})
    assert got.status_code == 400
    assert fields(got)["resources.cpus"]["message"] == "asks 3 CPUs; team 'ants' may use at most 2 at once"


def test_a_full_queue_refuses_new_and_cloned_runs_until_one_leaves(as_alice: APIClient, as_charlie: APIClient,
                                                                     ants: Team, bees: Team) -> None:
    Quota.objects.create(team=ants, max_queued=1)
    first = submit(as_alice)
    assert first.status_code == 201
    got = submit(as_alice)
    assert got.status_code == 400
    error = fields(got)["queued"]
    assert error["message"] == "team 'ants' already has 1 queued runs; at most 1 may wait at once"
    assert "cancel one" in error["allowed"]
    clone = as_alice.post(f"/api/runs/{first.json()['id']}/clone/", {}, format="json")
    assert clone.status_code == 400 and "queued" in fields(clone)
    assert submit(as_charlie, team="bees").status_code == 201  # the bees' queue is theirs
    assert as_alice.post(f"/api/runs/{first.json()['id']}/cancel/").status_code == 200
    assert submit(as_alice).status_code == 201


def test_a_team_without_a_quota_is_unlimited(as_alice: APIClient) -> None:
    got = submit(as_alice, resources={"cpus": 64, "gpus": 8, "memory_gib": 512})
    assert got.status_code == 201, got.json()
    assert got.json()["resources"] == {"cpus": 64, "gpus": 8, "memory_gib": 512}


# ---- refusal against the cluster's nodes (a stand-in Ray dashboard on a local port) ------------------------

def _ray_row(node_id: str, *, gpus: float, state: str = "ALIVE") -> dict[str, Any]:
    return {"node_id": node_id, "node_ip": "10.0.0.1", "is_head_node": node_id == "n1", "state": state,
            "resources_total": {"CPU": 16.0, "GPU": gpus, "memory": float(64 * GIB), "node:10.0.0.1": 1.0}}


# Two live 4-GPU nodes; the dead 8-GPU node must not count.
RAY_NODES = {"data": {"result": {"result": [_ray_row("n1", gpus=4.0), _ray_row("n2", gpus=4.0),
                                            _ray_row("n3", gpus=8.0, state="DEAD")]}}}


class _Dashboard(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps(RAY_NODES).encode() if self.path.startswith("/api/v0/nodes") else b"{}"
        self.send_response(200 if self.path.startswith("/api/v0/nodes") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def ray_dashboard(settings: Any) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.RAY_DASHBOARD_URL = f"http://127.0.0.1:{server.server_address[1]}"
    yield settings.RAY_DASHBOARD_URL
    server.shutdown()
    server.server_close()


def test_a_bundle_bigger_than_every_live_node_is_refused(as_alice: APIClient, ray_dashboard: str) -> None:
    got = submit(as_alice, resources=gpu_bundles(1, 8))
    assert got.status_code == 400, got.json()
    error = fields(got)["resources.bundles[1].gpus"]
    assert error["message"] == "bundle 1 asks 8 GPUs; the largest node has 4"
    assert error["allowed"] == "at most 4 GPUs per bundle"


def test_one_flat_bundle_is_named_without_an_index(as_alice: APIClient, ray_dashboard: str) -> None:
    got = submit(as_alice, resources={"cpus": 2, "memory_gib": 128})
    assert got.status_code == 400
    error = fields(got)["resources.memory_gib"]
    assert error["message"] == "bundle 0 asks 128 GiB memory; the largest node has 64 GiB memory"
    assert error["allowed"] == "at most 64 GiB memory per bundle"


def test_a_gang_bigger_than_the_cluster_is_refused_and_one_that_fits_queues(as_alice: APIClient,
                                                                             ray_dashboard: str) -> None:
    got = submit(as_alice, resources=gpu_bundles(4, 4, 4))
    assert got.status_code == 400
    assert fields(got)["resources.gpus"]["message"] == "asks 12 GPUs in all; the whole cluster has 8 GPUs"
    assert submit(as_alice, resources=gpu_bundles(4, 4)).status_code == 201


def test_an_unreachable_dashboard_skips_cluster_checks_but_not_the_quota(as_alice: APIClient, ants: Team,
                                                                         settings: Any) -> None:
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.RAY_DASHBOARD_URL = f"http://127.0.0.1:{port}"
    assert submit(as_alice, resources=gpu_bundles(16)).status_code == 201
    Quota.objects.create(team=ants, max_gpus=8)
    got = submit(as_alice, resources=gpu_bundles(16))
    assert got.status_code == 400 and "resources.gpus" in fields(got)


def test_a_half_read_cluster_view_is_treated_as_unavailable() -> None:
    row = {"node_id": "n1", "state": "ALIVE", "cpus": 16, "gpus": 4, "memory_bytes": 64 * GIB}
    assert cluster_nodes({"nodes": [row], "error": None})[0].total.gpus == 4  # type: ignore[index]
    assert cluster_nodes({"nodes": [row, {**row, "gpus": "many"}], "error": None}) is None
    assert cluster_nodes({"nodes": [{**row, "state": "DEAD"}], "error": None}) is None
    assert cluster_nodes({"nodes": [], "error": "Ray dashboard unreachable"}) is None


# ---- resources validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("resources, field, allowed", [
    (5, "resources", '{"bundles": ['),
    ({"bundles": []}, "resources.bundles", "1-2048 objects"),
    ({"bundles": [{"cpus": 1}, "big"]}, "resources.bundles[1]", "an object with cpus, gpus, memory_gib"),
    ({"bundles": [{"gpus": 1.5}]}, "resources.bundles[0].gpus", "a whole number from 0 to 1024"),
    ({"bundles": [{"cpus": 0}]}, "resources.bundles[0]", "at least one of cpus, gpus, memory_gib above 0"),
    ({"cpus": -1}, "resources.cpus", "a number from 0 to 100000"),
    ({"gpu": 1}, "resources.gpu", "cpus, gpus, memory_gib"),
    ({"bundles": [{"cpus": 1}], "gpus": 1}, "resources.gpus", "only bundles"),
    ({"memory_gib": True}, "resources.memory_gib", "a number of GiB"),
])
def test_bad_resources_name_the_field_and_what_is_allowed(as_alice: APIClient, resources: Any, field: str,
                                                          allowed: str) -> None:
    got = submit(as_alice, resources=resources)
    assert got.status_code == 400, got.json()
    assert allowed in (fields(got)[field]["allowed"] or "")
    assert not Run.objects.exists()


def test_bad_resources_are_listed_with_bad_config_fields(as_alice: APIClient) -> None:
    bad_config = {**TINY_CONFIG, "rollout": {"temperature": 9}}
    got = submit(as_alice, config=bad_config, resources={"gpus": -2, "colour": "red"})
    assert got.status_code == 400
    assert {"config.rollout.temperature", "resources.gpus", "resources.colour"} <= set(fields(got))


# ---- the quota endpoint ---------------------------------------------------------------------------------------

def test_team_admins_and_members_read_the_quota_but_cannot_set_it(as_alice: APIClient, as_bob: APIClient,
                                                                  ants: Team) -> None:
    unset = as_bob.get("/api/teams/ants/quota/")
    assert unset.status_code == 200
    assert unset.json() == {"team": ants.pk, "team_slug": "ants", "max_gpus": None, "max_cpus": None,
                            "max_queued": None}
    Quota.objects.create(team=ants, max_gpus=4)
    assert as_alice.get(f"/api/teams/{ants.pk}/quota/").json()["max_gpus"] == 4
    for client in (as_alice, as_bob):
        assert client.patch("/api/teams/ants/quota/", {"max_gpus": 64}, format="json").status_code == 403
        assert client.put("/api/teams/ants/quota/", {"max_gpus": 64}, format="json").status_code == 403
    assert Quota.objects.get(team=ants).max_gpus == 4


def test_another_teams_quota_is_a_404_like_a_missing_team(as_charlie: APIClient, ants: Team) -> None:
    Quota.objects.create(team=ants, max_gpus=4)
    assert as_charlie.get("/api/teams/ants/quota/").status_code == 404
    assert as_charlie.get(f"/api/teams/{ants.pk}/quota/").status_code == 404
    assert as_charlie.patch("/api/teams/ants/quota/", {"max_gpus": 64}, format="json").status_code == 404
    assert as_charlie.get("/api/teams/nobody/quota/").status_code == 404
    assert APIClient().get("/api/teams/ants/quota/").status_code == 401


def test_staff_set_quotas_with_put_and_patch(as_dana: APIClient, ants: Team) -> None:
    put = as_dana.put("/api/teams/ants/quota/", {"max_gpus": 8, "max_cpus": 32.5, "max_queued": 3}, format="json")
    assert put.status_code == 200, put.json()
    assert (put.json()["max_gpus"], put.json()["max_cpus"], put.json()["max_queued"]) == (8, 32.5, 3)
    patched = as_dana.patch(f"/api/teams/{ants.pk}/quota/", {"max_queued": None}, format="json")
    assert (patched.json()["max_gpus"], patched.json()["max_queued"]) == (8, None)
    # PUT replaces every limit: one left out becomes unlimited.
    replaced = as_dana.put("/api/teams/ants/quota/", {"max_cpus": 4}, format="json")
    assert (replaced.json()["max_gpus"], replaced.json()["max_cpus"]) == (None, 4)
    assert Quota.objects.filter(team=ants).count() == 1
    assert as_dana.get("/api/teams/nobody/quota/").status_code == 404


def test_bad_quota_values_name_the_field(as_dana: APIClient, ants: Team) -> None:
    got = as_dana.patch("/api/teams/ants/quota/", {"max_gpus": 1.5, "colour": "red"}, format="json")
    assert got.status_code == 400
    errors = fields(got)
    assert "whole number" in errors["max_gpus"]["message"] and "None" in errors["max_gpus"]["allowed"]
    assert errors["colour"]["allowed"] == "max_gpus, max_cpus, max_queued"
    huge = as_dana.patch("/api/teams/ants/quota/", {"max_queued": 2**40}, format="json")
    assert huge.status_code == 400 and "max_queued" in fields(huge)
    negative = as_dana.patch("/api/teams/ants/quota/", {"max_cpus": -1}, format="json")
    assert negative.status_code == 400 and "max_cpus" in fields(negative)
    assert not Quota.objects.exists()


def test_staff_set_a_quota_in_the_django_admin(dana: Any, ants: Team) -> None:
    dana.is_superuser = True  # the admin asks for model permissions; a superuser has them all
    dana.save()
    browser = Client()
    browser.force_login(dana)
    got = browser.post("/admin/scheduling/quota/add/", {"team": ants.pk, "max_gpus": "4", "max_cpus": "",
                                                        "max_queued": "2"})
    assert got.status_code == 302, got.content.decode()[:2000]
    quota = Quota.objects.get(team=ants)
    assert (quota.max_gpus, quota.max_cpus, quota.max_queued) == (4, None, 2)
    assert browser.get("/admin/scheduling/quota/").status_code == 200
