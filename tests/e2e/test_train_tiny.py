"""Tiny-budget end-to-end runs on a real local Ray with vLLM rollout workers and data-parallel trainers.

One Ray instance serves every test of the module (Ray start costs seconds on this machine).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from earl_core import events as ev
from earl_core.checkpoints import STATE_FILE
from earl_core.config import ParallelismConfig, RunConfig
from earl_core.evaluate import checkpoint_limits
from earl_core.loop import _reference_dir, train
from earl_core.ray_exec.cluster import ray_cluster

pytestmark = pytest.mark.slow
_ONE_ROLLOUT_WORKER = {"groups": 2, "group_size": 2, "max_new_tokens": 6, "workers": 1}


@pytest.fixture(scope="module")
def ray_session():  # noqa: ANN201 - yields the cluster description
    with ray_cluster(num_cpus=4) as where:
        yield where


def _config(tmp_path: Path, **changes: object) -> RunConfig:
    data = {
        "name": "e2e",
        "output_dir": str(tmp_path),
        "iterations": 2,
        "checkpoint_every": 1,
        "trainer_workers": 2,
        "rollout": {"groups": 2, "group_size": 2, "max_new_tokens": 6, "workers": 2},
        "algo": {"lr": 1e-3, "micro_batch": 4},
        "sft": {"enabled": True, "games": 8, "epochs": 1, "batch": 8},
    }
    data.update(changes)
    return RunConfig.from_dict(data)


def test_tiny_run_trains_and_reports_in_order(ray_session: str, tmp_path: Path) -> None:
    # With a KL penalty: its reference is the warm-started policy, on both data-parallel ranks.
    cfg = _config(tmp_path, algo={"lr": 1e-3, "micro_batch": 4, "kl_coef": 0.1})
    got: list[dict] = []
    summary = train(cfg, got.append, run_id=1)
    assert summary.status == "succeeded" and summary.iterations_done == 2

    # Events: numbered 1..N without gaps, schema-valid, the status story in order.
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    validator = jsonschema.Draft202012Validator(ev.load_schema())
    for e in got:
        validator.validate(e)
    statuses = [e["data"]["status"] for e in got if e["type"] == "run.status"]
    assert statuses == ["starting", "running", "succeeded"]
    it_metrics = [e["data"] for e in got if e["type"] == "metrics" and "rollout/win_rate" in e["data"]["values"]]
    assert [m["iteration"] for m in it_metrics] == [0, 1]
    for m in it_metrics:
        v = m["values"]
        assert v["perf/generated_tokens"] > 0 and v["context/max"] >= v["context/mean"] > 0
        assert v["perf/train_tokens"] > 0
    # RL's first step starts from the reference (a KL to the fresh weights would be large after the warm start).
    assert it_metrics[0]["values"]["losses/kl"] == pytest.approx(0.0, abs=1e-6)
    sft = [e["data"]["values"] for e in got if e["type"] == "metrics" and "sft/loss" in e["data"]["values"]]
    assert len(sft) == cfg.sft.epochs and sft[0]["sft/loss"] > 0
    memory = [e for e in got if e["type"] == "memory"]
    assert {w["worker"] for w in memory[0]["data"]["workers"]} == {"rollout-0", "rollout-1", "trainer-0", "trainer-1"}
    assert any(e["type"] == "game.end" for e in got) and any(e["type"] == "game.move" for e in got)
    # The games reached the trainer ranks through the layout-aware dispatcher: nothing bulk through the driver.
    dispatch = [e["data"] for e in got if e["type"] == "dispatch"]
    assert [d["iteration"] for d in dispatch] == [0, 1]
    assert all(d["bytes_via_driver"] == 0 and d["bytes_moved"] == sum(d["fields"].values()) > 0 for d in dispatch)
    assert all(d["fields"]["token_ids"] > 0 and d["fields"]["old_logprobs"] == 0 for d in dispatch)

    # Files: the same events on disk, one metrics line per iteration, HF checkpoints whose weights moved.
    run_dir = Path(summary.run_dir)
    on_disk = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert on_disk == got
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    base = load_file(run_dir / "base_model" / "model.safetensors")
    final = load_file(Path(summary.last_checkpoint) / "model.safetensors")
    assert any(not torch.equal(base[k], final[k]) for k in base)


def test_resume_continues_from_checkpoint(ray_session: str, tmp_path: Path) -> None:
    # The first leg trains tensor-parallel (two ranks, each holding half of every layer); the resumed leg
    # shards with FSDP (two ranks, each storing half of every parameter and of the Adam moments): a checkpoint is
    # the same whatever layout wrote it.
    cfg = _config(tmp_path, iterations=1, trainer_workers=2, parallelism={"train_tp": 2}, sft={"enabled": False},
                  rollout={"groups": 2, "group_size": 2, "max_new_tokens": 6})
    first: list[dict] = []
    train(cfg, first.append)
    assert [(e["data"]["stage"], e["data"]["new_layout"]["key"]) for e in first if e["type"] == "selector.decision"] \
        == [("experience", "tp2.dp1.mb4"), ("train", "tp2.dp1.mb4"), ("rollout", "tp1.dp1.mb4")]
    more = cfg.replace(iterations=2, parallelism=ParallelismConfig(train_fsdp=True))
    got: list[dict] = []
    summary = train(more, got.append, resume=True)
    assert summary.iterations_done == 2
    assert [(e["data"]["stage"], e["data"]["new_layout"]["key"]) for e in got if e["type"] == "selector.decision"] \
        == [("experience", "tp1.dp2.mb4"), ("train", "tp1.dp2.mb4+fsdp"), ("rollout", "tp1.dp1.mb4")]
    assert any(e["type"] == "log" and "resuming from" in e["data"]["message"] for e in got)
    assert [e["data"]["iteration"] for e in got if e["type"] == "metrics"] == [1]
    assert summary.last_checkpoint and summary.last_checkpoint.endswith("iter_000002")
    # The resumed run loaded checkpoint 1's optimiser: its step count carried on (1 + 1), not restarted.
    state = torch.load(Path(summary.last_checkpoint) / "trainer_state.pt", weights_only=False)
    assert state["steps"] == 2
    # One metrics line per iteration, and event numbers continue the first run's without a gap.
    run_dir = Path(summary.run_dir)
    assert [json.loads(x)["iteration"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    seqs = [json.loads(x)["seq"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert seqs == list(range(1, len(seqs) + 1)) and got[0]["seq"] > 1


def test_a_resumed_run_takes_its_kl_reference_from_checkpoint_0(tmp_path: Path) -> None:
    """A fresh run copies its warm-started policy into the KL reference (above); a resumed one loads that policy
    from checkpoint 0, and a run without one (no warm start) keeps the fresh model."""
    cfg = _config(tmp_path)
    zero = cfg.run_dir / "checkpoints" / "iter_000000"
    zero.mkdir(parents=True)
    (zero / STATE_FILE).write_text("{}")
    assert _reference_dir(cfg, "base", resumed=True) == str(zero)
    assert _reference_dir(cfg, "base", resumed=False) == "base"
    (zero / STATE_FILE).unlink()  # half-written: not a checkpoint
    assert _reference_dir(cfg, "base", resumed=True) == "base"


def test_cancel_stops_at_a_safe_point(ray_session: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, iterations=5, trainer_workers=1, sft={"enabled": False})
    calls = {"n": 0}

    def stop_after_one() -> bool:
        calls["n"] += 1
        return calls["n"] > 1

    got: list[dict] = []
    summary = train(cfg, got.append, should_stop=stop_after_one)
    assert summary.status == "cancelled" and summary.iterations_done == 1
    assert [e["data"]["status"] for e in got if e["type"] == "run.status"][-1] == "cancelled"
    assert summary.last_checkpoint and Path(summary.last_checkpoint, "model.safetensors").exists()


def test_a_cells_run_warm_starts_on_positions_and_its_checkpoints_keep_the_format(ray_session: str,
                                                                                   tmp_path: Path) -> None:
    cfg = _config(tmp_path, iterations=1, trainer_workers=1, game={"board_format": "cells", "board_view": "relative"},
                  rollout=_ONE_ROLLOUT_WORKER,
                  sft={"enabled": True, "games": 8, "positions": 20, "position_source": "mixed",
                       "positions_per_conversation": 4, "epochs": 2, "batch": 8,
                       "lr_schedule": "cosine"})
    got: list[dict] = []
    summary = train(cfg, got.append)
    assert summary.status == "succeeded"
    logs = [e["data"]["message"] for e in got if e["type"] == "log"]
    assert any("8 heuristic games" in m and "20 positions (mixed) in 5 conversations" in m for m in logs), logs
    assert "warm start: heuristic teacher playing 8 games against random,heuristic and 2 mixed-play games" in logs, logs
    assert any(m.startswith("warm start epoch 1: step 1/2, loss ") for m in logs), logs  # progress within the epoch
    sft = [e["data"]["values"] for e in got if e["type"] == "metrics" and "sft/loss" in e["data"]["values"]]
    assert sft[0]["sft/steps"] == 1 + 1  # games and positions in separate batches: 8 / 8 + ceil(20 / 4 / 8)
    # Each epoch reports its own wall time and the data preparation both epochs share.
    assert all(s["sft/seconds"] > 0 for s in sft) and sft[0]["sft/prepare_seconds"] == sft[1]["sft/prepare_seconds"] > 0
    # Cosine over the 4 steps of both epochs (the schedule runs across epochs): the last step of epoch k runs at
    # lr * (1 + cos(pi * (2k - 1) / 4)) / 2.
    assert [s["sft/lr"] for s in sft] == pytest.approx([1e-3 * (1 + math.cos(math.pi / 4)) / 2,
                                                        1e-3 * (1 + math.cos(3 * math.pi / 4)) / 2])
    # The fresh tokenizer learned the cell words; the checkpoints record the format and view for eval and play.
    tokenizer = AutoTokenizer.from_pretrained(Path(summary.run_dir) / "base_model")
    assert len(tokenizer.encode(" dax", add_special_tokens=False)) == 1
    for ckpt in ("iter_000000", "iter_000001"):
        limits = checkpoint_limits(str(cfg.run_dir / "checkpoints" / ckpt))
        assert (limits.board_format, limits.board_view) == ("cells", "relative")


def test_cancel_during_the_warm_start_leaves_no_starting_checkpoint(ray_session: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, iterations=5, trainer_workers=1,
                  sft={"enabled": True, "games": 16, "epochs": 3, "batch": 4})
    calls = {"n": 0}

    def stop_after_two_steps() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    got: list[dict] = []
    summary = train(cfg, got.append, should_stop=stop_after_two_steps)
    assert summary.status == "cancelled" and summary.iterations_done == 0 and summary.last_checkpoint is None
    assert [e["data"]["status"] for e in got if e["type"] == "run.status"] == ["starting", "cancelled"]
    assert not any(e["type"] == "metrics" for e in got)  # stopped inside the first epoch
    assert not (cfg.run_dir / "checkpoints" / "iter_000000").exists()  # half a warm start is no starting point


def _selector_config(tmp_path: Path, name: str, workers: int = 1, rollout_workers: int = 1,
                     **parallelism: object) -> RunConfig:
    return _config(tmp_path, name=name, trainer_workers=workers, sft={"enabled": False},
                   rollout={"groups": 2, "group_size": 2, "max_new_tokens": 6, "workers": rollout_workers},
                   parallelism={"micro_batches": "1,4", "profile_contexts": "64,256", **parallelism})


def test_selector_profiles_decides_and_guards_the_budget(ray_session: str, tmp_path: Path) -> None:
    got: list[dict] = []
    # Two trainer ranks: the selector may run them as DP=2, TP=2 or DP=2 sharded with FSDP, and profiles all
    # three (switching in between); two rollout ranks: two vLLM engines or one with two tensor-parallel ranks
    # (rebuilt in between).
    summary = train(_selector_config(tmp_path, "auto", workers=2, rollout_workers=2, mode="auto",
                                     memory_budget_gib=64, train_fsdp=True), got.append)
    assert summary.status == "succeeded"
    validator = jsonschema.Draft202012Validator(ev.load_schema())
    decisions = [e["data"] for e in got if e["type"] == "selector.decision"]
    for e in got:
        validator.validate(e)
    # One decision per stage per iteration, each ranking the profiled candidates with predictions.
    assert [d["stage"] for d in decisions] == ["rollout", "experience", "train"] * 2
    rollout = decisions[0::3]
    decisions = [d for d in decisions if d["stage"] != "rollout"]
    for d in rollout:  # 4 games: two engines of 2 games or one engine of 4
        assert {c["layout"] for c in d["candidates"]} == {"tp1.dp2.mb2", "tp2.dp1.mb4"}
        assert all(c["fits"] and c["tokens_per_s"] > 0 and c["memory_bytes"] > 0 for c in d["candidates"])
    train_keys = {c["layout"] for c in decisions[1]["candidates"]}
    assert train_keys == {f"{split}.mb{mb}{shard}{ckpt}" for split, shard in
                          (("tp1.dp2", ""), ("tp2.dp1", ""), ("tp1.dp2", "+fsdp"))
                          for mb in (1, 4) for ckpt in ("", "+ckpt")}
    assert all(c["fits"] and c["tokens_per_s"] > 0 and c["memory_bytes"] > 0 for c in decisions[1]["candidates"])
    # The experience stage follows the train stage's split: its candidates are that split's micro-batches.
    for exp, tr in zip(decisions[0::2], decisions[1::2]):
        split = tr["new_layout"]["key"].split(".mb")[0]
        assert {c["layout"] for c in exp["candidates"]} == {f"{split}.mb1", f"{split}.mb4"}
    # 12 train layouts and 6 experience layouts (two micro-batches on each of the 3 splits), each at 2 contexts;
    # switches to TP=2, to FSDP and back.
    logs = [e["data"]["message"] for e in got if e["type"] == "log"]
    assert any(m.startswith("selector: profiled 36 ") and "a split switch (TP/DP/FSDP) takes" in m for m in logs), logs
    # The rollout engines at the one profile context above a turn's prompt, on each TP degree (TP=2 built first).
    assert any(m.startswith("selector: profiled 2 rollout ") and "tp1: " in m and "tp2: " in m for m in logs), logs
    engines = [m["values"]["selector/rollout_tp"] for m in (e["data"] for e in got if e["type"] == "metrics")
               if "selector/rollout_tp" in m["values"]]
    assert engines == [float(d["new_layout"]["tp"]) for d in rollout]
    chosen = [m["values"]["selector/train_micro_batch"] for m in (e["data"] for e in got if e["type"] == "metrics")
              if "selector/train_micro_batch" in m["values"]]
    assert len(chosen) == 2 and all(mb in (1.0, 4.0) for mb in chosen)
    assert not any(e["type"] == "error" for e in got)


def test_measured_peaks_over_budget_are_errors_and_auto_refuses_to_run_over_it(ray_session: str, tmp_path: Path) -> None:
    # A trainer process holds far more than 50 MiB (Python, torch, the model): static mode runs anyway and
    # reports every measured peak over the budget as an error event, like an OOM ...
    got: list[dict] = []
    summary = train(_selector_config(tmp_path, "static", memory_budget_gib=0.05), got.append)
    assert summary.status == "succeeded"
    over = [e["data"] for e in got if e["type"] == "error"]
    assert over and all(d["kind"] == "MemoryBudgetExceeded" and "over the budget of 0.05 GiB" in d["message"]
                        for d in over)
    static = [e["data"] for e in got if e["type"] == "selector.decision"]
    # The learner stages, then the rollout stage (one engine playing all 4 games).
    assert [(d["stage"], d["new_layout"]["key"]) for d in static] == [
        ("experience", "tp1.dp1.mb4"), ("train", "tp1.dp1.mb4"), ("rollout", "tp1.dp1.mb4")]
    # ... while the selector, once calibrated against those measurements, chooses nothing over the budget.
    got = []
    with pytest.raises(Exception, match="no layout fits the budget of 0.05 GiB"):
        train(_selector_config(tmp_path, "guarded", mode="auto", memory_budget_gib=0.05), got.append)
    assert [e["data"]["status"] for e in got if e["type"] == "run.status"][-1] == "failed"
    assert not any(e["type"] == "selector.decision" and e["data"]["stage"] != "rollout" for e in got)


def _kill_worker(class_name: str) -> int:
    """SIGKILL one live Ray worker process of the run's (a crash: no cleanup, no goodbye); returns its pid."""
    import os
    import signal

    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        # Ray names an actor's process after its class (ray::RolloutWorker, or ray::RolloutWorker.method while busy).
        if cmdline and cmdline[0].split(".")[0] == f"ray::{class_name}":
            os.kill(proc.pid, signal.SIGKILL)
            return proc.pid
    raise AssertionError(f"no {class_name} process found")


def test_killed_rollout_and_trainer_workers_are_rebuilt_and_the_iteration_retried(
        ray_session: str, tmp_path: Path) -> None:
    """A rollout worker killed as iteration 1 ends, then a trainer worker as its retry ends: each time both groups
    are rebuilt from the last checkpoint (iteration 1) and training goes on; every iteration ends up trained."""
    # One engine: each of the three builds then starts one vLLM instead of two (seconds each here).
    cfg = _config(tmp_path, iterations=3, trainer_workers=1, sft={"enabled": False}, max_worker_restarts=2,
                  rollout=_ONE_ROLLOUT_WORKER)
    got: list[dict] = []
    kills = iter(["RolloutWorker", "TrainerWorker"])
    killed: list[int] = []

    def sink(envelope: dict) -> None:
        got.append(envelope)
        data = envelope["data"]
        if envelope["type"] == "metrics" and "rollout/win_rate" in data["values"] and data["iteration"] == 1:
            target = next(kills, None)
            if target is not None:
                killed.append(_kill_worker(target))

    summary = train(cfg, sink, run_id=1)
    assert summary.status == "succeeded" and summary.iterations_done == 3 and len(killed) == 2
    statuses = [(e["data"]["status"], e["data"]["message"]) for e in got if e["type"] == "run.status"]
    assert [s for s, _ in statuses] == ["starting", "running", "starting", "running", "starting", "running",
                                        "succeeded"]
    restarts = [e for e in got if e["type"] == "run.status" and "a worker died" in e["data"]["message"]]
    assert ["restart 1 of at most 2" in restarts[0]["data"]["message"],
            "restart 2 of at most 2" in restarts[1]["data"]["message"]] == [True, True]
    # After the last rebuild, training continued from that checkpoint up to the end.
    assert "checkpoint at iteration " in restarts[1]["data"]["message"], statuses
    resumed = int(restarts[1]["data"]["message"].split("checkpoint at iteration ")[1].split(" ")[0])
    after = [e["data"]["iteration"] for e in got if e["seq"] > restarts[1]["seq"] and e["type"] == "metrics"
             and "rollout/win_rate" in e["data"]["values"]]
    assert after == list(range(resumed, 3))
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))


def test_a_worker_death_beyond_the_limit_fails_the_run_with_the_reason(ray_session: str, tmp_path: Path) -> None:
    from earl_core.errors import WorkerLostError

    cfg = _config(tmp_path, iterations=3, trainer_workers=1, sft={"enabled": False}, max_worker_restarts=0,
                  rollout=_ONE_ROLLOUT_WORKER)
    got: list[dict] = []
    killed: list[int] = []

    def sink(envelope: dict) -> None:
        got.append(envelope)
        if not killed and envelope["type"] == "metrics" and "rollout/win_rate" in envelope["data"]["values"]:
            killed.append(_kill_worker("RolloutWorker"))

    with pytest.raises(WorkerLostError, match="max_worker_restarts=0"):
        train(cfg, sink, run_id=1)
    assert [e["data"]["status"] for e in got if e["type"] == "run.status"] == ["starting", "running", "failed"]
