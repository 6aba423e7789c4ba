"""A person's path through the product: log in, launch a run from the form, watch it live, compare it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from webapp.runs.models import Run

pytestmark = pytest.mark.slow

RUN_PAGE = re.compile(r".*/runs/\d+/$")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "run-page.png"


def _int_attr(page: Any, selector: str, attr: str) -> int:
    return int(page.locator(selector).get_attribute(attr) or 0)


def test_launch_watch_and_compare_in_the_browser(page: Any, alice: Any) -> None:
    page.goto("/")
    assert "/login/" in page.url  # signed-out visitors go to the login page
    page.fill("#id_username", "alice")
    page.fill("#id_password", "alice-password-123")
    page.click("#login-form button[type=submit]")
    page.wait_for_url("**/")

    # New run: a preset, then an edit of the config in the editor, then an error shown inline, then a good launch.
    page.goto("/runs/new/")
    page.click("[data-preset=tiny_test]")
    config = json.loads(page.input_value("#config"))
    config.update({"iterations": 4, "checkpoint_every": 2,
                   "sft": {"enabled": True, "games": 64, "epochs": 2, "lr": 0.003, "batch": 16}})
    page.fill("#config", json.dumps({**config, "rollout": {**config.get("rollout", {}), "temperature": 7}}))
    page.fill("#name", "browser run")
    page.click("#submit-run")
    errors = page.locator("#form-errors")
    errors.wait_for(state="visible")
    assert "config.rollout.temperature" in errors.inner_text() and "0.0..2.0" in errors.inner_text()
    page.fill("#config", json.dumps(config))
    page.click("#submit-run")
    page.wait_for_url(RUN_PAGE)
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # Live: points are appended and the board fills while the run trains (no reload).
    page.wait_for_function("() => Number(document.querySelector('#charts').dataset.points) >= 2", timeout=300_000)
    page.wait_for_function("() => document.querySelector('#board').dataset.game !== undefined", timeout=120_000)
    assert "played" in page.inner_text("#board-caption")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.wait_for_function("() => document.querySelector('#run-status').dataset.status === 'succeeded'",
                           timeout=300_000)
    assert _int_attr(page, "#charts", "data-points") >= 4
    # the board followed the sample games live, up to the last iteration's (a model this fresh may lose on its
    # first answer, so the position itself can be empty)
    assert page.locator("#board").get_attribute("data-game") == "3/0"
    assert "agent" in page.inner_text("#board-caption")
    assert page.locator("#event-log li").count() > 10
    assert Run.objects.get(pk=run_id).status == "succeeded"

    # Clone from the run page, then compare the two runs.
    page.click("#clone-button")
    page.wait_for_function(f"() => !location.pathname.endsWith('/runs/{run_id}/')")
    clone_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.goto(f"/compare/?runs={run_id},{clone_id}")
    page.wait_for_selector("table")
    assert "browser run" in page.content()

    # The cluster page charts the team's usage: the finished run held its gang for a while in the window.
    page.goto("/cluster/")
    page.wait_for_function("() => Number(document.querySelector('#usage-chart').dataset.teams) >= 1",
                           timeout=30_000)
    assert page.locator("#usage-chart .main-svg").count() >= 1  # Plotly drew it
