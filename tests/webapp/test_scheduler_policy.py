"""Scheduling policy: refusal, queue order, fair share, gang admission, quotas, EASY backfill, preemption, waiting."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.errors import ConfigError
from webapp.scheduling.fairness import UsageInterval, dominant_share, jain_index, queue_order, usage_in_window
from webapp.scheduling.policy import Plan, Reservation, SchedulerState, plan
from webapp.scheduling.resources import Node, Resources, SchedulingError, place_gang, total_of
from webapp.scheduling.workload import (PRIORITIES, RunningRun, RunRequest, TeamQuota, check_priority, priority_rank,
                                        refusal)

GIB = 1024**3


def gpus(n: int, *, cpus: float = 1) -> Resources:
    return Resources(cpus=cpus, gpus=n)


def cpus(n: float) -> Resources:
    return Resources(cpus=n, gpus=0)


def box(*, gpus: int, cpus: float = 16, memory_gib: int = 0) -> Resources:
    return Resources(cpus=cpus, gpus=gpus, memory_bytes=memory_gib * GIB)


def queued(run_id: int, team: str, *bundles: Resources, at: float = 0.0, priority: str = "normal",
           duration: float | None = None, preemptible: bool = False) -> RunRequest:
    return RunRequest(run_id=run_id, team=team, bundles=bundles, submitted_at=at, priority=priority,
                      expected_duration_s=duration, preemptible=preemptible)


def running(run_id: int, team: str, *bundles: Resources, on: str | tuple[str, ...], started: float = 0.0,
            ends: float | None = None, priority: str = "normal", preemptible: bool = False) -> RunningRun:
    placement = (on,) * len(bundles) if isinstance(on, str) else on
    return RunningRun(run_id=run_id, team=team, bundles=bundles, placement=placement, started_at=started,
                      expected_end=ends, priority=priority, preemptible=preemptible)


def snapshot(totals: Mapping[str, Resources], runs: Iterable[RunningRun]) -> tuple[Node, ...]:
    """Nodes whose free resources are their totals less what the running runs hold on them."""
    free = dict(totals)
    for run in runs:
        for bundle, node in zip(run.bundles, run.placement, strict=True):
            free[node] = free[node] - bundle
    return tuple(Node(name=name, total=total, free=free[name]) for name, total in totals.items())


def state(totals: Mapping[str, Resources], *, queue: Iterable[RunRequest] = (), runs: Iterable[RunningRun] = (),
          quotas: Mapping[str, TeamQuota] | None = None, usage: Mapping[str, float] | None = None) -> SchedulerState:
    runs = tuple(runs)
    return SchedulerState(nodes=snapshot(totals, runs), queued=tuple(queue), running=runs, quotas=quotas or {},
                          usage=usage or {})


def admitted(decision: Plan) -> list[int]:
    return [a.run_id for a in decision.admit]


# ---- resources and gang placement ----------------------------------------------------------------------

def test_resources_add_subtract_and_fit() -> None:
    node = box(gpus=4, cpus=16, memory_gib=64)
    bundle = Resources(cpus=2.5, gpus=1, memory_bytes=8 * GIB)
    assert (node - bundle) + bundle == node
    assert bundle.fits_in(node) and not node.fits_in(bundle)
    # Fractional CPUs round to Ray's 1/10000 grain, so taking 0.1 then 0.2 out of 0.3 leaves exactly nothing.
    assert cpus(0.3) - cpus(0.1) - cpus(0.2) == Resources.nothing()
    with pytest.raises(ValueError, match="cannot take"):
        cpus(1) - gpus(1)


def test_resources_refuse_negative_or_fractional_gpus_naming_the_field() -> None:
    with pytest.raises(SchedulingError) as negative:
        Resources(cpus=1, gpus=-1)
    assert negative.value.field == "gpus" and "integers >= 0" in str(negative.value)
    with pytest.raises(ConfigError) as fractional:
        Resources(cpus=1, gpus=1.5)  # type: ignore[arg-type]
    assert fractional.value.field == "gpus"
    with pytest.raises(SchedulingError, match="cpus"):
        Resources(cpus=-0.5, gpus=0)


def test_pack_places_largest_bundles_first_on_the_first_node_with_room() -> None:
    nodes = [Node.idle("n1", box(gpus=4)), Node.idle("n2", box(gpus=4))]
    # Sorted 3, 2, 2, 1: the 3 takes n1, both 2s go to n2, the 1 fills n1.
    assert place_gang([gpus(1), gpus(3), gpus(2), gpus(2)], nodes) == ("n1", "n1", "n2", "n2")


def test_a_gang_that_fits_in_total_but_not_bundle_by_bundle_is_not_placed() -> None:
    nodes = [Node(name="n1", total=box(gpus=4), free=box(gpus=2)), Node(name="n2", total=box(gpus=4), free=box(gpus=2))]
    assert place_gang([gpus(3), gpus(1)], nodes) is None
    assert place_gang([gpus(2), gpus(2)], nodes) == ("n1", "n2")


def test_a_node_cannot_have_more_free_than_it_has() -> None:
    with pytest.raises(SchedulingError) as err:
        Node(name="n1", total=box(gpus=2), free=box(gpus=4))
    assert err.value.field == "free"


# ---- refusal at submit time ----------------------------------------------------------------------------

FOUR_BY_FOUR = [Node.idle(f"n{i}", box(gpus=4, cpus=16, memory_gib=64)) for i in range(1, 5)]


def test_a_bundle_bigger_than_every_node_is_refused() -> None:
    vision = queued(1, "vision", gpus(1), gpus(1), gpus(8))
    got = refusal(vision, FOUR_BY_FOUR, quota=None, queued_count=0)
    assert got is not None
    assert (got.code, got.field, got.limit) == ("bundle_too_big", "bundles[2].gpus", 4)
    assert got.message == "bundle 2 asks 8 GPUs; the largest node has 4"
    assert got.as_error().field == "bundles[2].gpus"


def test_a_bundle_needing_a_mix_no_single_node_has_is_refused() -> None:
    nodes = [Node.idle("gpu-box", box(gpus=4, cpus=8)), Node.idle("cpu-box", box(gpus=0, cpus=64))]
    got = refusal(queued(1, "speech", gpus(2, cpus=32)), nodes, quota=None, queued_count=0)
    assert got is not None and got.field == "bundles[0]"
    assert "no single node" in got.message and "2 GPUs, 32 CPUs" in got.message


def test_memory_is_refused_in_gib() -> None:
    got = refusal(queued(1, "speech", Resources(cpus=1, gpus=0, memory_bytes=128 * GIB)), FOUR_BY_FOUR, quota=None,
                  queued_count=0)
    assert got is not None and got.message == "bundle 0 asks 128 GiB memory; the largest node has 64 GiB memory"


def test_a_total_bigger_than_the_cluster_is_refused() -> None:
    robotics = queued(1, "robotics", *[gpus(4)] * 5)
    got = refusal(robotics, FOUR_BY_FOUR, quota=None, queued_count=0)
    assert got is not None and (got.code, got.field, got.limit) == ("cluster_too_small", "gpus", 16)
    assert got.message == "asks 20 GPUs in all; the whole cluster has 16 GPUs"


def test_a_gang_that_cannot_be_placed_even_on_the_idle_cluster_is_refused() -> None:
    nodes = [Node.idle("n1", box(gpus=4)), Node.idle("n2", box(gpus=4))]
    # 3 + 3 + 2 = 8 GPUs = the cluster, but the two 3s leave one GPU per node for the 2.
    got = refusal(queued(1, "vision", gpus(3), gpus(3), gpus(2)), nodes, quota=None, queued_count=0)
    assert got is not None and (got.code, got.field) == ("cluster_too_small", "bundles")
    assert "cannot all be placed at once" in got.message


def test_a_total_bigger_than_the_team_quota_is_refused() -> None:
    vision = queued(1, "vision", gpus(4), gpus(4), gpus(4))
    got = refusal(vision, FOUR_BY_FOUR, quota=TeamQuota(max_gpus=8), queued_count=0)
    assert got is not None and (got.code, got.field, got.limit) == ("team_quota", "gpus", 8)
    assert got.message == "asks 12 GPUs; team 'vision' may use at most 8 at once"
    cpu_heavy = refusal(queued(2, "speech", cpus(12), cpus(12)), FOUR_BY_FOUR, quota=TeamQuota(max_cpus=16),
                        queued_count=0)
    assert cpu_heavy is not None and cpu_heavy.message == "asks 24 CPUs; team 'speech' may use at most 16 at once"


def test_too_many_queued_runs_of_a_team_is_refused() -> None:
    quota = TeamQuota(max_queued=5)
    vision = queued(1, "vision", gpus(1))
    assert refusal(vision, FOUR_BY_FOUR, quota=quota, queued_count=4) is None
    got = refusal(vision, FOUR_BY_FOUR, quota=quota, queued_count=5)
    assert got is not None and (got.code, got.field, got.limit) == ("queue_full", "queued", 5)
    assert got.message == "team 'vision' already has 5 queued runs; at most 5 may wait at once"


def test_a_run_that_can_start_some_day_is_not_refused() -> None:
    assert refusal(queued(1, "vision", *[gpus(4)] * 4), FOUR_BY_FOUR, quota=None, queued_count=100) is None
    assert refusal(queued(2, "vision", gpus(4)), FOUR_BY_FOUR, quota=TeamQuota(), queued_count=100) is None


def test_quota_limits_are_validated_naming_the_field() -> None:
    with pytest.raises(SchedulingError) as err:
        TeamQuota(max_gpus=-1)
    assert err.value.field == "max_gpus"
    with pytest.raises(SchedulingError, match="max_queued"):
        TeamQuota(max_queued=2.5)  # type: ignore[arg-type]


# ---- priority classes ------------------------------------------------------------------------------------

def test_priority_classes_are_ordered() -> None:
    assert [priority_rank(p) for p in ("low", "normal", "high", "urgent")] == [0, 1, 2, 3]


def test_urgent_is_for_team_admins_only() -> None:
    assert check_priority("urgent", is_team_admin=True) == "urgent"
    assert check_priority("high", is_team_admin=False) == "high"
    with pytest.raises(SchedulingError) as member:
        check_priority("urgent", is_team_admin=False)
    assert (member.value.field, member.value.allowed) == ("priority", "low, normal, high")
    assert "team admins" in str(member.value)


def test_an_unknown_priority_names_the_allowed_values() -> None:
    with pytest.raises(ConfigError) as err:
        check_priority("asap", is_team_admin=True)
    assert (err.value.field, err.value.allowed) == ("priority", "low, normal, high, urgent")
    with pytest.raises(SchedulingError, match="priority"):
        queued(1, "vision", gpus(1), priority="asap")


# ---- fair share ------------------------------------------------------------------------------------------

CLUSTER_8_GPUS_64_CPUS = box(gpus=8, cpus=64)


def test_usage_is_clipped_to_the_window() -> None:
    intervals = [
        UsageInterval(team="vision", start=850, end=950, resources=gpus(4)),  # half inside: 50 s at half the GPUs
        UsageInterval(team="vision", start=0, end=800, resources=gpus(8)),  # over before the window opened
        UsageInterval(team="speech", start=980, end=None, resources=cpus(16)),  # still running: 20 s, a quarter
        UsageInterval(team="robotics", start=990, end=1200, resources=gpus(2)),  # counted up to now only
    ]
    usage = usage_in_window(intervals, 1000, window_s=100, cluster_total=CLUSTER_8_GPUS_64_CPUS)
    assert usage == {"vision": pytest.approx(25.0), "speech": pytest.approx(5.0), "robotics": pytest.approx(2.5)}


def test_gpu_seconds_and_cpu_seconds_compare_through_the_dominant_share() -> None:
    intervals = [UsageInterval(team="vision", start=0, end=100, resources=gpus(4, cpus=4)),
                 UsageInterval(team="speech", start=0, end=100, resources=cpus(32))]
    usage = usage_in_window(intervals, 100, window_s=3600, cluster_total=CLUSTER_8_GPUS_64_CPUS)
    assert usage["vision"] == pytest.approx(usage["speech"]) == pytest.approx(50.0)
    # A GPU run that takes most of the CPUs is charged for the CPUs.
    assert dominant_share(gpus(1, cpus=48), CLUSTER_8_GPUS_64_CPUS) == pytest.approx(0.75)
    assert dominant_share(cpus(8), Resources(cpus=16, gpus=0)) == pytest.approx(0.5)


def test_the_window_must_be_positive() -> None:
    with pytest.raises(SchedulingError) as err:
        usage_in_window([], 10, window_s=0, cluster_total=CLUSTER_8_GPUS_64_CPUS)
    assert err.value.field == "window_s"


def test_jain_index() -> None:
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([1.0, 2.0]) == pytest.approx(9 / 10)
    assert jain_index([0.0, 0.0]) == 1.0
    with pytest.raises(SchedulingError):
        jain_index([])
    with pytest.raises(SchedulingError):
        jain_index([1.0, -1.0])


# ---- queue order -----------------------------------------------------------------------------------------

def test_priority_beats_fair_share() -> None:
    heavy_vision = queued(1, "vision", gpus(1), priority="high", at=5)
    light_speech = queued(2, "speech", gpus(1), at=0)
    order = queue_order([light_speech, heavy_vision], {"vision": 1000.0, "speech": 0.0})
    assert order == [heavy_vision, light_speech]


def test_fair_share_beats_age() -> None:
    old_vision = queued(1, "vision", gpus(1), at=0)
    new_speech = queued(2, "speech", gpus(1), at=50)
    assert queue_order([old_vision, new_speech], {"vision": 500.0, "speech": 10.0}) == [new_speech, old_vision]
    # A team that never ran anything counts as having used nothing.
    assert queue_order([old_vision, new_speech], {"vision": 500.0}) == [new_speech, old_vision]


def test_age_then_run_id_break_ties() -> None:
    first = queued(7, "robotics", gpus(1), at=1)
    second = queued(3, "robotics", gpus(1), at=2)
    twin = queued(5, "robotics", gpus(1), at=2)
    assert queue_order([second, twin, first], {}) == [first, second, twin]


# ---- admission ---------------------------------------------------------------------------------------------

TWO_BOXES = {"n1": box(gpus=4), "n2": box(gpus=4)}


def test_runs_that_fit_start_at_once() -> None:
    decision = plan(state(TWO_BOXES, queue=[queued(1, "vision", gpus(2), gpus(2)), queued(2, "speech", gpus(4), at=1)]),
                    now=0)
    assert [(a.run_id, a.placement, a.backfilled) for a in decision.admit] == [(1, ("n1", "n1"), False),
                                                                                 (2, ("n2",), False)]
    assert decision.waiting == {} and decision.reservation is None and decision.preempt == ()


def test_a_gang_whose_bundles_do_not_all_fit_is_not_started_even_if_the_total_would() -> None:
    speech_jobs = [running(10, "speech", gpus(2), on="n1", ends=100), running(11, "speech", gpus(2), on="n2", ends=200)]
    vision = queued(1, "vision", gpus(3), gpus(1), duration=50)
    decision = plan(state(TWO_BOXES, queue=[vision], runs=speech_jobs), now=0)
    assert admitted(decision) == []
    assert decision.waiting[1].reason == "capacity"
    assert decision.reservation == Reservation(run_id=1, start=100)


def test_quota_is_counted_within_one_pass_and_a_blocked_team_does_not_block_others() -> None:
    quotas = {"vision": TeamQuota(max_gpus=4)}
    queue = [queued(1, "vision", gpus(2), at=0, duration=100), queued(2, "vision", gpus(2), at=1, duration=200),
             queued(3, "vision", gpus(2), at=2, duration=50), queued(4, "speech", gpus(2), at=3, duration=10)]
    decision = plan(state(TWO_BOXES, queue=queue, quotas=quotas), now=1000)
    assert admitted(decision) == [1, 2, 4]
    third = decision.waiting[3]
    assert (third.position, third.reason) == (1, "quota")
    assert third.message == ("team 'vision' already uses 4 GPUs and may use at most 4 GPUs at once; "
                             "this run asks 2 GPUs")
    assert third.estimated_start == 1100  # when vision's first run is expected to end


def test_quota_counts_what_the_team_already_runs() -> None:
    quotas = {"vision": TeamQuota(max_gpus=4, max_cpus=8)}
    runs = [running(10, "vision", gpus(3), on="n1", ends=None)]
    decision = plan(state(TWO_BOXES, queue=[queued(1, "vision", gpus(2))], runs=runs, quotas=quotas), now=0)
    assert admitted(decision) == [] and decision.waiting[1].reason == "quota"
    assert decision.waiting[1].estimated_start is None  # the run it waits for has no expected end
    cpu_bound = plan(state(TWO_BOXES, queue=[queued(2, "vision", gpus(0, cpus=8))], runs=runs, quotas=quotas), now=0)
    assert "CPUs" in cpu_bound.waiting[2].message


# ---- EASY backfill -----------------------------------------------------------------------------------------

def backfill_scene(now: float = 10) -> Plan:
    """Speech holds 2 GPUs of n1 until t=100 and all of n2 until t=300; vision's 4-GPU run waits first in line."""
    runs = [running(10, "speech", gpus(2), on="n1", ends=100), running(11, "speech", gpus(4), on="n2", ends=300)]
    queue = [
        queued(1, "vision", gpus(4), at=1, duration=200),  # the head: fits on n1 once run 10 ends at t=100
        queued(2, "robotics", gpus(2), at=2, duration=500),  # fits now, but would hold n1's GPUs past t=100
        queued(3, "robotics", gpus(2), at=3, duration=50),  # fits now and ends by t=60: backfilled
        queued(4, "speech", cpus(8), at=4, duration=1000),  # long, but uses CPUs the head leaves over
        queued(5, "speech", cpus(1), at=5),  # unknown duration, but fits in what the head leaves over
        queued(6, "speech", gpus(1), at=2.5),  # unknown duration: fits now, but the head leaves no GPU over
    ]
    return plan(state(TWO_BOXES, queue=queue, runs=runs), now=now)


def test_a_backfill_that_ends_before_the_reservation_starts_one_that_would_delay_the_head_does_not() -> None:
    decision = backfill_scene()
    assert decision.reservation == Reservation(run_id=1, start=100)
    assert [(a.run_id, a.backfilled) for a in decision.admit] == [(3, True), (4, True), (5, True)]
    assert decision.admit[0].placement == ("n1",)
    assert {run_id: (w.position, w.reason) for run_id, w in decision.waiting.items()} == {
        1: (1, "capacity"), 2: (2, "reservation"), 6: (3, "reservation")}
    assert "first in line" in decision.waiting[1].message and "90 s" in decision.waiting[1].message
    # Run 2 is robotics', the head vision's: the message does not name another team's run.
    assert "another team's run" in decision.waiting[2].message and "run 1" not in decision.waiting[2].message
    assert "duration is unknown" in decision.waiting[6].message and "leaves over" in decision.waiting[6].message


def test_estimated_starts_replay_the_policy() -> None:
    waiting = backfill_scene().waiting
    # The head starts when run 10 ends; run 2 needs the GPUs the head and run 11 give back at t=300, and run 6,
    # no longer behind a reservation then, starts with it.
    assert {run_id: w.estimated_start for run_id, w in waiting.items()} == {1: 100, 2: 300, 6: 300}


@pytest.mark.parametrize(("duration", "starts"), [(90, True), (91, False)])
def test_backfill_boundary_is_the_reserved_start(duration: float, starts: bool) -> None:
    runs = [running(10, "speech", gpus(2), on="n1", ends=100), running(11, "speech", gpus(4), on="n2", ends=300)]
    queue = [queued(1, "vision", gpus(4), at=1, duration=200), queued(2, "robotics", gpus(2), at=2, duration=duration)]
    decision = plan(state(TWO_BOXES, queue=queue, runs=runs), now=10)
    assert (admitted(decision) == [2]) is starts


def test_long_backfills_share_what_the_head_leaves_over() -> None:
    runs = [running(10, "speech", gpus(2), on="n1", ends=100)]
    queue = [queued(1, "vision", gpus(4, cpus=8), at=1, duration=10),  # at t=100 it takes 8 of n1's 16 CPUs
             queued(2, "robotics", cpus(5), at=2, duration=500),
             queued(3, "robotics", cpus(5), at=3, duration=500)]  # free now, but 5 + 5 > the 8 left over
    decision = plan(state({"n1": box(gpus=4, cpus=16)}, queue=queue, runs=runs), now=0)
    assert admitted(decision) == [2]
    assert decision.waiting[3].reason == "reservation"
    assert decision.waiting[3].estimated_start == 110


def test_a_teammate_behind_the_head_may_not_take_the_quota_the_head_needs() -> None:
    quotas = {"vision": TeamQuota(max_gpus=6)}
    runs = [running(10, "speech", gpus(4), on="n1", ends=100), running(11, "vision", gpus(2), on="n2", ends=1000)]
    queue = [queued(1, "vision", gpus(4), at=1, duration=10),  # head: n1 frees at t=100
             queued(2, "vision", gpus(2, cpus=0), at=2, duration=500)]  # room on n2 and in quota now, not at t=100
    decision = plan(state(TWO_BOXES, queue=queue, runs=runs, quotas=quotas), now=0)
    assert admitted(decision) == []
    assert decision.waiting[2].reason == "reservation" and "quota" in decision.waiting[2].message


def test_nothing_is_backfilled_when_the_heads_start_cannot_be_predicted() -> None:
    runs = [running(10, "speech", gpus(4), on="n1"), running(11, "speech", gpus(3), on="n2")]  # no expected ends
    queue = [queued(1, "vision", gpus(4), at=1, duration=10), queued(2, "robotics", gpus(1), at=2, duration=1)]
    decision = plan(state(TWO_BOXES, queue=queue, runs=runs), now=0)
    assert admitted(decision) == []
    assert decision.reservation == Reservation(run_id=1, start=None)
    assert decision.waiting[1].estimated_start is None and decision.waiting[2].reason == "reservation"


def test_every_waiting_reason_with_positions_and_estimates() -> None:
    totals = {"n1": box(gpus=4, cpus=8), "n2": box(gpus=0, cpus=4)}
    runs = [running(10, "robotics", gpus(4), on="n1", ends=100)]
    queue = [
        queued(1, "speech", gpus(4, cpus=8), at=1, priority="high", duration=50),  # capacity: first in line
        queued(2, "speech", gpus(2), at=5, priority="high", duration=30),  # capacity: same class as the head
        queued(3, "vision", gpus(2), at=2, duration=10),  # priority: a higher class waits ahead
        queued(4, "robotics", gpus(1), at=3, duration=10),  # quota: robotics holds all 4 of its GPUs
        queued(5, "vision", cpus(6), at=4),  # reservation: n1 has room now, but its length is unknown and the head
        # leaves only n2's 4 CPUs over
    ]
    decision = plan(state(totals, queue=queue, runs=runs, quotas={"robotics": TeamQuota(max_gpus=4)}), now=0)
    assert admitted(decision) == [] and decision.preempt == ()  # run 10 is not preemptible
    summary = {run_id: (w.position, w.reason, w.estimated_start) for run_id, w in decision.waiting.items()}
    # t=100: run 10 ends, the head starts; t=150: it ends, runs 2 and 3 start and run 5, behind no reservation any
    # more, with them; t=160: run 3 ends, run 4 starts.
    assert summary == {1: (1, "capacity", 100), 2: (2, "capacity", 150), 3: (3, "priority", 150),
                       4: (4, "quota", 160), 5: (5, "reservation", 150)}
    assert "high" in decision.waiting[3].message


# ---- preemption ---------------------------------------------------------------------------------------------

def preemption_scene(head: RunRequest, *extra: RunningRun) -> Plan:
    runs = [
        running(10, "vision", gpus(2), on="n1", started=0, ends=1000, priority="low", preemptible=True),
        running(11, "vision", gpus(2), on="n1", started=50, ends=1000, priority="low", preemptible=True),
        running(12, "speech", cpus(4), on="n1", started=60, ends=1000, priority="low", preemptible=True),
        *extra,
    ]
    return plan(state({"n1": box(gpus=4)}, queue=[head], runs=runs), now=100)


def test_an_urgent_head_preempts_the_most_recently_started_low_run_it_needs() -> None:
    decision = preemption_scene(queued(1, "robotics", gpus(2), priority="urgent", duration=10))
    # Run 12 started last but holds no GPU, so stopping it would not help: only run 11 is stopped.
    assert decision.preempt == (11,)
    assert admitted(decision) == []
    head = decision.waiting[1]
    assert (head.reason, head.estimated_start) == ("capacity", 100) and "stopping" in head.message
    assert decision.reservation == Reservation(run_id=1, start=100)


def test_the_victim_set_grows_only_until_the_head_fits() -> None:
    decision = preemption_scene(queued(1, "robotics", gpus(4), priority="high", duration=10))
    assert decision.preempt == (11, 10)


def test_lowest_class_is_preempted_first() -> None:
    normal = running(13, "speech", gpus(0, cpus=1), on="n1", started=90, ends=1000, preemptible=True)
    decision = preemption_scene(queued(1, "robotics", gpus(2), priority="urgent"), normal)
    assert decision.preempt == (11,)


@pytest.mark.parametrize("priority", ["normal", "low"])
def test_only_high_and_urgent_heads_preempt(priority: str) -> None:
    runs = [running(10, "vision", gpus(4), on="n1", ends=1000, priority="low", preemptible=True)]
    decision = plan(state({"n1": box(gpus=4)}, queue=[queued(1, "robotics", gpus(2), priority=priority)], runs=runs),
                    now=0)
    assert decision.preempt == () and decision.reservation == Reservation(run_id=1, start=1000)


def test_non_preemptible_and_same_class_runs_are_never_stopped() -> None:
    runs = [running(10, "vision", gpus(2), on="n1", ends=1000, priority="low", preemptible=False),
            running(11, "speech", gpus(2), on="n1", ends=2000, priority="high", preemptible=True)]
    decision = plan(state({"n1": box(gpus=4)}, queue=[queued(1, "robotics", gpus(2), priority="high")], runs=runs),
                    now=0)
    assert decision.preempt == ()
    assert decision.reservation == Reservation(run_id=1, start=1000)


def test_no_run_is_stopped_when_stopping_every_candidate_would_still_not_seat_the_head() -> None:
    runs = [running(10, "vision", gpus(1), on="n1", ends=1000, priority="low", preemptible=True),
            running(11, "speech", gpus(3), on="n1", ends=500, priority="normal", preemptible=False)]
    decision = plan(state({"n1": box(gpus=4)}, queue=[queued(1, "robotics", gpus(4), priority="urgent")], runs=runs),
                    now=0)
    assert decision.preempt == () and decision.reservation == Reservation(run_id=1, start=1000)


def test_only_what_the_head_leaves_over_is_backfilled_while_victims_stop() -> None:
    totals = {"n1": box(gpus=4, cpus=16), "n2": box(gpus=2, cpus=16)}
    runs = [running(10, "vision", gpus(2), on="n1", ends=1000, priority="low", preemptible=True),
            running(11, "vision", gpus(2), on="n2", ends=2000)]
    queue = [queued(1, "robotics", gpus(4), priority="urgent", duration=100),  # needs n1's free GPUs and run 10's
             queued(2, "speech", cpus(4), at=1, duration=5),  # the head leaves n1's CPUs over
             queued(3, "speech", gpus(1), at=2, duration=5)]  # fits now, on GPUs the head is about to take
    decision = plan(state(totals, queue=queue, runs=runs), now=0)
    assert decision.preempt == (10,)
    assert admitted(decision) == [2]
    assert decision.waiting[3].reason == "reservation"


# ---- purity ------------------------------------------------------------------------------------------------

def test_the_policy_imports_no_django() -> None:
    code = ("import sys, webapp.scheduling.policy, webapp.scheduling.fairness; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'celery', 'rest_framework'}); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- simulated clock: no starvation, quotas and capacity hold -------------------------------------------------

TEAMS = ("vision", "speech", "robotics")


@dataclass(frozen=True)
class Job:
    request: RunRequest
    true_duration: float
    estimate_factor: float | None
    """The scheduler is told ``true duration x factor``, or nothing when None."""


@dataclass
class Outcome:
    started: dict[int, float] = field(default_factory=dict)
    accepted: set[int] = field(default_factory=set)
    passes: list[tuple[float, Plan]] = field(default_factory=list)


def simulate(totals: Mapping[str, Resources], jobs: list[Job], quotas: Mapping[str, TeamQuota], *,
             window_s: float = 60.0) -> Outcome:
    """Submit at ``submitted_at``, plan at every event until the plan settles, runs end at their true durations."""
    idle = [Node.idle(name, total) for name, total in totals.items()]
    cluster_total = total_of(totals.values())
    arrivals = sorted(jobs, key=lambda job: (job.request.submitted_at, job.request.run_id))
    by_id = {job.request.run_id: job for job in jobs}
    left = {job.request.run_id: job.true_duration for job in jobs}
    queue: dict[int, RunRequest] = {}
    live: dict[int, tuple[RunningRun, float]] = {}  # run id -> (run, true end)
    history: list[UsageInterval] = []
    out = Outcome()
    now = 0.0
    for _ in range(10_000):
        if not (arrivals or queue or live):
            return out
        upcoming = [end for _, end in live.values()] + [job.request.submitted_at for job in arrivals[:1]]
        assert upcoming, f"runs {sorted(queue)} wait forever on an idle cluster"
        now = max(now, min(upcoming))
        for run_id, (run, end) in list(live.items()):
            if end <= now:
                del live[run_id]
                history.append(UsageInterval(team=run.team, start=run.started_at, end=end, resources=run.total))
        while arrivals and arrivals[0].request.submitted_at <= now:
            request = arrivals.pop(0).request
            waiting = sum(1 for other in queue.values() if other.team == request.team)
            if refusal(request, idle, quota=quotas.get(request.team), queued_count=waiting) is None:
                queue[request.run_id] = request
                out.accepted.add(request.run_id)
        for _ in range(50):
            current = [run for run, _ in live.values()]
            usage = usage_in_window(history + [UsageInterval(team=r.team, start=r.started_at, end=None,
                                                             resources=r.total) for r in current],
                                    now, window_s=window_s, cluster_total=cluster_total)
            decision = plan(SchedulerState(nodes=snapshot(totals, current), queued=tuple(queue.values()),
                                           running=tuple(current), quotas=quotas, usage=usage), now)
            if out.passes and out.passes[-1][0] == now and not out.passes[-1][1].preempt:
                # Planning again at the same instant, with nothing stopped meanwhile, starts nothing new.
                assert not decision.admit, f"a re-plan at t={now} started runs {admitted(decision)}"
            out.passes.append((now, decision))
            if not decision.admit and not decision.preempt:
                break
            for admission in decision.admit:
                request = queue.pop(admission.run_id)
                out.started.setdefault(request.run_id, now)
                expected_end = None if request.expected_duration_s is None else now + request.expected_duration_s
                live[request.run_id] = (RunningRun(run_id=request.run_id, team=request.team, bundles=request.bundles,
                                                   placement=admission.placement, started_at=now,
                                                   expected_end=expected_end, priority=request.priority,
                                                   preemptible=request.preemptible), now + left[request.run_id])
            check_capacity_and_quotas(totals, [run for run, _ in live.values()], quotas)
            for run_id in decision.preempt:
                run, end = live.pop(run_id)
                assert run.preemptible
                history.append(UsageInterval(team=run.team, start=run.started_at, end=now, resources=run.total))
                left[run_id] = end - now  # resumes from its checkpoint
                factor = by_id[run_id].estimate_factor
                queue[run_id] = replace(by_id[run_id].request,
                                        expected_duration_s=None if factor is None else left[run_id] * factor)
        else:
            raise AssertionError(f"the plan never settles at t={now}")
    raise AssertionError("the simulation did not finish")


def check_capacity_and_quotas(totals: Mapping[str, Resources], runs: list[RunningRun],
                              quotas: Mapping[str, TeamQuota]) -> None:
    for name, total in totals.items():
        used = total_of(b for run in runs for b, node in zip(run.bundles, run.placement, strict=True) if node == name)
        assert used.fits_in(total), f"node {name} over-committed: {used.describe()} of {total.describe()}"
    for team, quota in quotas.items():
        used = total_of(run.total for run in runs if run.team == team)
        assert quota.excess(Resources.nothing(), used) is None, f"team {team} over its quota: {used.describe()}"


node_totals = st.lists(st.builds(lambda g, c: box(gpus=g, cpus=c), st.sampled_from([0, 1, 3, 4, 4]),
                                 st.sampled_from([4, 8, 16])),
                       min_size=1, max_size=3).map(lambda boxes: {f"n{i}": b for i, b in enumerate(boxes, 1)})
bundle = st.builds(lambda g, c: Resources(cpus=c, gpus=g), st.integers(0, 2), st.sampled_from([0.5, 1, 2]))
team_quota = st.builds(TeamQuota, max_gpus=st.none() | st.integers(1, 6),
                       max_cpus=st.none() | st.sampled_from([4, 8, 16]), max_queued=st.none() | st.integers(2, 6))


@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict[str, Resources], list[Job], dict[str, TeamQuota]]:
    totals = draw(node_totals)
    quotas = {team: draw(team_quota) for team in draw(st.sets(st.sampled_from(TEAMS), min_size=1))}
    jobs = []
    for run_id in range(1, draw(st.integers(2, 10)) + 1):
        duration = float(draw(st.integers(1, 20)))
        factor = draw(st.sampled_from([None, 1.0, 1.0, 0.5, 2.0]))
        jobs.append(Job(request=RunRequest(run_id=run_id, team=draw(st.sampled_from(TEAMS)),
                                           bundles=tuple(draw(st.lists(bundle, min_size=1, max_size=3))),
                                           submitted_at=float(draw(st.integers(0, 10))),
                                           priority=draw(st.sampled_from(PRIORITIES)),
                                           expected_duration_s=None if factor is None else duration * factor,
                                           preemptible=draw(st.booleans())),
                        true_duration=duration, estimate_factor=factor))
    return totals, jobs, quotas


@settings(max_examples=80, deadline=None)
@given(workloads())
def test_every_accepted_run_starts_and_quotas_and_capacity_always_hold(
        workload: tuple[dict[str, Resources], list[Job], dict[str, TeamQuota]]) -> None:
    totals, jobs, quotas = workload
    outcome = simulate(totals, jobs, quotas)  # checks capacity and quotas after every admission
    assert set(outcome.started) == outcome.accepted


@st.composite
def one_team_backlogs(draw: st.DrawFn) -> tuple[dict[str, Resources], list[Job], dict[str, TeamQuota]]:
    totals = draw(node_totals)
    quotas = {"vision": draw(team_quota)} if draw(st.booleans()) else {}
    jobs = [Job(request=RunRequest(run_id=run_id, team="vision",
                                   bundles=tuple(draw(st.lists(bundle, min_size=1, max_size=3))), submitted_at=0.0,
                                   expected_duration_s=float(duration)),
                true_duration=float(duration), estimate_factor=1.0)
            for run_id, duration in enumerate(draw(st.lists(st.integers(1, 20), min_size=1, max_size=9)), 1)]
    return totals, jobs, quotas


@settings(max_examples=80, deadline=None)
@given(one_team_backlogs())
def test_with_exact_durations_the_head_starts_by_its_reservation_and_estimates_come_true(
        workload: tuple[dict[str, Resources], list[Job], dict[str, TeamQuota]]) -> None:
    totals, jobs, quotas = workload
    outcome = simulate(totals, jobs, quotas)
    assert set(outcome.started) == outcome.accepted
    for _, decision in outcome.passes:
        if decision.reservation is None:
            continue
        head, reserved_start = decision.reservation.run_id, decision.reservation.start
        assert reserved_start is not None
        # Nothing behind the head delays it; a run ahead of it, held back by the team quota then, may go first:
        # start first, or become the head itself first (first in line, its share of the quota is held for it).
        ahead_by_quota = {run_id for run_id, w in decision.waiting.items()
                          if w.reason == "quota" and w.position < decision.waiting[head].position}
        first_in_line = {later.reservation.run_id for at, later in outcome.passes
                         if later.reservation is not None and at <= outcome.started[head]}
        assert outcome.started[head] <= reserved_start or any(
            outcome.started[run_id] <= outcome.started[head] or run_id in first_in_line
            for run_id in ahead_by_quota)
    _, first = outcome.passes[0]
    assert {run_id: w.estimated_start for run_id, w in first.waiting.items()} == {
        run_id: at for run_id, at in outcome.started.items() if run_id in first.waiting}


def test_a_cpu_only_run_backfills_beside_a_head_that_waits_for_gpus_of_its_team_quota() -> None:
    # Found by the property above: run 8 asks no GPU, yet was held back for "the quota run 6 needs" (GPUs), then
    # started in the next pass at the same instant, so the first pass's estimate for it was wrong.
    cpu, gpus = Resources(cpus=0.5, gpus=0, memory_bytes=0), Resources(cpus=0.5, gpus=2, memory_bytes=0)
    shapes = [cpu, cpu, cpu, cpu, gpus, gpus, Resources(cpus=0.5, gpus=1, memory_bytes=0), cpu]
    jobs = [Job(request=RunRequest(run_id=i, team="vision", bundles=(b,), submitted_at=0.0,
                                   expected_duration_s=2.0 if i == 8 else 1.0),
                true_duration=2.0 if i == 8 else 1.0, estimate_factor=1.0) for i, b in enumerate(shapes, 1)]
    outcome = simulate({"n1": Resources(cpus=4.0, gpus=3, memory_bytes=0)}, jobs,
                       {"vision": TeamQuota(max_gpus=4)})
    _, first = outcome.passes[0]
    # Run 7 (1 GPU) waits though it would end by run 6's start: 2 + 2 + 1 GPUs is over the quota of 4 while
    # run 6's share is held for it.
    assert 8 in {a.run_id for a in first.admit} and set(first.waiting) == {6, 7}
    assert outcome.started[6] == first.waiting[6].estimated_start == 1.0
    assert outcome.started[7] == first.waiting[7].estimated_start == 1.0


def r(c: float, g: int = 0) -> Resources:
    return Resources(cpus=c, gpus=g, memory_bytes=0)


def backlog(shapes: Mapping[int, tuple[tuple[Resources, ...], float]]) -> list[Job]:
    """Team vision's runs, all submitted at 0 with exact durations: run id -> (bundles, duration)."""
    return [Job(request=RunRequest(run_id=i, team="vision", bundles=b, submitted_at=0.0, expected_duration_s=d),
                true_duration=d, estimate_factor=1.0) for i, (b, d) in shapes.items()]


def test_a_teammate_that_ends_before_the_heads_start_still_leaves_the_head_its_quota() -> None:
    # Found by the property above. Run 7 (6 CPUs) waits for a GPU until t=1. Run 8 (6 CPUs, 1 s) would end by
    # then, but starting it would put run 7 over the team's 16 CPUs now: the next decision would hold run 7 back
    # by quota with no reservation, and run 9 would have started at once though estimated at t=1. Run 8 waits.
    shapes = {i: ((r(0.5),), 1.0) for i in range(1, 6)}
    shapes.update({6: ((r(0.5), r(0.5), r(1, 1)), 1.0), 7: ((r(2), r(2), r(2, 1)), 1.0),
                   8: ((r(2), r(2), r(2)), 1.0), 9: ((r(0.5),), 2.0)})
    outcome = simulate({"n1": r(4), "n2": r(8, 1)}, backlog(shapes), {"vision": TeamQuota(max_cpus=16)})
    _, first = outcome.passes[0]
    assert admitted(first) == [1, 2, 3, 4, 5, 6, 9] and first.reservation == Reservation(run_id=7, start=1.0)
    assert first.waiting[8].reason == "reservation" and "held for run 7" in first.waiting[8].message
    assert {run_id: w.estimated_start for run_id, w in first.waiting.items()} == {7: 1.0, 8: 2.0}
    assert outcome.started[7] == 1.0 and outcome.started[8] == 2.0  # at t=1 run 7 leaves it no room


def test_short_teammates_cannot_quota_block_the_head_and_let_a_long_run_delay_it() -> None:
    # Found by the property above. At t=1 run 4 (3 GPUs) is reserved for t=2. Runs 7 and 8 (5 CPUs, ending at
    # t=2) used to start beside it and put it over the team's 8 CPUs, so it lost its reservation and run 5 (a GPU
    # until t=4) started and delayed it to t=4. Now they wait and run 4 starts at t=2 as reserved.
    shapes = {1: ((r(0.5), r(2, 1)), 2.0), 2: ((r(0.5),), 1.0), 3: ((r(0.5), r(0.5), r(2)), 1.0),
              4: ((r(0.5, 1), r(0.5, 2)), 1.0), 5: ((r(0.5, 1),), 3.0), 6: ((r(0.5),), 1.0),
              7: ((r(2),), 1.0), 8: ((r(0.5), r(0.5), r(2)), 1.0)}
    outcome = simulate({"n1": r(8, 3)}, backlog(shapes), {"vision": TeamQuota(max_cpus=8)})
    assert outcome.started[4] == 2.0
    _, first = outcome.passes[0]
    assert first.reservation == Reservation(run_id=4, start=2.0) and first.waiting[4].estimated_start == 2.0


def test_a_run_ahead_that_its_quota_held_back_becomes_the_head_and_goes_first() -> None:
    # Found by the property above. At t=0 run 5 (4.5 CPUs) is held back by the team's 8 CPUs and run 6 is
    # reserved for t=1. At t=1 run 5 fits the quota and, ahead of run 6 in the queue, becomes the head (GPUs
    # free at t=3); its share of the quota is held, so run 6 waits until run 3 ends at t=2, as the first
    # decision's estimate said.
    shapes = {1: ((r(0.5),), 1.0), 2: ((r(0.5), r(0.5, 1)), 1.0), 3: ((r(0.5),), 2.0),
              4: ((r(0.5), r(0.5, 1), r(1, 2)), 3.0), 5: ((r(2), r(2), r(0.5, 2)), 1.0),
              6: ((r(0.5), r(0.5), r(0.5, 1)), 1.0)}
    outcome = simulate({"n1": r(8, 4)}, backlog(shapes), {"vision": TeamQuota(max_cpus=8)})
    _, first = outcome.passes[0]
    assert first.reservation == Reservation(run_id=6, start=1.0) and first.waiting[5].reason == "quota"
    assert {run_id: w.estimated_start for run_id, w in first.waiting.items()} == {5: 3.0, 6: 2.0}
    assert "expected in 2 s" in first.waiting[6].message  # its estimate, not the reservation's t=1
    assert outcome.started[5] == 3.0 and outcome.started[6] == 2.0
    assert any(at == 1.0 and p.reservation == Reservation(run_id=5, start=3.0) for at, p in outcome.passes)


# ---- expected ends of running runs --------------------------------------------------------------------------

def test_expected_end_follows_the_measured_pace_then_the_estimate() -> None:
    from webapp.scheduling.workload import expected_end

    # 2 of 10 iterations in 100 s: 8 more at 50 s each.
    assert expected_end(started_at=0, now=100, iterations_done=2, iterations_at_start=0, total_iterations=10,
                        expected_duration_s=None) == 500
    # A resumed run: only iterations done on this allocation set the pace (3 -> 5 in 60 s).
    assert expected_end(started_at=1000, now=1060, iterations_done=5, iterations_at_start=3, total_iterations=10,
                        expected_duration_s=None) == 1060 + 30 * 5
    # No pace yet: the estimate, scaled to what is left of a resumed run; a passed estimate means now.
    assert expected_end(started_at=0, now=10, iterations_done=0, iterations_at_start=0, total_iterations=10,
                        expected_duration_s=400) == 400
    assert expected_end(started_at=0, now=10, iterations_done=5, iterations_at_start=5, total_iterations=10,
                        expected_duration_s=400) == 200
    assert expected_end(started_at=0, now=900, iterations_done=0, iterations_at_start=0, total_iterations=10,
                        expected_duration_s=400) == 900
    # Nothing known: no end; the last iteration done: it is finishing now.
    assert expected_end(started_at=0, now=10, iterations_done=0, iterations_at_start=0, total_iterations=10,
                        expected_duration_s=None) is None
    assert expected_end(started_at=0, now=70, iterations_done=10, iterations_at_start=0, total_iterations=10,
                        expected_duration_s=None) == 70


def test_held_series_is_the_mean_held_per_slice() -> None:
    from webapp.scheduling.usage import Held, held_series

    series = held_series([Held("ants", start=0, end=150, gpus=4, cpus=8), Held("bees", start=50, end=None, gpus=2,
                                                                             cpus=1)], since=0, until=200, buckets=2)
    assert series["ants"] == {"gpus": [4.0, 2.0], "cpus": [8.0, 4.0]}  # half of the second slice
    assert series["bees"] == {"gpus": [1.0, 2.0], "cpus": [0.5, 1.0]}  # still running: held until `until`
    # The area is the GPU-seconds: 4 x 150 over slices of 100 s.
    assert sum(series["ants"]["gpus"]) * 100 == 600
