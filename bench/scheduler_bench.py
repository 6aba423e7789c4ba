"""scheduler_bench: the real admission pass and database on a simulated clock, 3 teams x 30 runs on 16 GPUs.

The cluster is simulated (4 nodes x 4 GPUs, 32 CPUs, 256 GiB); everything else is the service's own code on a
private SQLite database: submit-time refusal (`check_submission`), `admission_pass` (quotas, priority, fair
share, gang placement, backfill, preemption), `requeue_preempted`, `close_allocation`. A simulated worker starts
each admitted run at once, reports its iterations as they pass (the pass estimates ends from that pace) and pauses
a preempted run one minute after it is asked (progress since its last per-iteration checkpoint is lost).

Workload: one list of 30 run shapes (1/2/4/8 GPUs as gangs of 1-GPU bundles; lengths 5 min - 3 h, log-normal;
priorities 8 low (preemptible) / 17 normal / 5 high; 80% state an estimate 1.0-1.5x their true length), the same
for each team, so demand is equal. Team ants submits all 30 at once at t=0; bees and wasps spread theirs over 2 hours.
Quotas: 12 GPUs and 40 queued runs per team.

Reported, all from one invocation:
- utilization: useful GPU-seconds / (16 GPUs x makespan), against an offline greedy packer on the same workload
  (knows every true length, no quotas, priorities or fairness; at each event it starts every queued run that fits,
  in submission order) -> ratio = greedy makespan / our makespan (target >= 0.9; none if a run never finished);
  and how work-conserving it was: GPU-seconds used / GPU-seconds that running plus waiting runs could have used
  at each moment, as far as the cluster's size permits (quotas and gang shapes not taken into account);
- fairness: Jain's index of the teams' GPU-seconds over the time all three teams had runs waiting (target >= 0.9),
  and the same index for the greedy packer (which ignores fairness) to show what the measure tells apart;
- queue waits (submit -> first start, and all time spent queued) p50/p95 per priority class;
- quota and capacity violations after every pass (target 0), starvation (runs never started; target 0);
- the admission pass's own cost (wall time per pass on the database).

    .venv/bin/python bench/scheduler_bench.py [--seeds 1,2,3,4,5,6,7] [--out bench/results/scheduler_bench.json]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_io import django_on_private_sqlite, write_result  # noqa: E402

GIB = 1024**3
NODES = 4
GPUS_PER_NODE = 4
CPUS_PER_NODE = 32
BUNDLE = {"cpus": 4, "gpus": 1, "memory_gib": 16}
TEAMS = ("ants", "bees", "wasps")
RUNS_PER_TEAM = 30
QUOTA_GPUS = 12
ITERATIONS = 20
PAUSE_DELAY_S = 60.0
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=dt_timezone.utc)


@dataclass(frozen=True)
class Shape:
    gpus: int
    duration_s: float
    priority: str
    estimate_s: float | None


@dataclass
class Job:
    """One run of the workload and what happened to it in the simulation."""

    index: int
    team: str
    shape: Shape
    submit_s: float
    run_id: int = 0
    first_start_s: float | None = None
    end_s: float | None = None
    queued_s: float = 0.0
    queued_since: float | None = None
    done_work_s: float = 0.0
    """Work kept (checkpointed) before the current allocation."""
    started_s: float | None = None
    preemptions: int = 0
    lost_work_s: float = 0.0


def workload(seed: int) -> list[Job]:
    rng = random.Random(seed)
    shapes = []
    # Fixed counts per class (a draw could leave a class empty): 8 low, 17 normal, 5 high, in random order.
    priorities = ["low"] * 8 + ["normal"] * 17 + ["high"] * 5
    rng.shuffle(priorities)
    for priority in priorities:
        gpus = rng.choices([1, 2, 4, 8], weights=[35, 30, 20, 15])[0]
        duration = min(3 * 3600, max(300, rng.lognormvariate(math.log(40 * 60), 0.8)))
        estimate = duration * rng.uniform(1.0, 1.5) if rng.random() < 0.8 else None
        shapes.append(Shape(gpus, round(duration), priority, None if estimate is None else round(estimate)))
    jobs = []
    for team in TEAMS:
        for i, shape in enumerate(shapes):
            submit = float(i) if team == "ants" else round(rng.uniform(0, 2 * 3600))
            jobs.append(Job(index=len(jobs), team=team, shape=shape, submit_s=submit))
    return jobs


def greedy(jobs: list[Job]) -> tuple[float, float | None]:
    """The offline greedy packer: exact lengths, no policy; every event starts all queued runs that fit, in
    submission order (the same first-fit gang placement). Returns its makespan and, measured as for the service,
    Jain's index of the teams' GPU-seconds while all teams had runs waiting (what ignoring fairness gives)."""
    from webapp.scheduling.fairness import jain_index
    from webapp.scheduling.resources import Resources, occupy, place, release

    bundle = Resources(cpus=BUNDLE["cpus"], gpus=1, memory_bytes=BUNDLE["memory_gib"] * GIB)
    free = {f"n{i}": Resources(cpus=CPUS_PER_NODE, gpus=GPUS_PER_NODE, memory_bytes=256 * GIB) for i in range(NODES)}
    by_index = {job.index: job for job in jobs}
    events: list[tuple[float, int, int]] = [(job.submit_s, 1, job.index) for job in jobs]
    heapq.heapify(events)
    queued: list[int] = []
    holding: dict[int, tuple[tuple[Resources, ...], tuple[str, ...]]] = {}
    end = 0.0
    share = {team: 0.0 for team in TEAMS}
    last = 0.0
    while events:
        now = events[0][0]
        if {by_index[i].team for i in queued} >= set(TEAMS):
            for i in holding:
                share[by_index[i].team] += by_index[i].shape.gpus * (now - last)
        while events and events[0][0] == now:
            _, kind, i = heapq.heappop(events)
            if kind == 0:
                free = release(free, *holding.pop(i))
            else:
                queued.append(i)
        for i in list(queued):
            gang = (bundle,) * by_index[i].shape.gpus
            where = place(gang, free)
            if where is not None:
                free = occupy(free, gang, where)
                holding[i] = (gang, where)
                queued.remove(i)
                heapq.heappush(events, (now + by_index[i].shape.duration_s, 0, i))
                end = max(end, now + by_index[i].shape.duration_s)
        last = now
    return end, (jain_index(list(share.values())) if any(share.values()) else None)


class Simulation:
    """The service's scheduler on a simulated clock: submit, admit, run, pause, finish."""

    def __init__(self, jobs: list[Job], *, quota_gpus: int = QUOTA_GPUS) -> None:
        from django.contrib.auth import get_user_model

        from webapp.accounts.models import Membership, Team
        from webapp.scheduling.models import Quota
        from webapp.scheduling.resources import Node, Resources

        self.jobs = jobs
        self.quota_gpus = quota_gpus
        self.by_run: dict[int, Job] = {}
        self.teams = {}
        for slug in TEAMS:
            team = Team.objects.create(name=slug.title(), slug=slug)
            user = get_user_model().objects.create_user(f"{slug}-lead", password="bench-password-123")
            Membership.objects.create(user=user, team=team, role="admin")
            Quota.objects.create(team=team, max_gpus=quota_gpus, max_queued=40)
            self.teams[slug] = (team, user)
        self.nodes = tuple(Node.idle(f"n{i}", Resources(cpus=CPUS_PER_NODE, gpus=GPUS_PER_NODE,
                                                         memory_bytes=256 * GIB)) for i in range(NODES))
        self.events: list[tuple[float, int, int, str]] = []  # (time, order, index, kind)
        self.order = 0
        self.pass_s: list[float] = []
        self.violations: list[str] = []
        self.refused: list[str] = []
        self.timeline: list[tuple[float, dict[str, int], set[str], int]] = []
        """After each pass: (time, GPUs held per team, teams with runs waiting, GPUs the waiting runs ask)."""
        self.pausing: set[int] = set()
        for i, job in enumerate(jobs):
            self._push(job.submit_s, i, "submit")

    def _push(self, at: float, index: int, kind: str) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, index, kind))

    @staticmethod
    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def run(self) -> None:
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, order, index, kind = heapq.heappop(self.events)
                getattr(self, f"_{kind}")(self.jobs[index], now, order)
            self._report_progress(now)
            self._admit(now)

    # ---- what happens to a run --------------------------------------------------------------------------------

    def _submit(self, job: Job, now: float, order: int) -> None:
        from webapp.runs.models import Run
        from webapp.scheduling.resources import SchedulingError
        from webapp.scheduling.submission import check_submission

        team, user = self.teams[job.team]
        resources = {"bundles": [dict(BUNDLE)] * job.shape.gpus}
        try:
            check_submission(team, resources=resources, config=_config(), nodes=self.nodes)
        except SchedulingError as exc:
            self.refused.append(f"{job.team}: {exc}")
            return
        run = Run.objects.create(team=team, owner=user, name=f"{job.team}-{len(self.by_run)}",
                                 config={"iterations": ITERATIONS}, priority=job.shape.priority,
                                 resources=resources, expected_duration_s=job.shape.estimate_s,
                                 preemptible=job.shape.priority == "low", created_at=self.at(now))
        job.run_id = run.pk
        job.queued_since = now
        self.by_run[run.pk] = job

    def _end(self, job: Job, now: float, order: int) -> None:
        from django.db import transaction

        from webapp.runs.models import Run
        from webapp.scheduling.admission import close_allocation

        if job.started_s is None or job.end_s is not None:
            return  # paused before this end came: a new end is scheduled when it runs again
        if abs(job.started_s + (job.shape.duration_s - job.done_work_s) - now) > 1e-6:
            return  # an end scheduled for an earlier allocation
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=job.run_id)
            run.status, run.finished_at, run.iterations_done = Run.Status.SUCCEEDED, self.at(now), ITERATIONS
            run.save(update_fields=["status", "finished_at", "iterations_done"])
            close_allocation(run, "succeeded", now=self.at(now))
        job.end_s = now
        job.started_s = None

    def _pause(self, job: Job, now: float, order: int) -> None:
        from django.db import transaction

        from webapp.runs.models import Run
        from webapp.runs.services import requeue_preempted

        self.pausing.discard(job.run_id)
        if job.started_s is None:
            return
        ran = now - job.started_s
        per_iteration = job.shape.duration_s / ITERATIONS
        done = min(ITERATIONS, math.floor((job.done_work_s + ran) / per_iteration))
        kept = done * per_iteration
        job.lost_work_s += job.done_work_s + ran - kept
        job.done_work_s = kept
        job.started_s = None
        job.preemptions += 1
        job.queued_since = now
        with transaction.atomic():
            requeue_preempted(Run.objects.select_for_update().get(pk=job.run_id), done)

    def _report_progress(self, now: float) -> None:
        """Iterations done so far, as a worker's events would report them (the pass reads its pace from them)."""
        from webapp.runs.models import Run

        for job in self.by_run.values():
            if job.started_s is not None:
                per_iteration = job.shape.duration_s / ITERATIONS
                done = min(ITERATIONS, math.floor((job.done_work_s + now - job.started_s) / per_iteration))
                Run.objects.filter(pk=job.run_id, iterations_done__lt=done).update(iterations_done=done)

    def _admit(self, now: float) -> None:
        from webapp.runs.models import Run
        from webapp.scheduling.admission import admission_pass

        admitted: list[int] = []
        began = time.perf_counter()
        result = admission_pass(now=self.at(now), nodes=self.nodes, enqueue=admitted.append)
        self.pass_s.append(time.perf_counter() - began)
        for run_id in admitted:  # the simulated worker claims it at once
            job = self.by_run[run_id]
            Run.objects.filter(pk=run_id).update(status=Run.Status.RUNNING, started_at=self.at(now), queue={})
            job.first_start_s = now if job.first_start_s is None else job.first_start_s
            job.queued_s += now - (job.queued_since if job.queued_since is not None else now)
            job.queued_since = None
            job.started_s = now
            self._push(now + job.shape.duration_s - job.done_work_s, job.index, "end")
        for run_id in result.preempted:
            if run_id not in self.pausing:
                self.pausing.add(run_id)
                self._push(now + PAUSE_DELAY_S, self.by_run[run_id].index, "pause")
        self._check(now)

    def _check(self, now: float) -> None:
        """Capacity and quota after the pass, from the allocations table itself."""
        from webapp.runs.models import Run
        from webapp.scheduling.models import Allocation

        per_node: dict[str, int] = {}
        per_team: dict[str, int] = {}
        for a in Allocation.objects.filter(ended_at__isnull=True).select_related("team"):
            per_team[a.team.slug] = per_team.get(a.team.slug, 0) + a.gpus
            for bundle, node in zip(a.bundles, a.placement):
                per_node[node] = per_node.get(node, 0) + bundle["gpus"]
        for node, gpus in per_node.items():
            if gpus > GPUS_PER_NODE:
                self.violations.append(f"t={now:.0f}s node {node} holds {gpus} GPUs")
        for team, gpus in per_team.items():
            if gpus > self.quota_gpus:
                self.violations.append(f"t={now:.0f}s team {team} holds {gpus} GPUs (quota {self.quota_gpus})")
        # The simulated worker claims admitted runs at once, so every queued run is one still waiting.
        queued = list(Run.objects.filter(status=Run.Status.QUEUED).values_list("pk", "team__slug"))
        waiting = {team for _, team in queued}
        wanted = sum(self.by_run[pk].shape.gpus for pk, _ in queued)
        self.timeline.append((now, per_team, waiting, wanted))


def _config() -> Any:
    from earl_core.config import RunConfig

    return RunConfig.from_dict({"iterations": ITERATIONS})


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(sim: Simulation, greedy_end: float, greedy_jain: float | None) -> dict[str, Any]:
    from webapp.scheduling.fairness import jain_index

    jobs = [j for j in sim.jobs if j.run_id]
    capacity = NODES * GPUS_PER_NODE
    useful = sum(j.shape.gpus * j.shape.duration_s for j in jobs)  # refused submissions never ran anywhere
    makespan = max((j.end_s or 0.0) for j in jobs)
    complete = all(j.end_s is not None for j in jobs)  # a makespan of unfinished work compares with nothing
    contended = {t: 0.0 for t in TEAMS}
    contended_s = 0.0
    used_s = possible_s = 0.0
    for (t, held, waiting, wanted), (t_next, *_) in zip(sim.timeline, sim.timeline[1:]):
        busy = sum(held.values())
        used_s += busy * (t_next - t)
        possible_s += min(capacity, busy + wanted) * (t_next - t)
        if waiting >= set(TEAMS):
            contended_s += t_next - t
            for team in TEAMS:
                contended[team] += held.get(team, 0) * (t_next - t)
    waits: dict[str, dict[str, Any]] = {}
    for priority in ("low", "normal", "high"):
        first = [j.first_start_s - j.submit_s for j in jobs
                 if j.shape.priority == priority and j.first_start_s is not None]
        total = [j.queued_s for j in jobs if j.shape.priority == priority and j.end_s is not None]
        waits[priority] = {"runs": len([j for j in jobs if j.shape.priority == priority]),
                           "first_start_wait_p50_s": _percentile(first, 0.5),
                           "first_start_wait_p95_s": _percentile(first, 0.95),
                           "queued_total_p50_s": _percentile(total, 0.5),
                           "queued_total_p95_s": _percentile(total, 0.95)}
    per_team = {team: {"gpu_s_while_all_waited": contended[team],
                       "mean_first_start_wait_s": statistics.fmean(
                           [j.first_start_s - j.submit_s for j in jobs
                            if j.team == team and j.first_start_s is not None])}
                for team in TEAMS}
    never = [j.run_id for j in jobs if j.first_start_s is None]
    unfinished = [j.run_id for j in jobs if j.end_s is None]
    return {
        "cluster": {"nodes": NODES, "gpus": capacity, "gpus_per_node": GPUS_PER_NODE},
        "workload": {"teams": len(TEAMS), "runs": len(sim.jobs), "submitted": len(jobs), "refused": sim.refused,
                     "useful_gpu_hours": useful / 3600},
        "utilization": {"makespan_s": makespan, "utilization": useful / (capacity * makespan),
                        "greedy_makespan_s": greedy_end, "greedy_utilization": useful / (capacity * greedy_end),
                        "ratio_to_greedy": greedy_end / makespan if complete else None, "target": 0.9,
                        "work_conserving": used_s / possible_s},
        "fairness": {"contended_s": contended_s, "per_team": per_team,
                     "jain": jain_index([contended[t] for t in TEAMS]) if contended_s else None, "target": 0.9,
                     "greedy_jain": greedy_jain},
        "waits_by_priority": waits,
        "violations": sim.violations,
        "never_started": never,
        "unfinished": unfinished,
        "preemptions": sum(j.preemptions for j in jobs),
        "lost_gpu_hours_to_preemption": sum(j.lost_work_s * j.shape.gpus for j in jobs) / 3600,
        "backfilled_admissions": _backfilled(),
        "admission_pass": {"passes": len(sim.pass_s), "p50_ms": 1000 * _percentile(sim.pass_s, 0.5),
                           "p95_ms": 1000 * _percentile(sim.pass_s, 0.95), "max_ms": 1000 * max(sim.pass_s)},
    }


def _backfilled() -> int:
    from webapp.scheduling.models import Allocation

    return Allocation.objects.filter(backfilled=True).count()


def simulate(seed: int, quota_gpus: int = QUOTA_GPUS) -> dict[str, Any]:
    """One workload (by seed) through the service's scheduler on a fresh database."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    jobs = workload(seed)
    began = time.perf_counter()
    sim = Simulation(jobs, quota_gpus=quota_gpus)
    sim.run()
    # The greedy packer gets exactly the runs the service accepted (a quota below a run's size refuses it).
    greedy_end, greedy_jain = greedy([j for j in jobs if j.run_id])
    result = summarize(sim, greedy_end, greedy_jain)
    result["seed"] = seed
    result["workload"]["quota_gpus_per_team"] = quota_gpus
    result["wall_s"] = time.perf_counter() - began
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3,4,5,6,7", help="workloads to run, comma-separated")
    parser.add_argument("--quota-gpus", type=int, default=QUOTA_GPUS, help="each team's GPU quota")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scheduler_bench.json"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        django_on_private_sqlite(str(Path(tmp) / "scheduler_bench.sqlite3"))
        results = [simulate(seed, args.quota_gpus) for seed in seeds]
    for r in results:
        u, f, w = r["utilization"], r["fairness"], r["waits_by_priority"]
        print(f"seed {r['seed']}: utilization {u['utilization']:.3f} vs greedy {u['greedy_utilization']:.3f} -> "
              f"ratio {u['ratio_to_greedy']:.3f}, work-conserving {u['work_conserving']:.3f}; Jain {f['jain']:.3f} "
              f"over {f['contended_s'] / 3600:.1f} h (greedy: {f['greedy_jain']:.3f}); "
              f"first-start wait p50/p95 (min) low {_min(w['low'])}, normal {_min(w['normal'])}, "
              f"high {_min(w['high'])}; violations {len(r['violations'])}, never started "
              f"{len(r['never_started'])}, preemptions {r['preemptions']}, pass p50/p95 "
              f"{r['admission_pass']['p50_ms']:.0f}/{r['admission_pass']['p95_ms']:.0f} ms")
    ratios = [r["utilization"]["ratio_to_greedy"] for r in results]
    jains = [r["fairness"]["jain"] for r in results if r["fairness"]["jain"] is not None]
    greedy_jains = [r["fairness"]["greedy_jain"] for r in results if r["fairness"]["greedy_jain"] is not None]
    conserving = [r["utilization"]["work_conserving"] for r in results]
    overall = {"seeds": seeds, "ratio_to_greedy_min": min(ratios), "ratio_to_greedy_mean": statistics.fmean(ratios),
               "seeds_meeting_ratio": sum(r >= 0.9 for r in ratios), "work_conserving_min": min(conserving),
               "work_conserving_mean": statistics.fmean(conserving),
               "jain_min": min(jains), "jain_mean": statistics.fmean(jains),
               "greedy_jain_min": min(greedy_jains), "greedy_jain_mean": statistics.fmean(greedy_jains),
               "violations": sum(len(r["violations"]) for r in results),
               "never_started": sum(len(r["never_started"]) for r in results),
               "targets": {"ratio_to_greedy": 0.9, "jain": 0.9, "violations": 0, "never_started": 0}}
    print(f"all seeds: ratio to greedy min {overall['ratio_to_greedy_min']:.3f} mean "
          f"{overall['ratio_to_greedy_mean']:.3f} ({overall['seeds_meeting_ratio']}/{len(seeds)} seeds >= 0.9); "
          f"work-conserving min {overall['work_conserving_min']:.3f}; Jain min {overall['jain_min']:.3f} mean "
          f"{overall['jain_mean']:.3f} (greedy {overall['greedy_jain_min']:.3f} / {overall['greedy_jain_mean']:.3f}); "
          f"violations {overall['violations']}; never started {overall['never_started']}")
    write_result({"overall": overall, "runs": results}, args.out)


def _min(w: dict[str, Any]) -> str:
    return f"{w['first_start_wait_p50_s'] / 60:.0f}/{w['first_start_wait_p95_s'] / 60:.0f}"


if __name__ == "__main__":
    main()
