"""The selector inside a training run: profile the learner's stage layouts at start-up, decide before each
iteration, apply the choice to the trainer workers, and check measured peaks against the budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from earl_core import events as ev
from earl_core.config import ParallelismConfig
from earl_core.parallel.cost import CostModel, ProfilePoint
from earl_core.parallel.layout import Layout, candidate_layouts
from earl_core.parallel.memory import GIB, MemoryModel, ModelShape, Work
from earl_core.parallel.selector import Outlook, Selector, SelectorPolicy

LEARNER_STAGES = ("experience", "train")
"""Stages the trainer workers run (rollout layouts belong to the rollout workers)."""
PEAK_KEYS = {"experience": "memory/experience_peak_bytes", "train": "memory/train_peak_bytes"}


class StageTarget(Protocol):
    """What the planner drives: the trainer worker group."""

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False) -> dict[str, float]: ...

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None: ...


def switch_cost(old: Layout, new: Layout) -> float:
    """Seconds a learner-stage switch costs. Micro-batch and checkpointing changes only change how the next
    forward pass is cut, so they are free; a change of TP or DP would move weights between ranks, which the
    trainer does not do yet, so such a switch is made impossible rather than guessed."""
    return 0.0 if (old.tp, old.dp, old.shard) == (new.tp, new.dp, new.shard) else float("inf")


class LayoutPlanner:
    """Per-run state of the selector for the learner's stages."""

    def __init__(self, cfg: ParallelismConfig, *, shape: ModelShape, workers: int, default_micro_batch: int,
                 emit: Callable[[ev.Event], None]) -> None:
        self.cfg = cfg
        self.shape = shape
        self.workers = workers
        self.tp = cfg.train_tp
        self.emit = emit
        self.budget = cfg.budget_bytes
        # Auto mode has no layout until its first decision; static mode runs the configured one throughout.
        self.current: dict[str, Layout] = {} if cfg.mode == "auto" else {
            s: Layout(s, tp=self.tp, dp=workers // self.tp, micro_batch=default_micro_batch, checkpointing=cfg.checkpointing and s == "train")
            for s in LEARNER_STAGES}
        self.memory = {s: MemoryModel(shape) for s in LEARNER_STAGES}
        self.samples: dict[str, list[tuple[Layout, Work, int]]] = {s: [] for s in LEARNER_STAGES}
        self.selectors: dict[str, Selector] = {}
        self.over_budget = 0

    @property
    def auto(self) -> bool:
        return self.cfg.mode == "auto"

    def candidates(self, stage: str) -> list[Layout]:
        """Layouts the trainer can run without moving weights: its TP degree (parallelism.train_tp), no FSDP."""
        every = candidate_layouts(stage, self.workers, heads=self.shape.heads, kv_heads=self.shape.kv_heads,
                                  micro_batches=tuple(self.cfg.micro_batch_list))
        return [c for c in every if c.tp == self.tp and c.shard == "none"]

    def start(self, target: StageTarget) -> None:
        """Static: apply and announce the configured layouts. Auto: profile every candidate, then build selectors."""
        if not self.auto:
            for stage, layout in self.current.items():
                target.set_layout(stage, layout.micro_batch, layout.checkpointing)
                self.emit(ev.SelectorDecision(stage=stage, old_layout=None, new_layout=layout.to_dict(),
                                              reason="static: parallelism.mode=static, micro-batch from algo.micro_batch, "
                                                     "checkpointing from parallelism.checkpointing",
                                              switched=False, candidates=[]))
            return
        started = time.perf_counter()
        profiled = 0
        for stage in LEARNER_STAGES:
            cost = CostModel()
            for context in self.cfg.context_list:
                for layout in sorted(self.candidates(stage), key=lambda c: (c.micro_batch, c.checkpointing)):
                    work = Work(sequences=layout.micro_batch * layout.dp, context=context)
                    if self.budget is not None and self.memory[stage].predict(layout, work).total > self.budget:
                        continue  # never run what is predicted not to fit, not even to measure it
                    r = target.profile(stage, layout.micro_batch, context, layout.checkpointing)
                    cost.add(ProfilePoint(layout, context, r["tokens_per_s"] * layout.dp))
                    self.samples[stage].append((layout, work, int(r["peak_bytes"])))
                    # Refit as we go, so the guard above uses what has been measured so far.
                    self.memory[stage].calibrate(self.samples[stage])
                    profiled += 1
            self.selectors[stage] = Selector(
                stage, self.candidates(stage), cost=cost, memory=self.memory[stage], budget_bytes=self.budget,
                switch_cost=switch_cost, policy=SelectorPolicy(hysteresis=self.cfg.hysteresis, horizon=self.cfg.horizon))
        seconds = time.perf_counter() - started
        cal = {s: self.memory[s].calibration for s in LEARNER_STAGES}
        self.emit(ev.Log("info", f"selector: profiled {profiled} layout x context points in {seconds:.1f} s; memory "
                                 "calibration " + ", ".join(f"{s}: overhead {c.overhead / GIB:.2f} GiB x{c.scale:.2f}"
                                                           for s, c in cal.items())))

    def before_iteration(self, iteration: int, records: Sequence[dict[str, Any]], iterations_left: int,
                         target: StageTarget) -> None:
        """Decide each learner stage's layout for this iteration's sequences (auto mode) and apply it."""
        if not self.auto or not records:
            return
        lengths = [len(r["token_ids"]) for r in records]
        outlook = Outlook(context_mean=sum(lengths) / len(lengths), context_max=max(lengths), sequences=len(lengths),
                          iterations_left=iterations_left, lengths=tuple(lengths))
        for stage in LEARNER_STAGES:
            decision = self.selectors[stage].decide(outlook, self.current.get(stage))
            if decision.new != self.current.get(stage):
                target.set_layout(stage, decision.new.micro_batch, decision.new.checkpointing)
                self.current[stage] = decision.new
            self.emit(ev.SelectorDecision(**decision.event_data(), iteration=iteration))

    def after_iteration(self, metrics: dict[str, float], records: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Measured peaks against the budget (an error event each time one is over, like an OOM); in auto mode
        the peaks also refine the memory calibration. Returns selector metrics."""
        out: dict[str, float] = {}
        context = max((len(r["token_ids"]) for r in records), default=0)
        for stage, key in PEAK_KEYS.items():
            peak = metrics.get(key)
            layout = self.current.get(stage)
            if peak is None or layout is None:
                continue
            if self.budget is not None and peak > self.budget:
                self.over_budget += 1
                self.emit(ev.Error(message=f"{stage} stage measured {peak / GIB:.2f} GiB, over the budget of "
                                           f"{self.budget / GIB:.2f} GiB with layout {layout.key} at context {context}",
                                   kind="MemoryBudgetExceeded", traceback=""))
            if self.auto and context:
                self.samples[stage].append((layout, Work(sequences=len(records), context=context), int(peak)))
                self.memory[stage].calibrate(self.samples[stage])
            out[f"selector/{stage}_micro_batch"] = float(layout.micro_batch)
        out["selector/over_budget_events"] = float(self.over_budget)
        return out
