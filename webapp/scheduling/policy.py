"""Admission: which queued runs start now, whom a high-priority head preempts, and why every other run waits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from webapp.scheduling.fairness import queue_order
from webapp.scheduling.resources import (Node, Placement, Resources, SchedulingError, amount, occupy, place,
                                         release)
from webapp.scheduling.workload import (PREEMPTING_PRIORITIES, UNLIMITED, RunningRun, RunRequest, TeamQuota,
                                        priority_rank)

WAIT_REASONS = ("quota", "capacity", "priority", "reservation")
"""quota: its team is at its limit. capacity: the head, or no room now and the head is of the same class.
priority: no room now and the head waiting ahead is of a higher class. reservation: there is room now, but using
it could delay the head."""


@dataclass(frozen=True, kw_only=True)
class SchedulerState:
    """The snapshot one decision is made on."""

    nodes: tuple[Node, ...]
    queued: tuple[RunRequest, ...] = ()
    running: tuple[RunningRun, ...] = ()
    quotas: Mapping[str, TeamQuota] = field(default_factory=dict)
    """Per team; a team without an entry is unlimited."""
    usage: Mapping[str, float] = field(default_factory=dict)
    """Fair-share usage per team over the window (``usage_in_window``); a team without an entry used nothing."""

    def __post_init__(self) -> None:
        for name in ("nodes", "queued", "running"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise SchedulingError("nodes", f"node names repeat: {sorted(names)}", allowed="one entry per node")
        ids = [r.run_id for r in self.queued] + [r.run_id for r in self.running]
        if len(set(ids)) != len(ids):
            raise SchedulingError("run_id", "a run appears twice among the queued and running runs",
                                  allowed="each run once")


@dataclass(frozen=True, kw_only=True)
class Admission:
    """Start this run now with its bundles on these nodes."""

    run_id: int
    placement: Placement
    backfilled: bool = False
    """True when it started behind a reserved head (it ends before the head's start or uses what the head leaves)."""


@dataclass(frozen=True, kw_only=True)
class Reservation:
    """The first run blocked by capacity and when the room it needs is expected (None: not predictable).

    Runs behind it cannot delay it; a run ahead of it that its team's quota holds back now may still go first.
    """

    run_id: int
    start: float | None


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """Why a queued run still waits, where it stands (1 = next) and when it is expected to start."""

    position: int
    reason: str
    message: str
    estimated_start: float | None


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One decision: start ``admit``, stop (checkpoint and requeue) ``preempt``, report ``waiting``."""

    admit: tuple[Admission, ...] = ()
    preempt: tuple[int, ...] = ()
    waiting: Mapping[int, Waiting] = field(default_factory=dict)
    reservation: Reservation | None = None


def plan(state: SchedulerState, now: float) -> Plan:
    """Walk the queue in order once and decide (EASY backfilling with one reservation, gang admission, quotas).

    Each run, in ``queue_order``: quota first (counting runs admitted earlier in this pass; a blocked run waits for
    its own team only), then room. Until a run is blocked by capacity, runs start whenever their gang fits. The first
    such run becomes the head: it is reserved the time at which running runs, released in order of expected end,
    leave room for it (the shadow time). Later runs start only if that cannot delay the head: they are expected to
    end by the shadow time, or they fit in what the head leaves over at that time (the only way for a run of
    unknown duration to start behind a head); a run of the head's team also only within what the team quota
    leaves once the head's share is held for it. So planning again at the same instant starts nothing more. A high or urgent head that does not fit may instead stop preemptible
    runs of lower classes (``choose_victims``) and starts once they have stopped. Every run left waiting gets its
    place, reason and expected start (``_forecast``).
    """
    decision = _Pass(state, now, free={n.name: n.free for n in state.nodes})
    decision.walk()
    estimates = _forecast(state, decision)
    head = decision.head
    if head is not None and not decision.victims and decision.shadow is not None and head.run_id in estimates:
        # The reservation holds room from the shadow time, but a run ahead that its quota holds back now may
        # become the head first and start then; the message gives the same time as the run's estimated start.
        decision.waiting[head.run_id] = ("capacity", _reserved_message(estimates[head.run_id] - now))
    still = [run for run in decision.order if run.run_id in decision.waiting]
    waiting = {run.run_id: Waiting(position=i, reason=decision.waiting[run.run_id][0],
                                   message=decision.waiting[run.run_id][1], estimated_start=estimates.get(run.run_id))
               for i, run in enumerate(still, start=1)}
    return Plan(admit=tuple(decision.admitted), preempt=tuple(v.run_id for v in decision.victims), waiting=waiting,
                reservation=None if head is None else Reservation(run_id=head.run_id, start=decision.shadow))


class _Pass:
    """The working state of one walk down the queue (what is free, what each team uses, the head's reservation)."""

    def __init__(self, state: SchedulerState, now: float, *, free: Mapping[str, Resources]) -> None:
        self.state = state
        self.now = now
        self.free = dict(free)
        self.order = queue_order(state.queued, state.usage)
        # Runs holding resources: running ones, then those admitted in this pass (the shadow time counts both).
        self.holders: list[RunningRun] = list(state.running)
        self.using: dict[str, Resources] = {}
        for run in state.running:
            self.using[run.team] = self.using.get(run.team, Resources.nothing()) + run.total
        self.admitted: list[Admission] = []
        self.waiting: dict[int, tuple[str, str]] = {}
        self.head: RunRequest | None = None
        self.shadow: float | None = None
        self.leftover: dict[str, Resources] = {}
        self.victims: tuple[RunningRun, ...] = ()

    def walk(self) -> None:
        for run in self.order:
            self._consider(run)

    def _consider(self, run: RunRequest) -> None:
        quota = self.state.quotas.get(run.team, UNLIMITED)
        using = self.using.get(run.team, Resources.nothing())
        excess = quota.excess(using, run.total)
        if excess is not None:
            dim, limit = excess
            self._wait(run, "quota", f"team {run.team!r} already uses {amount(dim, getattr(using, dim))} and may use "
                                     f"at most {amount(dim, limit)} at once; this run asks "
                                     f"{amount(dim, getattr(run.total, dim))}")
            return
        placement = place(run.bundles, self.free)
        if self.head is None:
            if placement is not None:
                self._admit(run, placement, backfilled=False)
            else:
                self._reserve(run)
        elif placement is None:
            head = self.head
            if priority_rank(head.priority) > priority_rank(run.priority):
                self._wait(run, "priority", f"{_name(head, run.team)} of a higher class ({head.priority}) waits "
                                            "ahead of it for room")
            else:
                self._wait(run, "capacity", f"its {len(run.bundles)} bundles ({run.total.describe()}) do not fit the "
                                            "free resources now")
        else:
            self._backfill(run)

    def _wait(self, run: RunRequest, reason: str, message: str) -> None:
        self.waiting[run.run_id] = (reason, message)

    def _admit(self, run: RunRequest, placement: Placement, *, backfilled: bool) -> None:
        self.free = occupy(self.free, run.bundles, placement)
        self.using[run.team] = self.using.get(run.team, Resources.nothing()) + run.total
        end = None if run.expected_duration_s is None else self.now + run.expected_duration_s
        self.holders.append(RunningRun(run_id=run.run_id, team=run.team, bundles=run.bundles, placement=placement,
                                       started_at=self.now, expected_end=end, priority=run.priority,
                                       preemptible=run.preemptible))
        self.admitted.append(Admission(run_id=run.run_id, placement=placement, backfilled=backfilled))

    def _reserve(self, run: RunRequest) -> None:
        self.head = run
        if run.priority in PREEMPTING_PRIORITIES:
            self.victims = choose_victims(run, free=self.free, running=self.state.running)
        if self.victims:
            freed = _released(self.free, self.victims)
            placement = place(run.bundles, freed)
            assert placement is not None, "victims were chosen so that the head fits"
            self.shadow, self.leftover = self.now, occupy(freed, run.bundles, placement)
            own = [str(v.run_id) for v in self.victims if v.team == run.team]
            others = len(self.victims) - len(own)
            which = ", ".join(([f"runs {', '.join(own)}"] if own else [])
                              + ([f"{others} of other teams"] if others else []))
            self._wait(run, "capacity", f"first in line for room; stopping preemptible lower-priority runs ({which}) "
                                        "to make room")
            return
        self.shadow, self.leftover = _shadow_time(run, free=self.free, holders=self.holders, now=self.now)
        if self.shadow is None:
            self._wait(run, "capacity", f"first in line for room; its bundles ({run.total.describe()}) do not fit "
                                        "now and the runs holding what it needs have no expected end")
        else:
            self._wait(run, "capacity", _reserved_message(self.shadow - self.now))

    def _backfill(self, run: RunRequest) -> None:
        head = self.head
        assert head is not None
        if self.shadow is None:
            self._wait(run, "reservation", f"{_name(head, run.team)} is first in line for room and when it can "
                                           "start is unknown, so nothing may start ahead of it")
            return
        known = run.expected_duration_s is not None
        ends_in_time = known and self.now + run.expected_duration_s <= self.shadow
        if run.team == head.team:
            # The head's own quota is held for it while it waits, even against a teammate that would end before
            # the head's start: a teammate that put the head over its quota now would make the next decision hold
            # the head back by quota instead, with no reservation, and runs behind it could then start and delay
            # it past its reserved start (the scheduler property test found both cases).
            quota = self.state.quotas.get(run.team, UNLIMITED)
            if quota.excess(self.using.get(run.team, Resources.nothing()) + head.total, run.total) is not None:
                self._wait(run, "reservation", f"the quota of team {run.team!r} is held for run {head.run_id} "
                                               "(first in line for room), and this run does not fit in what is left "
                                               "of it")
                return
        if ends_in_time:
            placement = place(run.bundles, self.free)
        else:
            # A run still going at the shadow time (or one of unknown length) may use only what the head leaves.
            placement = place(run.bundles, {node: left.capped_by(self.leftover[node])
                                            for node, left in self.free.items()})
        if placement is None:
            if not known:
                self._wait(run, "reservation", "its duration is unknown, so it may use only what "
                                               f"{_name(head, run.team)} (first in line for room) leaves over when "
                                               "it starts, and that is not enough")
            else:
                self._wait(run, "reservation", f"it would still run at {self.shadow - self.now:g} s from now and "
                                               f"hold resources {_name(head, run.team)} (first in line for room) needs "
                                               "then")
            return
        if not ends_in_time:
            self.leftover = occupy(self.leftover, run.bundles, placement)
        self._admit(run, placement, backfilled=True)


def _reserved_message(seconds: float) -> str:
    return f"first in line for room; resources are reserved for it, expected in {seconds:g} s as running runs end"


def _name(other: RunRequest | RunningRun, team: str) -> str:
    """How a waiting run's message names another run: by id within its team, anonymously across teams (messages
    reach the waiting run's team, which sees other teams' runs only without their ids)."""
    return f"run {other.run_id}" if other.team == team else "another team's run"


def _released(free: Mapping[str, Resources], runs: Iterable[RunningRun]) -> dict[str, Resources]:
    out = dict(free)
    for run in runs:
        out = release(out, run.bundles, run.placement)
    return out


def _shadow_time(head: RunRequest, *, free: Mapping[str, Resources], holders: Iterable[RunningRun],
                 now: float) -> tuple[float | None, dict[str, Resources]]:
    """When the head fits if running runs end as expected, and what is left over once it is placed then.

    A run past its expected end is taken to end now; runs with no expected end never give anything back.
    """
    ending = sorted((max(run.expected_end, now), run.run_id, run) for run in holders if run.expected_end is not None)
    room = dict(free)
    i = 0
    while i < len(ending):
        at = ending[i][0]
        while i < len(ending) and ending[i][0] == at:
            room = release(room, ending[i][2].bundles, ending[i][2].placement)
            i += 1
        placement = place(head.bundles, room)
        if placement is not None:
            return at, occupy(room, head.bundles, placement)
    return None, {}


def choose_victims(head: RunRequest, *, free: Mapping[str, Resources],
                   running: Iterable[RunningRun]) -> tuple[RunningRun, ...]:
    """A minimal set of running runs to stop so that the head fits now, or () when no such set exists.

    Only preemptible runs of a strictly lower class qualify, taken lowest class first, then most recently started
    (the least work lost), until the head fits. Then stops the head does not need (say, a CPU-only run for a GPU
    head) are dropped again, trying the victims taken last first.
    """
    candidates = sorted((run for run in running
                         if run.preemptible and priority_rank(run.priority) < priority_rank(head.priority)),
                        key=lambda run: (priority_rank(run.priority), -run.started_at, -run.run_id))
    chosen: list[RunningRun] = []
    for run in candidates:
        chosen.append(run)
        if place(head.bundles, _released(free, chosen)) is not None:
            break
    else:
        return ()
    for run in reversed(chosen):
        rest = [v for v in chosen if v is not run]
        if place(head.bundles, _released(free, rest)) is not None:
            chosen = rest
    return tuple(chosen)


def _forecast(state: SchedulerState, first: _Pass) -> dict[int, float]:
    """Expected start of each waiting run: this policy replayed on a simulated clock.

    From the decision just made, running and admitted runs end at their expected ends (never, when unknown) and
    preempted runs stop at once; at each end the same walk runs again with the teams' fair-share usage held fixed,
    and runs that start there get that time. Nothing new is submitted, and preempted runs are not requeued. A run
    still waiting when no more expected ends remain gets no estimate (its start depends on an unknown duration).
    """
    starts: dict[int, float] = {}
    step = first
    clock = first.now
    while True:
        stopped = {v.run_id for v in step.victims}
        running = [run for run in step.holders if run.run_id not in stopped]
        free = _released(step.free, step.victims)
        queued = [run for run in step.order if run.run_id in step.waiting]
        if not queued:
            break
        if not step.victims:  # after a preemption, walk again at the same time: the victims' room is free now
            ends = [max(run.expected_end, first.now) for run in running if run.expected_end is not None]
            if not ends:
                break
            clock = min(ends)
            done = [run for run in running
                    if run.expected_end is not None and max(run.expected_end, first.now) <= clock]
            free = _released(free, done)
            ended = {run.run_id for run in done}
            running = [run for run in running if run.run_id not in ended]
        step = _Pass(SchedulerState(nodes=state.nodes, queued=queued, running=running, quotas=state.quotas,
                                    usage=state.usage), clock, free=free)
        step.walk()
        starts.update({a.run_id: clock for a in step.admitted})
    return starts
