"""The Data Dispatcher on a real two-node Ray cluster (two raylets, each with its own object store): games played on
one node reach the trainer ranks on the other; both modes (the layout-aware one over both transports) feed identical
inputs and advantages and train to the same weights; only the centralized mode moves bulk bytes through the driver;
with a TP=2 trainer the second rank of the group gets its copy relayed by its peer on the same node.

Ray advertises the machine's interface address even when told 127.0.0.1, so the cluster runs in a network namespace
of its own (``unshare -n``) where loopback is the only interface (two_node_dispatch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.isolated import needs_isolation, run_isolated

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("two_node_dispatch.py")


@needs_isolation
def test_two_node_dispatch_both_modes_train_identically(protocol_model: Path) -> None:
    out = run_isolated(SCRIPT, protocol_model)
    records = out["records"]
    assert out["cluster_nodes"] == 2
    assert all("token_ids" not in r for r in records), "the driver got per-token fields"
    for name, transport in (("grpo", "object_store"), ("reinforce", "object_store"), ("grpo", "collective"),
                            ("reinforce", "collective")):
        central, aware = out[name]["centralized"], out[name][transport]
        c, a = central["report"], aware["report"]
        # The engines sit on one node, the trainer ranks on the other.
        assert len(out["engine_nodes"]) == 1 and central["nodes"] == aware["nodes"]
        assert not set(aware["nodes"]) & set(out["engine_nodes"])
        # Every game crossed the network once, straight from its engine, in layout-aware mode.
        assert a["network_tokens"] == sum(r["tokens"] for r in records)
        assert a["bytes_via_driver"] == 0 and a["bytes_moved"] > 0
        assert c["bytes_via_driver"] == c["bytes_moved"] > a["bytes_moved"]
        assert a["fields"]["token_ids"] > 0 and "advantages" not in a["fields"] and a["fields"]["old_logprobs"] == 0
        assert c["fields"]["advantages"] > 0
        # The same advantage for every game, bit for bit.
        assert a["advantages"] == c["advantages"] and len(a["advantages"]) == len(records)
        if name == "reinforce":  # r - 0.5: never zero, so this step really moves the weights
            assert all(v == pytest.approx(r["reward"] - 0.5) for r in records
                       for k, v in a["advantages"].items() if int(k) == r["index"])
            assert aware["weights_hash"] != out["initial_hash"]
        # Same inputs, same step: the same losses and the same weights.
        assert a_metrics_equal(central["metrics"], aware["metrics"])
        assert central["weights_hash"] == aware["weights_hash"]
    central, relayed = out["tp2"]["centralized"], out["tp2"]["collective"]
    assert relayed["routes"] == ["network", "peer"] and len(relayed["nodes"]) == 1
    assert relayed["report"]["network_tokens"] == sum(r["tokens"] for r in records)  # one crossing per game
    assert relayed["report"]["advantages"] == central["report"]["advantages"]
    assert a_metrics_equal(central["metrics"], relayed["metrics"])
    assert central["weights_hash"] == relayed["weights_hash"]


def a_metrics_equal(x: dict, y: dict) -> bool:
    keys = ("losses/policy_loss", "losses/grad_norm", "perf/train_tokens")
    return all(x[k] == y[k] for k in keys)
