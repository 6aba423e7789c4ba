"""Browser pages: login required everywhere, team isolation, offline assets (no CDN), presets, compare input checks."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.webapp.conftest import TINY_CONFIG
from webapp.accounts.models import Team
from webapp.pages.compare import config_diff, flatten
from webapp.pages.presets import load_presets
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

PAGES = ["/", "/runs/new/", "/compare/", "/cluster/"]


def make_run(owner: Any, team: Team, name: str = "first", **config: Any) -> Run:
    # Stored directly: these tests are about pages, not about submission (no queue, no worker).
    return Run.objects.create(owner=owner, team=team, name=name, config={**TINY_CONFIG, **config})


def browser(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice_run(alice: Any, ants: Team) -> Run:
    return make_run(alice, ants, "alice-run")


@pytest.fixture
def bob_run(bob: Any, ants: Team) -> Run:
    return make_run(bob, ants, "bob-run", iterations=5, seed=3)


# ---- login -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [*PAGES, "/runs/1/", "/compare/?runs=1,2"])
def test_every_page_sends_anonymous_users_to_login(path: str, db: None) -> None:
    got = Client().get(path)
    assert got.status_code == 302
    assert got["Location"].startswith("/login/?next=")


def test_login_page_signs_in_and_logout_is_a_post(alice: Any) -> None:
    client = Client()
    assert client.get("/login/").status_code == 200
    wrong = client.post("/login/", {"username": "alice", "password": "nope"})
    assert wrong.status_code == 200 and b"errors" in wrong.content
    got = client.post("/login/", {"username": "alice", "password": "alice-password-123", "next": "/cluster/"})
    assert got.status_code == 302 and got["Location"] == "/cluster/"
    assert client.get("/").status_code == 200
    assert client.get("/logout/").status_code == 405  # a link cannot log anyone out
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


# ---- pages render, offline -------------------------------------------------------------------------

@pytest.mark.parametrize("path", [*PAGES, "run", "compare-two", "/login/"])
def test_pages_render_for_alice_without_anything_from_the_internet(path: str, alice: Any, alice_run: Run,
                                                                     bob_run: Run) -> None:
    path = {"run": f"/runs/{alice_run.pk}/", "compare-two": f"/compare/?runs={alice_run.pk},{bob_run.pk}"}.get(path, path)
    got = browser(alice).get(path) if path != "/login/" else Client().get(path)
    assert got.status_code == 200
    html = got.content.decode()
    assert "cdn." not in html and "https://" not in html and "http://" not in html
    if path != "/login/":
        assert 'action="/logout/"' in html and "csrfmiddlewaretoken" in html  # log out is a POST form
        for link in ("/runs/new/", "/compare/", "/cluster/", "/api/docs/"):
            assert f'href="{link}"' in html


def test_run_page_has_the_hooks_the_browser_test_uses(alice: Any, alice_run: Run) -> None:
    html = browser(alice).get(f"/runs/{alice_run.pk}/").content.decode()
    for hook in ('id="run-status"', 'id="charts"', 'id="board"', 'data-ply="0"', 'id="event-log"',
                 'id="cancel-button"', 'id="clone-button"', f"/api/runs/{alice_run.pk}/metrics/?format=csv",
                 "/vendor/plotly.min.js"):
        assert hook in html
    assert ">queued<" in html


def test_plotly_is_served_from_the_installed_package(db: None) -> None:
    got = Client().get("/vendor/plotly.min.js")
    assert got.status_code == 200
    assert got["Content-Type"].startswith("text/javascript")
    assert "max-age=31536000" in got["Cache-Control"]
    assert int(got["Content-Length"]) > 1_000_000
    zipped = Client().get("/vendor/plotly.min.js", HTTP_ACCEPT_ENCODING="gzip, br")
    assert zipped["Content-Encoding"] == "gzip" and len(zipped.content) < int(got["Content-Length"])
    assert Client().get("/vendor/plotly.min.js", HTTP_IF_NONE_MATCH=got["ETag"]).status_code == 304


# ---- team isolation --------------------------------------------------------------------------------

def test_charlie_gets_404_for_alices_run_and_bob_sees_it(alice_run: Run, bob: Any, charlie: Any) -> None:
    assert browser(charlie).get(f"/runs/{alice_run.pk}/").status_code == 404
    assert browser(charlie).get("/runs/999999/").status_code == 404  # same answer as a missing run
    assert browser(bob).get(f"/runs/{alice_run.pk}/").status_code == 200


def test_compare_with_another_teams_run_is_404(alice_run: Run, charlie: Any, bees: Team) -> None:
    mine = make_run(charlie, bees, "charlie-run")
    got = browser(charlie).get(f"/compare/?runs={mine.pk},{alice_run.pk}")
    assert got.status_code == 404
    assert f"no run {alice_run.pk}" in got.content.decode()
    assert "alice-run" not in got.content.decode()


# ---- new run ---------------------------------------------------------------------------------------

def test_new_run_page_lists_presets_and_launchable_teams(alice: Any, bees: Team) -> None:
    html = browser(alice).get("/runs/new/").content.decode()
    assert "tiny smoke test" in html and ">demo<" in html
    assert 'id="presets-data"' in html and '"tiny-test"' in html  # the YAML content itself, for the editor
    for hook in ('<form id="new-run"', 'id="config"', 'id="team"', 'id="name"', 'id="form-errors"'):
        assert hook in html
    assert 'value="ants"' in html and 'value="bees"' not in html


def test_presets_come_from_the_config_files() -> None:
    presets = {p.key: p for p in load_presets()}
    assert presets["tiny_test"].label == "tiny smoke test"
    assert presets["tiny_test"].config["iterations"] == 2
    assert presets["demo"].config["name"] == "demo"
    assert all("output_dir" not in p.config for p in presets.values())


# ---- compare ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, why", [
    ("runs={a}", "2 to 4 different runs, got 1"),
    ("runs={a},{a}", "got 1"),
    ("runs={a},{b},{a},1,2,3", "got 5"),
    ("runs={a},banana", "'banana' is not a run id"),
])
def test_compare_explains_bad_input(query: str, why: str, alice: Any, alice_run: Run, bob_run: Run) -> None:
    ids = list(Run.objects.values_list("pk", flat=True))
    extra = [make_run(alice, alice_run.team, f"r{i}").pk for i in range(3)]
    query = query.replace("1,2,3", ",".join(map(str, extra)))
    got = browser(alice).get("/compare/?" + query.format(a=ids[0], b=ids[1]))
    assert got.status_code == 400
    assert why in got.content.decode().replace("&#x27;", "'")


def test_compare_unknown_run_is_404_and_empty_query_shows_a_picker(alice: Any, alice_run: Run) -> None:
    got = browser(alice).get(f"/compare/?runs={alice_run.pk},999999")
    assert got.status_code == 404 and "no run 999999" in got.content.decode()
    picker = browser(alice).get("/compare/")
    assert picker.status_code == 200 and 'id="compare-picker"' in picker.content.decode()


def test_compare_shows_only_differing_config_keys(alice: Any, alice_run: Run, bob_run: Run) -> None:
    html = browser(alice).get(f"/compare/?runs={alice_run.pk},{bob_run.pk}").content.decode()
    assert 'data-key="iterations"' in html and 'data-key="seed"' in html
    assert 'data-key="model.preset"' not in html
    # repeated ?runs= works like a comma list (the picker's checkboxes send that)
    assert browser(alice).get(f"/compare/?runs={alice_run.pk}&runs={bob_run.pk}").status_code == 200


def test_config_diff_fills_defaults_and_flattens() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": []}) == {"a.b": 1, "a.c.d": 2, "e": []}
    rows = {r["key"]: r["values"] for r in config_diff([{"seed": 0}, {}, {"rollout": {"groups": 3}}])}
    assert "seed" not in rows  # 0 is the default: leaving it out is the same config
    assert rows["rollout.groups"] == ["8", "8", "3"]
