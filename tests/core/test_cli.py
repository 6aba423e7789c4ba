"""The command line as a user runs it: clear config errors, eval report, playing in the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str, stdin: str = "", timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "earl_core", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("rollout:\n  temperature: -1\n")
    out = _run("train", "--config", str(cfg))
    assert out.returncode == 2
    assert out.stderr.strip() == "error: rollout.temperature: -1.0 is out of range (allowed: 0.0..2.0)"
    out = _run("train", "--set", "game.opponent=alphazero")
    assert out.returncode == 2 and "game.opponent" in out.stderr and "solver:D" in out.stderr


def test_an_unknown_board_format_names_the_choices(tmp_path: Path) -> None:
    out = _run("eval", "--checkpoint", str(tmp_path), "--board-format", "grid")
    assert out.returncode == 2 and "--board-format" in out.stderr and "rows" in out.stderr and "cells" in out.stderr
    out = _run("play", "--checkpoint", str(tmp_path), "--board-view", "mine")
    assert out.returncode == 2 and "--board-view" in out.stderr
    assert "absolute" in out.stderr and "relative" in out.stderr
    out = _run("train", "--set", "game.board_format=grid")
    assert out.returncode == 2 and "game.board_format" in out.stderr and "cells" in out.stderr


def test_an_out_of_range_temperature_is_refused_before_the_engine_starts(protocol_model: Path) -> None:
    out = _run("eval", "--checkpoint", str(protocol_model), "--temperature", "5", "--engine", "hf")
    assert out.returncode == 2
    assert out.stderr.strip() == "error: sampling.temperature: 5.0 is out of range (allowed: 0 or 0.01..2)"


@pytest.mark.slow
@pytest.mark.parametrize("temperature", ["0", "1.0"])
def test_eval_reports_both_sides(protocol_model: Path, temperature: str) -> None:
    out = _run("eval", "--checkpoint", str(protocol_model), "--opponent", "random", "--games", "3", "--engine", "hf",
               "--temperature", temperature)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for side in ("first", "second"):
        r = report[side]
        assert r["wins"] + r["draws"] + r["losses"] == r["games"] == 3
        lo, hi = r["win_rate_ci95"]
        assert 0 <= lo <= r["win_rate"] <= hi <= 1
        assert sum(r["loss_causes"].values()) == r["losses"]
        assert sum(r["invalid_kinds"].values()) == r["invalid_answers"]


@pytest.mark.slow
def test_play_in_terminal(protocol_model: Path) -> None:
    # An untrained agent answers nonsense: after its retry it loses, and the person is told.
    out = _run("play", "--checkpoint", str(protocol_model), "--side", "1", stdin="9\n3\n3\n3\n3\n3\n3\n")
    assert out.returncode == 0, out.stderr
    assert "not a legal column: '9'" in out.stdout
    assert "agent:" in out.stdout
    verdict = out.stdout.strip().splitlines()[-1]
    assert verdict.startswith(("you win (", "the agent wins (", "draw (")), verdict
