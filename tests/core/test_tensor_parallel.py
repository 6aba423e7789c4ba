"""Tensor parallelism with torch.distributed.tensor.parallel: TP=2 equals TP=1, and layout switches are bit-exact."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig

from earl_core.errors import ConfigError
from earl_core.parallel.tensor_parallel import check_tp_degree

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(module: str, model: Path, out: Path, *extra: str, world: int = 2, timeout: float = 300) -> dict:
    """Run ``module`` as ranks 0..world-1 of a gloo group (real processes) on ``model``; rank 0's JSON result."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", module, "--rank", str(r), "--world", str(world), *extra,
                               "--port", str(port), "--model", str(model), "--out", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def tp2(protocol_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two real processes in a gloo group run tests.core.tp_ranks on the session's tiny model."""
    return run_ranks("tests.core.tp_ranks", protocol_model, tmp_path_factory.mktemp("tp") / "result.json")


def test_clipping_takes_the_norm_of_full_gradients_whether_partial_sharded_or_replicated(tp2: dict) -> None:
    assert tp2["clip_norm"] == pytest.approx(tp2["clip_norm_expected"], rel=1e-6)
    assert tp2["clipped_max_diff"] < 1e-6


def test_tp2_forward_and_gradients_equal_tp1(tp2: dict) -> None:
    assert tp2["sharded_params"] > 0 and tp2["local_numel"] < tp2["full_numel"]  # really split
    assert tp2["logits_max_diff"] < 1e-4
    assert tp2["loss_diff"] < 1e-5
    assert tp2["grads_compared"] > 10
    assert tp2["grad_max_diff"] <= 1e-4 * max(1.0, tp2["grad_scale"])


def test_layout_switch_round_trip_is_bit_exact(tp2: dict) -> None:
    assert tp2["full_out_equals_original"]
    assert tp2["round_trip_bit_exact"]
    assert tp2["tp1_after_round_trip_bit_exact"]


def test_tp_degree_must_divide_heads_and_mlp(protocol_model: Path) -> None:
    config = AutoConfig.from_pretrained(protocol_model)
    check_tp_degree(config, 2)
    with pytest.raises(ConfigError, match=r"layout.tp: 3 does not divide num_attention_heads=4 \(allowed: 1, 2\)"):
        check_tp_degree(config, 3)
