"""The selector inside a training run: profile the learner's stage layouts at start-up, decide before each
iteration, apply the choice to the trainer workers, and check measured peaks against the budget."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from earl_core import events as ev
from earl_core.config import ParallelismConfig
from earl_core.parallel.cost import CostModel, ProfilePoint
from earl_core.parallel.layout import Layout, candidate_layouts, tp_degrees
from earl_core.parallel.memory import GIB, MemoryModel, ModelShape, Work
from earl_core.parallel.selector import Outlook, Selector, SelectorPolicy

LEARNER_STAGES = ("experience", "train")
"""Stages the trainer workers run (rollout layouts belong to the rollout workers)."""
PEAK_KEYS = {"experience": "memory/experience_peak_bytes", "train": "memory/train_peak_bytes"}
TIME_KEYS = {"experience": "perf/experience_s", "train": "perf/train_s"}


class StageTarget(Protocol):
    """What the planner drives: the trainer worker group."""

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False) -> dict[str, float]: ...

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None: ...

    def relayout(self, tp: int, fsdp: bool = False) -> float: ...


Split = tuple[int, str]
"""How the trainer ranks are arranged: (TP degree, sharding over the DP ranks: "none" or "fsdp")."""


class LayoutPlanner:
    """Per-run state of the selector for the learner's stages.

    Both stages run on the same trainer ranks, so they share one split (TP x DP, FSDP-sharded or not): the train
    stage's selector chooses it (a change moves weights and optimizer state between the ranks, at the switch cost
    measured while profiling), and the experience stage chooses its micro-batch among the layouts of that split
    (profiled on it: its forward passes run through the sharded model when the split is FSDP).
    """

    def __init__(self, cfg: ParallelismConfig, *, shape: ModelShape, workers: int, default_micro_batch: int,
                 emit: Callable[[ev.Event], None]) -> None:
        self.cfg = cfg
        self.shape = shape
        self.workers = workers
        self.emit = emit
        self.budget = cfg.budget_bytes
        self.split: Split = (cfg.train_tp, "fsdp" if cfg.train_fsdp and cfg.mode == "static" else "none")
        """The trainer's split now (auto mode starts unsharded at train_tp)."""
        # Auto mode has no layout until its first decision; static mode runs the configured one throughout.
        self.current: dict[str, Layout] = {} if cfg.mode == "auto" else {
            s: Layout(s, tp=self.tp, dp=workers // self.tp, micro_batch=default_micro_batch,
                      checkpointing=cfg.checkpointing and s == "train",
                      shard=self.split[1] if s == "train" else "none")
            for s in LEARNER_STAGES}
        self.memory = {s: MemoryModel(shape) for s in LEARNER_STAGES}
        self.samples: dict[str, list[tuple[Layout, Work, int]]] = {s: [] for s in LEARNER_STAGES}
        self.train_selector: Selector | None = None
        self.experience_selectors: dict[Split, Selector] = {}
        self._experience_split: Split | None = None
        """The split the experience stage's current layout was chosen on."""
        self.relayout_s: float | None = None
        """Measured seconds of one split switch (mean of those made while profiling)."""
        self.switching_s = 0.0
        """Seconds spent switching TP/DP during the run."""
        self.over_budget = 0
        self._outlook: Outlook | None = None

    @property
    def auto(self) -> bool:
        return self.cfg.mode == "auto"

    @property
    def tp(self) -> int:
        """TP degree the trainer runs now."""
        return self.split[0]

    def tp_options(self) -> list[int]:
        """TP degrees the trainer may run: the configured one in static mode; in auto mode every degree that
        divides the workers, the heads and the MLP width."""
        if not self.auto:
            return [self.cfg.train_tp]
        return [tp for tp in tp_degrees(self.workers, self.shape.heads, self.shape.kv_heads)
                if self.shape.kv_heads % tp == 0 and self.shape.intermediate % tp == 0]

    def splits(self) -> list[Split]:
        """Splits the trainer may run: the configured one in static mode; in auto mode each TP degree unsharded,
        and with parallelism.train_fsdp also each TP degree sharded with FSDP over its DP ranks (two or more;
        with TP > 1 that is 2-D FSDP x TP)."""
        if not self.auto:
            return [self.split]
        out: list[Split] = [(tp, "none") for tp in self.tp_options()]
        if self.cfg.train_fsdp:
            out += [(tp, "fsdp") for tp in self.tp_options() if self.workers // tp >= 2]
        return out

    def candidates(self, stage: str, split: Split | None = None) -> list[Layout]:
        """Layouts auto mode chooses among, of one split or of all it may run. Experience layouts carry no
        sharding: those of a TP degree are the candidates of each of its splits."""
        every = candidate_layouts(stage, self.workers, heads=self.shape.heads, kv_heads=self.shape.kv_heads,
                                  micro_batches=tuple(self.cfg.micro_batch_list))
        splits = self.splits() if split is None else [split]
        if stage != "train":
            return [c for c in every if c.tp in {tp for tp, _ in splits}]
        return [c for c in every if (c.tp, c.shard) in splits]

    def switch_cost(self, old: Layout, new: Layout) -> float:
        """Seconds a switch costs. Micro-batch and checkpointing changes only change how the next forward pass
        is cut: free. A split change (TP/DP, sharding) moves weights and optimizer state: what it measured
        while profiling."""
        if (old.tp, old.dp, old.shard) == (new.tp, new.dp, new.shard):
            return 0.0
        return self.relayout_s if self.relayout_s is not None else float("inf")

    def _relayout(self, target: StageTarget, split: Split) -> float:
        seconds = target.relayout(split[0], split[1] == "fsdp")
        self.split = split
        return seconds

    def start(self, target: StageTarget) -> None:
        """Static: apply and announce the configured layouts. Auto: profile every candidate on every TP degree
        (timing the switches between them), then build the selectors."""
        if not self.auto:
            for stage, layout in self.current.items():
                target.set_layout(stage, layout.micro_batch, layout.checkpointing)
                self.emit(ev.SelectorDecision(stage=stage, old_layout=None, new_layout=layout.to_dict(),
                                              reason="static: parallelism.mode=static, micro-batch from algo.micro_batch, "
                                                     "checkpointing from parallelism.checkpointing, "
                                                     "TP from parallelism.train_tp, "
                                                     "sharding from parallelism.train_fsdp",
                                              switched=False, candidates=[]))
            return
        started = time.perf_counter()
        profiled = oom = 0
        train_cost = CostModel()
        # Experience layouts of one TP degree look the same on every split of it but run differently (through
        # the FSDP-sharded model or not): one cost model per split.
        experience_costs = {split: CostModel() for split in self.splits()}
        switches: list[float] = []
        first = self.split
        for split in [first] + [t for t in self.splits() if t != first]:
            if split != self.split:
                switches.append(self._relayout(target, split))
            for stage in LEARNER_STAGES:
                cost = train_cost if stage == "train" else experience_costs[split]
                for context in self.cfg.context_list:
                    for layout in sorted(self.candidates(stage, split), key=lambda c: (c.micro_batch, c.checkpointing)):
                        work = Work(sequences=layout.micro_batch * layout.dp, context=context)
                        if self.budget is not None and self.memory[stage].predict(layout, work).total > self.budget:
                            continue  # never run what is predicted not to fit, not even to measure it
                        r = target.profile(stage, layout.micro_batch, context, layout.checkpointing)
                        peak = int(r["peak_bytes"])
                        if r.get("out_of_memory"):
                            # It needed more than the device could give: as a sample, more than the budget
                            # (or than what it reached), so the calibrated model rules it out from here on.
                            peak = max(peak, (self.budget or 0) + 1)
                            oom += 1
                        else:
                            cost.add(ProfilePoint(layout, context, r["tokens_per_s"] * layout.dp))
                        self.samples[stage].append((layout, work, peak))
                        # Refit as we go, so the guard above uses what has been measured so far.
                        self.memory[stage].calibrate(self.samples[stage])
                        profiled += 1
        if self.split != first:
            switches.append(self._relayout(target, first))
        self.relayout_s = sum(switches) / len(switches) if switches else None
        policy = SelectorPolicy(hysteresis=self.cfg.hysteresis, horizon=self.cfg.horizon)
        self.train_selector = Selector("train", self.candidates("train"), cost=train_cost,
                                       memory=self.memory["train"], budget_bytes=self.budget,
                                       switch_cost=self.switch_cost, policy=policy)
        # The experience stage's memory model is shared by the splits: under FSDP its peak is only lower (the
        # policy's blocks are gathered one at a time), so the unsharded fit stays on the safe side.
        self.experience_selectors = {
            split: Selector("experience", self.candidates("experience", split), cost=experience_costs[split],
                            memory=self.memory["experience"], budget_bytes=self.budget,
                            switch_cost=self.switch_cost, policy=policy)
            for split in self.splits()}
        seconds = time.perf_counter() - started
        cal = {s: self.memory[s].calibration for s in LEARNER_STAGES}
        switch = (f"; a split switch (TP/DP/FSDP) takes {self.relayout_s:.2f} s"
                  if self.relayout_s is not None else "")
        failed = f" ({oom} ran out of device memory)" if oom else ""
        if oom and self.budget is None:
            # Without a budget every layout "fits": the ones that ran out of memory could still be chosen.
            self.emit(ev.Log("warning", f"selector: {oom} profiled layouts ran out of device memory and no "
                                        "parallelism.memory_budget_gib is set; set it (e.g. the device's memory) "
                                        "so the selector rules out layouts that do not fit"))
        self.emit(ev.Log("info", f"selector: profiled {profiled} layout x context points{failed} in {seconds:.1f} s{switch}; "
                                 "memory calibration " + ", ".join(f"{s}: overhead {c.overhead / GIB:.2f} GiB x{c.scale:.2f}"
                                                                   for s, c in cal.items())))

    def before_iteration(self, iteration: int, records: Sequence[dict[str, Any]], iterations_left: int,
                         target: StageTarget) -> None:
        """Decide each learner stage's layout for this iteration's sequences (auto mode) and apply it."""
        if not self.auto or not records:
            return
        assert self.train_selector is not None, "start() first"
        lengths = [r["tokens"] for r in records]
        outlook = Outlook(context_mean=sum(lengths) / len(lengths), context_max=max(lengths), sequences=len(lengths),
                          iterations_left=iterations_left, lengths=tuple(lengths))
        self._outlook = outlook
        train = self.train_selector.decide(outlook, self.current.get("train"))
        split = (train.new.tp, train.new.shard)
        if split != self.split:
            t = time.perf_counter()
            self._relayout(target, split)
            self.switching_s += time.perf_counter() - t
        old_exp = self.current.get("experience")
        following = old_exp is not None and self._experience_split != self.split
        experience = self.experience_selectors[self.split].decide(outlook, None if following else old_exp)
        self._experience_split = self.split
        if following:
            to = f"tp{self.tp}" + ("+fsdp" if self.split[1] == "fsdp" else "")
            experience = dataclasses.replace(experience, old=old_exp, switched=True,
                                             reason=f"follows the train stage to {to}: {experience.reason}")
        for decision in (experience, train):
            if decision.new != self.current.get(decision.stage):
                target.set_layout(decision.stage, decision.new.micro_batch, decision.new.checkpointing)
                self.current[decision.stage] = decision.new
            self.emit(ev.SelectorDecision(**decision.event_data(), iteration=iteration))

    def after_iteration(self, metrics: dict[str, float], records: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Measured peaks against the budget (an error event each time one is over, like an OOM); in auto mode
        the peaks also refine the memory calibration. Returns selector metrics."""
        out: dict[str, float] = {}
        context = max((r["tokens"] for r in records), default=0)
        if self.auto and self._outlook is not None and self.train_selector is not None:
            # How long the stages really took corrects the profile-based predictions of the next decisions.
            for stage, selector in (("experience", self.experience_selectors[self.split]),
                                    ("train", self.train_selector)):
                seconds = metrics.get(TIME_KEYS[stage])
                if seconds:
                    out[f"selector/{stage}_predicted_s"] = selector.stage_seconds(self.current[stage], self._outlook)
                    selector.observe(self.current[stage], self._outlook, seconds)
            self._outlook = None
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
        out["selector/train_tp"] = float(self.tp)
        out["selector/train_fsdp"] = float(self.split[1] == "fsdp")
        out["selector/switching_s"] = self.switching_s
        out["selector/over_budget_events"] = float(self.over_budget)
        return out
