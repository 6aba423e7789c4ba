"""Parallelism Selector: before a stage runs, keep or switch its layout for the coming work.

Never a layout predicted not to fit the memory budget (at the longest context coming); among those that fit, the
fastest predicted one — but a running layout is only left when the new one is faster by more than the hysteresis
margin *and* the time it saves over the coming iterations beats the cost of switching.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from earl_core.errors import EarlError
from earl_core.parallel.cost import CostModel
from earl_core.parallel.layout import Layout
from earl_core.parallel.memory import GIB, MemoryEstimate, Work
from earl_core.rl.batch import balance_by_tokens, chunk_by_length

SwitchCost = Callable[[Layout, Layout], float]
"""Seconds a switch from the first layout to the second costs (resharding weights, rebuilding engines)."""


BudgetFor = Callable[[Layout], "int | None"]
"""Bytes a worker of the layout may hold (None = unlimited), when the budget depends on the layout."""


class MemoryPredictor(Protocol):
    """Predicted peak bytes per worker of a layout for some work (MemoryModel, or a rollout engine's KV cache)."""

    def predict(self, layout: Layout, work: Work) -> MemoryEstimate: ...


class NoLayoutFits(EarlError):
    """Every candidate layout is predicted to exceed the memory budget for the coming work."""


@dataclass(frozen=True)
class Outlook:
    """The work the stage is about to do, from the context lengths the run is seeing now."""

    context_mean: float
    """Mean tokens per sequence (throughput is predicted here)."""
    context_max: int
    """Longest sequence expected (memory is checked here)."""
    sequences: int
    """Sequences per stage invocation."""
    iterations_left: int = 1
    """Iterations the choice is expected to serve (caps the horizon over which a switch must pay off)."""
    lengths: tuple[int, ...] = ()
    """The coming sequences' lengths when known (the learner's stages run after the games are played): the
    stage time is then predicted micro-batch by micro-batch, padding included, as the stage will cut them."""
    work_tokens: float = 0.0
    """Tokens the stage processes when that is not ``context_mean x sequences`` (rollout: every conversation's
    whole length, advanced turn by turn while ``context_mean`` is the mean context of a turn)."""

    @property
    def tokens(self) -> float:
        if self.work_tokens > 0:
            return self.work_tokens
        return float(sum(self.lengths)) if self.lengths else self.context_mean * self.sequences


@dataclass(frozen=True)
class Candidate:
    """One layout's predictions for the coming work."""

    layout: Layout
    tokens_per_s: float
    stage_seconds: float
    memory_bytes: int
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout.key, "tokens_per_s": round(self.tokens_per_s, 3),
                "tokens_per_s_per_worker": round(self.tokens_per_s / self.layout.workers, 3),
                "stage_seconds": round(self.stage_seconds, 6), "memory_bytes": self.memory_bytes, "fits": self.fits}


@dataclass(frozen=True)
class Decision:
    """What the selector chose for a stage and why; becomes a ``selector.decision`` event."""

    stage: str
    old: Layout | None
    new: Layout
    switched: bool
    reason: str
    candidates: list[Candidate] = field(default_factory=list)

    def event_data(self) -> dict[str, Any]:
        return {"stage": self.stage, "old_layout": self.old.to_dict() if self.old else None,
                "new_layout": self.new.to_dict(), "reason": self.reason, "switched": self.switched,
                "candidates": [c.to_dict() for c in self.candidates]}


@dataclass(frozen=True)
class SelectorPolicy:
    """Knobs of the switching rule."""

    hysteresis: float = 0.05
    """A new layout must be predicted at least this much faster (relative) than the running one."""
    horizon: int = 5
    """At most this many coming iterations count towards paying back a switch."""


class Selector:
    """Chooses one stage's layout from its candidates with a cost model and a memory model under a budget."""

    def __init__(self, stage: str, candidates: Sequence[Layout], *, cost: CostModel, memory: MemoryPredictor,
                 budget_bytes: int | None, switch_cost: SwitchCost, policy: SelectorPolicy | None = None,
                 budget_for: BudgetFor | None = None) -> None:
        if not candidates:
            raise ValueError(f"no candidate layouts for stage {stage}")
        wrong = [c.key for c in candidates if c.stage != stage]
        if wrong:
            raise ValueError(f"candidates {wrong} are not {stage} layouts")
        self.stage = stage
        self.candidates = list(candidates)
        self.cost = cost
        self.memory = memory
        self.budget_bytes = budget_bytes
        self.switch_cost = switch_cost
        self.policy = policy or SelectorPolicy()
        self.budget_for = budget_for

    def budget(self, layout: Layout) -> int | None:
        """The memory budget of a worker of ``layout``."""
        return self.budget_for(layout) if self.budget_for is not None else self.budget_bytes

    def assess(self, outlook: Outlook) -> list[Candidate]:
        """Predictions for every profiled candidate, fastest first (unprofiled ones cannot be ranked and are left out)."""
        work = Work(sequences=outlook.sequences, context=outlook.context_max)
        out = []
        for layout in self.candidates:
            if not self.cost.knows(layout):
                continue
            seconds = self.stage_seconds(layout, outlook)
            mem = self.memory.predict(layout, work).total
            budget = self.budget(layout)
            fits = budget is None or mem <= budget
            out.append(Candidate(layout, outlook.tokens / seconds, seconds, mem, fits))
        out.sort(key=lambda c: (c.stage_seconds, c.memory_bytes, c.layout.key))
        return out

    def stage_seconds(self, layout: Layout, outlook: Outlook) -> float:
        """Predicted seconds of the stage on ``layout``: the profiled prediction times the correction learnt from
        measured stages (CostModel.correction)."""
        return self.profiled_seconds(layout, outlook) * self.cost.correction(layout)

    def observe(self, layout: Layout, outlook: Outlook, measured_seconds: float) -> None:
        """Feed back how long the stage really took on ``layout`` for ``outlook``'s work."""
        self.cost.observe(layout, measured_seconds / self.profiled_seconds(layout, outlook))

    def profiled_seconds(self, layout: Layout, outlook: Outlook) -> float:
        """Seconds of the stage on ``layout`` from the profile alone. With the sequence lengths known: split
        across the DP ranks by tokens and cut into micro-batches exactly as the stage will, each micro-batch
        costing its padded size at the throughput profiled for its length; the slowest rank sets the time."""
        if not outlook.lengths:
            return outlook.tokens / self.cost.tokens_per_s(layout, round(outlook.context_mean))
        lengths = outlook.lengths
        slowest = 0.0
        for share in balance_by_tokens(lengths, layout.dp):
            mine = [lengths[i] for i in share]
            seconds = 0.0
            for chunk in chunk_by_length(mine, layout.micro_batch):
                longest = max(mine[j] for j in chunk)
                per_rank = self.cost.tokens_per_s(layout, longest) / layout.dp
                seconds += len(chunk) * longest / per_rank
            slowest = max(slowest, seconds)
        return max(slowest, 1e-12)

    def decide(self, outlook: Outlook, current: Layout | None) -> Decision:
        """Keep ``current`` or switch; raises NoLayoutFits when nothing fits the budget."""
        ranked = self.assess(outlook)
        if not ranked:
            raise NoLayoutFits(f"{self.stage}: no candidate layout has been profiled")
        fitting = [c for c in ranked if c.fits]
        if not fitting:
            least = min(ranked, key=lambda c: c.memory_bytes)
            raise NoLayoutFits(
                f"{self.stage}: no layout fits the budget of {_gib(self.budget(least.layout))} at context "
                f"{outlook.context_max} x {outlook.sequences} sequences; the smallest, {least.layout.key}, "
                f"needs {_gib(least.memory_bytes)}")
        best = fitting[0]
        if current is None:
            return self._decision(None, best.layout, ranked,
                                  f"start: fastest of {len(fitting)} fitting layouts at context "
                                  f"{outlook.context_mean:.0f} ({best.tokens_per_s:.0f} tok/s)")
        mine = next((c for c in ranked if c.layout == current), None)
        if mine is None or not mine.fits:
            why = "was never profiled" if mine is None else (
                f"needs {_gib(mine.memory_bytes)} > budget {_gib(self.budget(current))} at context {outlook.context_max}")
            return self._decision(current, best.layout, ranked, f"forced: {current.key} {why}")
        if best.layout == current:
            return self._decision(current, current, ranked, f"kept: still the fastest fitting layout "
                                                            f"({mine.tokens_per_s:.0f} tok/s)")
        speedup = mine.stage_seconds / best.stage_seconds
        if speedup < 1.0 + self.policy.hysteresis:
            return self._decision(current, current, ranked,
                                  f"kept: {best.layout.key} only x{speedup:.3f} faster (hysteresis "
                                  f"x{1 + self.policy.hysteresis:.2f})")
        iterations = max(1, min(outlook.iterations_left, self.policy.horizon))
        saved = (mine.stage_seconds - best.stage_seconds) * iterations
        cost = self.switch_cost(current, best.layout)
        if saved <= cost:
            return self._decision(current, current, ranked,
                                  f"kept: {best.layout.key} x{speedup:.2f} faster saves {saved:.2f} s over "
                                  f"{iterations} iterations, switching costs {cost:.2f} s")
        return self._decision(current, best.layout, ranked,
                              f"switched: {best.layout.key} x{speedup:.2f} faster at context "
                              f"{outlook.context_mean:.0f}, saves {saved:.2f} s over {iterations} iterations "
                              f"> switching {cost:.2f} s")

    def _decision(self, old: Layout | None, new: Layout, ranked: list[Candidate], reason: str) -> Decision:
        return Decision(self.stage, old, new, switched=old is not None and old != new, reason=reason,
                        candidates=ranked)


def _gib(n: int | None) -> str:
    return "unlimited" if n is None else f"{n / GIB:.2f} GiB"
