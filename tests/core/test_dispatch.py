"""Transfer plans, shipments and group-scalar advantages of the Data Dispatcher (property-based where it matters)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.dispatch.group_stats import (batch_mean, grpo_from_table, merge, summarise, table_from_wire,
                                            table_to_wire)
from earl_core.dispatch.plan import GroupLayout, Sample, balance_bound, plan_transfers
from earl_core.dispatch.shipment import DispatchError, Shipment, assemble, metadata
from earl_core.rl.advantages import grpo_advantages


@st.composite
def layouts(draw: st.DrawFn) -> GroupLayout:
    dp = draw(st.integers(1, 4))
    tp = draw(st.sampled_from([1, 2, 4]))
    node_count = draw(st.integers(1, 4))
    nodes = tuple(f"n{draw(st.integers(0, node_count - 1))}" for _ in range(dp * tp))
    return GroupLayout(dp, tp, nodes)


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[Sample], GroupLayout, GroupLayout]:
    source, destination = draw(layouts()), draw(layouts())
    lengths = draw(st.lists(st.integers(1, 5000), min_size=1, max_size=40))
    ids = draw(st.permutations(range(len(lengths) * 3)))[: len(lengths)]
    samples = [Sample(i, n, draw(st.integers(0, source.dp - 1))) for i, n in zip(ids, lengths)]
    return samples, source, destination


@settings(max_examples=200, deadline=None)
@given(problems(), st.booleans())
def test_every_rank_gets_each_of_its_samples_exactly_once_in_order(problem, locality) -> None:
    samples, source, destination = problem
    plan = plan_transfers(samples, source, destination, locality=locality)
    # The groups' assignment partitions the samples.
    assigned = [s for group in plan.assignment for s in group]
    assert sorted(assigned) == sorted(s.id for s in samples)
    by_id = {s.id: s for s in samples}
    for rank in range(destination.ranks):
        got = sorted(t.sample for t in plan.transfers if t.receiver == rank)
        expected = plan.expected(rank)
        assert got == expected == sorted(expected)  # exactly once each, ascending
        for t in (t for t in plan.transfers if t.receiver == rank):
            # Only replicas of the sample's own source group send it.
            assert t.sender in source.group_ranks(by_id[t.sample].source)
            if t.route == "local":
                assert source.nodes[t.sender] == destination.nodes[rank]
            if t.route == "peer":
                # A peer route reads the copy of a rank of its own TP group on its own node.
                assert t.via in destination.group_ranks(rank // destination.tp)
                assert destination.nodes[t.via] == destination.nodes[rank]
                assert any(u.sample == t.sample and u.receiver == t.via and u.route == "network"
                           for u in plan.transfers)


@settings(max_examples=200, deadline=None)
@given(problems(), st.booleans())
def test_message_schedules_deliver_each_sample_exactly_once(problem, locality) -> None:
    """Replaying every rank's receive schedule with the senders' shipments gives each rank exactly its samples."""
    samples, source, destination = problem
    plan = plan_transfers(samples, source, destination, locality=locality)
    sent = {s: plan.sends(s) for s in range(source.ranks)}
    schedules = [plan.receive_schedule(r) for r in range(destination.ranks)]
    for rank, schedule in enumerate(schedules):
        direct = [sid for s in schedule.senders for sid in sent[s][rank]]
        assert schedule.senders == sorted(s for s in sent if rank in sent[s])  # a message from every sender, only
        relayed = []
        for via in schedule.vias:
            assert rank in schedules[via].forward and not schedules[via].vias  # relays relay first-hand copies
            relayed += [sid for s in schedules[via].forward[rank] for sid in sent[s][via]]
        assert sorted(direct + relayed) == plan.expected(rank)


@settings(max_examples=200, deadline=None)
@given(problems(), st.booleans())
def test_token_balance_stays_within_the_stated_bound(problem, locality) -> None:
    samples, source, destination = problem
    plan = plan_transfers(samples, source, destination, locality=locality)
    assert max(plan.group_tokens()) <= balance_bound([s.tokens for s in samples], destination.dp) + 1e-9


@settings(max_examples=200, deadline=None)
@given(problems())
def test_one_network_crossing_per_sample_and_destination_node(problem) -> None:
    samples, source, destination = problem
    plan = plan_transfers(samples, source, destination)
    crossings: dict[tuple[int, str], int] = {}
    for t in plan.transfers:
        if t.route == "network":
            assert source.nodes[t.sender] != destination.nodes[t.receiver]
            key = (t.sample, destination.nodes[t.receiver])
            crossings[key] = crossings.get(key, 0) + 1
    assert all(n == 1 for n in crossings.values())


def test_colocated_layouts_move_nothing_over_the_network_when_balance_allows() -> None:
    # One source and one destination worker per node (the paper's setting), equal loads: everything stays home.
    nodes = tuple(f"n{i}" for i in range(4))
    samples = [Sample(i, 1000, (i + 1) % 4) for i in range(16)]
    plan = plan_transfers(samples, GroupLayout(4, 1, nodes), GroupLayout(4, 1, nodes))
    assert {t.route for t in plan.transfers} == {"local"}
    assert plan.link_tokens() == {}
    # Without the locality preference the same balanced split crosses the network.
    blind = plan_transfers(samples, GroupLayout(4, 1, nodes), GroupLayout(4, 1, nodes), locality=False)
    assert any(t.route == "network" for t in blind.transfers)


def test_balance_is_by_tokens_not_by_count() -> None:
    # One long game and six short ones on two ranks: by count it would be 4/3, by tokens the long one is alone.
    samples = [Sample(0, 6000, 0)] + [Sample(i, 1000, 0) for i in range(1, 7)]
    plan = plan_transfers(samples, GroupLayout.on_one_node(1, 1), GroupLayout.on_one_node(2, 1))
    assert sorted(plan.group_tokens()) == [6000, 6000]


def test_tp_destination_gets_one_crossing_and_peer_reads() -> None:
    # Source on node a; destination one DP group of TP=2 on node b: the bytes cross once, the second rank reads
    # its TP peer's copy.
    plan = plan_transfers([Sample(7, 100, 0)], GroupLayout(1, 1, ("a",)), GroupLayout(1, 2, ("b", "b")))
    routes = sorted((t.receiver, t.route, t.via) for t in plan.transfers)
    assert routes == [(0, "network", None), (1, "peer", 0)]
    assert plan.link_tokens() == {"a": (100, 0), "b": (0, 100)}
    assert plan.sends(0) == {0: [7]}


def test_tp_source_sends_from_one_replica_and_spreads_over_replicas() -> None:
    # Source: one TP=2 group over nodes a and b; destination on node c. Each sample is sent by one replica, and the
    # two replicas share the work.
    samples = [Sample(i, 100, 0) for i in range(4)]
    plan = plan_transfers(samples, GroupLayout(1, 2, ("a", "b")), GroupLayout(1, 1, ("c",)))
    senders = [t.sender for t in plan.transfers]
    assert len(senders) == 4 and set(senders) == {0, 1}
    assert plan.link_tokens()["a"] == (200, 0) and plan.link_tokens()["b"] == (200, 0)


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        plan_transfers([Sample(1, 5, 0), Sample(1, 6, 0)], GroupLayout.on_one_node(1, 1), GroupLayout.on_one_node(1, 1))
    with pytest.raises(ValueError, match="source group"):
        plan_transfers([Sample(1, 5, 3)], GroupLayout.on_one_node(2, 1), GroupLayout.on_one_node(1, 1))
    with pytest.raises(ValueError, match="node names"):
        GroupLayout(2, 2, ("a",))


# ---- group-scalar advantages -------------------------------------------------------------------------------

rewards_st = st.lists(st.tuples(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 0.25, -0.3]), st.integers(0, 5)),
                      min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(rewards_st, st.integers(1, 5), st.booleans(), st.randoms(use_true_random=False))
def test_merged_worker_tables_give_the_centralised_advantages_bit_for_bit(data, workers, normalize, rnd) -> None:
    rewards = [r for r, _ in data]
    groups = [g for _, g in data]
    owner = [rnd.randrange(workers) for _ in data]
    tables = [summarise([r for r, o in zip(rewards, owner) if o == w], [g for g, o in zip(groups, owner) if o == w])
              for w in range(workers)]
    # Tables travel as plain integers (what crosses process boundaries) and merge in any order.
    rnd.shuffle(tables)
    merged = merge(table_from_wire(table_to_wire(t)) for t in tables)
    central = summarise(rewards, groups)
    assert merged == central
    # Each worker computes its own samples' advantages; together they are the centralised ones, exactly.
    local = torch.zeros(len(rewards))
    for w in range(workers):
        idx = [i for i, o in enumerate(owner) if o == w]
        if idx:
            local[idx] = grpo_from_table([rewards[i] for i in idx], [groups[i] for i in idx], merged,
                                         normalize_std=normalize)
    assert torch.equal(local, grpo_from_table(rewards, groups, central, normalize_std=normalize))
    # And they agree with the plain floating-point GRPO formula.
    assert torch.allclose(local, grpo_advantages(rewards, groups, normalize_std=normalize), atol=1e-5)
    assert batch_mean(merged) == pytest.approx(sum(rewards) / len(rewards))


def test_a_group_with_equal_rewards_gets_zero_and_a_missing_group_is_an_error() -> None:
    table = summarise([1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1])
    adv = grpo_from_table([1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], table)
    assert adv[:2].tolist() == [0.0, 0.0] and adv[2] < 0 < adv[3]
    with pytest.raises(KeyError, match="group 9"):
        grpo_from_table([1.0], [9], table)


# ---- shipments ---------------------------------------------------------------------------------------------

def _record(i: int, n: int) -> dict:
    rng = random.Random(i)
    return {"index": i, "group": i // 2, "reward": rng.choice([-1.0, 1.0]), "agent_side": 1, "opponent": "random",
            "token_ids": [rng.randrange(5000) for _ in range(n)], "action_mask": [rng.randrange(2) for _ in range(n)],
            "logprobs": [0.0] * n, "moves": [{"text": "x"}], "result": "win", "turn_context": [n]}


def test_shipments_round_trip_and_assemble_in_the_expected_order() -> None:
    records = [_record(i, n) for i, n in [(3, 5), (1, 9), (8, 2)]]
    a, b = Shipment.pack(records[:2]), Shipment.pack(records[2:])
    got, adv = assemble([b, a], expected=[1, 3, 8])
    assert [r["index"] for r in got] == [1, 3, 8] and adv is None
    for r in got:
        src = next(x for x in records if x["index"] == r["index"])
        assert r["token_ids"] == src["token_ids"] and r["action_mask"] == src["action_mask"]
        assert (r["group"], r["reward"]) == (src["group"], src["reward"])
    assert a.field_bytes()["token_ids"] == 14 * 4 + (2 + 2 + 3) * 8
    _, adv = assemble([Shipment.pack(records, [0.5, -1.0, 2.0])], expected=[8, 1, 3])
    assert adv == [2.0, -1.0, 0.5]


def test_subset_and_concat_keep_every_field() -> None:
    records = [_record(i, n) for i, n in [(3, 5), (1, 9), (8, 2), (4, 7)]]
    whole = Shipment.concat([Shipment.pack(records[:2], [0.1, 0.2]), Shipment.pack(records[2:], [0.3, 0.4])])
    part = whole.subset([8, 3])
    got, adv = assemble([part], expected=[8, 3])
    assert [r["token_ids"] for r in got] == [records[2]["token_ids"], records[0]["token_ids"]]
    assert [r["action_mask"] for r in got] == [records[2]["action_mask"], records[0]["action_mask"]]
    assert adv == pytest.approx([0.3, 0.1]) and whole.nbytes == Shipment.pack(records, [0] * 4).nbytes
    assert len(whole.subset([])) == 0


def test_assemble_refuses_duplicates_and_gaps() -> None:
    records = [_record(i, 3) for i in range(3)]
    with pytest.raises(DispatchError, match="twice"):
        assemble([Shipment.pack(records[:2]), Shipment.pack(records[1:])], expected=[0, 1, 2])
    with pytest.raises(DispatchError, match=r"missing: \[2\]"):
        assemble([Shipment.pack(records[:2])], expected=[0, 1, 2])
    with pytest.raises(DispatchError, match=r"not expected: \[2\]"):
        assemble([Shipment.pack(records)], expected=[0, 1])


def test_metadata_leaves_the_per_token_fields_behind() -> None:
    meta = metadata(_record(4, 50))
    assert "token_ids" not in meta and "action_mask" not in meta and "logprobs" not in meta
    assert meta["tokens"] == 50 and meta["moves"] == []
    assert metadata(_record(4, 50), keep_moves=True)["moves"] == [{"text": "x"}]
