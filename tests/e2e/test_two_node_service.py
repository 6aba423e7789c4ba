"""The service on a real two-node Ray cluster (two raylets in a network namespace of the test's own, on loopback): a
run's gang is admitted across both nodes, and Ray runs its workers on both (two_node_service.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.isolated import needs_isolation, run_isolated

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("two_node_service.py")


@needs_isolation
def test_a_run_is_admitted_and_trained_across_two_nodes(tmp_path: Path) -> None:
    out = run_isolated(SCRIPT, tmp_path)
    assert out["status"] == "succeeded" and out["iterations_done"] == 1, out["error"]
    assert len(out["cluster_nodes"]) == 2
    # The scheduler placed the 3-CPU gang across both 2-CPU nodes, and gave the room back when the run ended.
    assert sorted(set(out["placement"])) == out["cluster_nodes"] and len(out["placement"]) == 3
    assert out["allocation_end"] == "succeeded"
    # Ray ran the workers on both nodes.
    ran_on = {node for nodes in out["worker_nodes"].values() for node in nodes}
    assert ran_on == set(out["cluster_nodes"]), out["worker_nodes"]
