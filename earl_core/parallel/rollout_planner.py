"""The selector for the rollout stage: profile each engine layout (TP x DP of the rollout ranks) at start-up, re-pick
it before each iteration's games, and rebuild the engines when the choice changes.

A rollout layout splits the rollout ranks into ``dp`` vLLM engines of ``tp`` tensor-parallel ranks. vLLM fixes an
engine's degree when it starts, so a switch rebuilds the engines and hands them the current weights from the
trainer's object store; that rebuild is timed while profiling and charged to every switch. What must fit is the
KV cache: all the games an engine plays are in flight together, and past its KV capacity (measured: what the
engine allocated) vLLM preempts and recomputes sequences. A TP engine holds each token's share of the KV heads on
each rank, so it holds more tokens: the layout that fits long contexts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from earl_core import events as ev
from earl_core.config import ParallelismConfig
from earl_core.parallel.cost import CostModel, ProfilePoint
from earl_core.parallel.layout import Layout, tp_degrees
from earl_core.parallel.memory import MemoryEstimate, MemoryModel, ModelShape, Work
from earl_core.parallel.selector import Outlook, Selector, SelectorPolicy


class RolloutTarget(Protocol):
    """What the planner drives: the rollout worker group."""

    tp: int

    def profile(self, *, games: int, context: int, step_tokens: int, new_tokens: int) -> dict[str, float]: ...

    def relayout(self, tp: int, weights_ref: Any) -> float: ...

    def kv_capacity_tokens(self) -> int | None: ...


class KVCacheDemand:
    """Bytes of KV cache one rank of an engine needs for its share of the games at the longest context (the
    memory a rollout layout must fit: weights and activations have their own, fixed, room in the engine)."""

    def __init__(self, shape: ModelShape) -> None:
        self.model = MemoryModel(shape)

    def predict(self, layout: Layout, work: Work) -> MemoryEstimate:
        kv = self.model.estimate(layout, work).kv_cache
        return MemoryEstimate(weights=0, gradients=0, optimizer=0, activations=0, kv_cache=kv, overhead=0)


def rollout_outlook(records: Sequence[dict[str, Any]], iterations_left: int = 1) -> Outlook:
    """The rollout work of games like ``records``: each agent turn processes its conversation at the context it
    had then; every conversation's whole length is the tokens advanced."""
    turns = [c for r in records for c in r.get("turn_context", [])]
    lengths = [r["tokens"] for r in records]
    mean = sum(turns) / len(turns) if turns else sum(lengths) / max(len(lengths), 1)
    return Outlook(context_mean=max(mean, 1.0), context_max=max(lengths, default=1), sequences=len(records),
                   iterations_left=iterations_left, work_tokens=float(sum(lengths)))


class RolloutPlanner:
    """Per-run state of the rollout stage's selector."""

    def __init__(self, cfg: ParallelismConfig, *, shape: ModelShape, workers: int, games: int, engine: str,
                 step_tokens: int, new_tokens: int, max_context: int, emit: Callable[[ev.Event], None],
                 whole_devices: bool = True) -> None:
        self.cfg = cfg
        self.shape = shape
        self.workers = workers
        self.games = games
        self.step_tokens = step_tokens
        self.new_tokens = new_tokens
        self.max_context = max_context
        self.emit = emit
        # vLLM's tensor parallelism needs whole devices per rank: on shared GPUs only TP=1 is offered.
        self.options = [cfg.rollout_tp]
        if cfg.mode == "auto" and engine == "vllm" and whole_devices:
            self.options = tp_degrees(workers, shape.heads, shape.kv_heads)
        self.demand = KVCacheDemand(shape)
        self.capacity: dict[int, int | None] = {}
        """KV cache tokens per engine, by TP degree (measured on the engines built)."""
        self.rebuild_s: dict[int, float] = {}
        """Seconds to build engines of each TP degree and load the weights (measured)."""
        self.selector: Selector | None = None
        self.current: Layout = self.layout(cfg.rollout_tp)
        self.switching_s = 0.0
        self._planned: Outlook | None = None

    @property
    def auto(self) -> bool:
        return len(self.options) > 1

    def layout(self, tp: int) -> Layout:
        dp = self.workers // tp
        return Layout("rollout", tp=tp, dp=dp, micro_batch=min(-(-self.games // dp), 4096))

    def profile_order(self) -> list[int]:
        """TP degrees in profiling order: the configured one last, so profiling ends on it (the group is built
        on the first)."""
        first = [t for t in self.options if t != self.cfg.rollout_tp]
        return first + [self.cfg.rollout_tp]

    def budget(self, layout: Layout) -> int | None:
        """Bytes of KV cache one rank of the layout's engines holds (from the capacity measured on it)."""
        tokens = self.capacity.get(layout.tp)
        if tokens is None:
            return None
        return tokens * self.demand.predict(layout, Work(sequences=layout.dp, context=1)).kv_cache

    def switch_cost(self, old: Layout, new: Layout) -> float:
        return 0.0 if old.tp == new.tp else self.rebuild_s.get(new.tp, math.inf)

    def start(self, target: RolloutTarget, *, built_s: float, weights: Callable[[], Any]) -> None:
        """Static (one option): announce the layout. Auto: profile each TP degree at each profile context,
        rebuilding the engines in between (timed), then build the selector. ``built_s`` is how long building
        the group the target is now took; ``weights`` gives the current weights' reference for a rebuild."""
        self.capacity[target.tp] = target.kv_capacity_tokens()
        self.rebuild_s[target.tp] = built_s
        self.current = self.layout(target.tp)
        if not self.auto:
            why = ("static: parallelism.mode=static, TP from parallelism.rollout_tp" if self.cfg.mode != "auto" else
                   f"only layout: {self.workers} rollout worker(s) give no other TP x DP split for this engine")
            self.emit(ev.SelectorDecision(stage="rollout", old_layout=None, new_layout=self.current.to_dict(),
                                          reason=why, switched=False, candidates=[]))
            return
        started = time.perf_counter()
        costs = CostModel()
        points = 0
        longest = self.max_context - self.step_tokens - self.new_tokens
        contexts = sorted({min(c, longest) for c in self.cfg.context_list if c > self.step_tokens})
        for tp in self.profile_order():
            if tp != target.tp:
                self.rebuild_s[tp] = target.relayout(tp, weights())
                self.capacity[tp] = target.kv_capacity_tokens()
            layout = self.layout(tp)
            budget = self.budget(layout)
            for context in contexts:
                need = self.demand.predict(layout, Work(sequences=self.games, context=context)).total
                if budget is not None and need > budget:
                    continue  # the engines could not hold these games at once: vLLM would preempt, not just run
                r = target.profile(games=self.games, context=context, step_tokens=self.step_tokens,
                                   new_tokens=self.new_tokens)
                costs.add(ProfilePoint(layout, context, r["tokens_per_s"]))
                points += 1
        self.current = self.layout(target.tp)
        policy = SelectorPolicy(hysteresis=self.cfg.hysteresis, horizon=self.cfg.horizon)
        self.selector = Selector("rollout", [self.layout(t) for t in self.options], cost=costs, memory=self.demand,
                                 budget_bytes=None, budget_for=self.budget, switch_cost=self.switch_cost, policy=policy)
        rebuilds = ", ".join(f"tp{t}: {s:.1f} s" for t, s in sorted(self.rebuild_s.items()))
        self.emit(ev.Log("info", f"selector: profiled {points} rollout layout x context points in "
                                 f"{time.perf_counter() - started:.1f} s; an engine rebuild takes {rebuilds}"))

    def before_rollout(self, iteration: int, last_records: Sequence[dict[str, Any]], iterations_left: int,
                       target: RolloutTarget, weights: Callable[[], Any]) -> None:
        """Decide the layout for this iteration's games from the last iteration's (the shortest profiled context
        before any game), rebuild the engines when it changes."""
        if self.selector is None:
            return
        if last_records:
            outlook = rollout_outlook(last_records, iterations_left)
        else:
            first = min(self.cfg.context_list)
            outlook = Outlook(context_mean=first, context_max=first, sequences=self.games,
                              iterations_left=iterations_left, work_tokens=float(first * self.games))
        decision = self.selector.decide(outlook, self.current)
        if decision.new.tp != target.tp:
            seconds = target.relayout(decision.new.tp, weights())
            self.switching_s += seconds
            self.rebuild_s[decision.new.tp] = seconds  # the latest measure of what a switch costs
            self.capacity[decision.new.tp] = target.kv_capacity_tokens()
        self.current = decision.new
        self.emit(ev.SelectorDecision(**decision.event_data(), iteration=iteration))

    def after_rollout(self, records: Sequence[dict[str, Any]], seconds: float) -> dict[str, float]:
        """Correct the profile with how long this iteration's games took; returns rollout selector metrics."""
        out = {"selector/rollout_tp": float(self.current.tp), "selector/rollout_engines": float(self.current.dp)}
        if self.selector is not None and records and seconds > 0:
            outlook = rollout_outlook(records)
            if self.selector.cost.knows(self.current):
                out["selector/rollout_predicted_s"] = self.selector.stage_seconds(self.current, outlook)
                self.selector.observe(self.current, outlook, seconds)
            out["selector/rollout_switching_s"] = self.switching_s
        return out
