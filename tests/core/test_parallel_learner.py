"""The selector's measurements on a real learner: peak memory, stage profiles, layout changes, the planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from earl_core import events as ev
from earl_core.config import AlgoConfig, ParallelismConfig
from earl_core.parallel import Layout, ModelShape
from earl_core.parallel.memory import MemoryModel, Work
from earl_core.parallel.planner import LayoutPlanner
from earl_core.parallel.probe import PeakMemory
from earl_core.rl.learner import Learner


def test_peak_memory_sees_a_short_lived_allocation() -> None:
    with PeakMemory() as outside:
        pass
    with PeakMemory() as peak:
        block = torch.ones(64, 1 << 20)  # 256 MiB, touched
        del block
    assert peak.bytes - outside.bytes > 200 * (1 << 20)


def test_profile_measures_without_training(protocol_model: Path) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(micro_batch=4), seed=0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    small = learner.profile("train", 1, 128)
    large = learner.profile("train", 8, 1024)
    assert small["tokens_per_s"] > 0 and large["peak_bytes"] > small["peak_bytes"]
    fwd = learner.profile("experience", 8, 1024)
    assert fwd["seconds"] < large["seconds"]  # no backward
    after = learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in learner.model.parameters())
    assert learner.train_micro_batch == 4 and not learner.checkpointing  # the running layout is restored


def test_checkpointing_keeps_gradients_and_saves_memory(protocol_model: Path) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(micro_batch=4), seed=0)
    ids = torch.randint(0, 300, (8, 1024), generator=torch.Generator().manual_seed(1))

    def grads() -> list[torch.Tensor]:
        learner.model.zero_grad(set_to_none=True)
        learner.model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        return [p.grad.clone() for p in learner.model.parameters()]

    plain = grads()
    learner.set_layout("train", 4, checkpointing=True)
    recomputed = grads()
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(plain, recomputed))
    learner.set_layout("train", 4, checkpointing=False)
    learner.model.zero_grad(set_to_none=True)
    plain_peak = learner.profile("train", 16, 2048)["peak_bytes"]
    ckpt_peak = learner.profile("train", 16, 2048, True)["peak_bytes"]
    assert ckpt_peak < plain_peak


def test_planner_on_a_real_learner(protocol_model: Path) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(micro_batch=2), seed=0)
    shape = ModelShape.from_hf_config(learner.model.config.to_dict())
    emitted: list[ev.Event] = []
    cfg = ParallelismConfig(mode="auto", micro_batches="1,8", profile_contexts="128,512", memory_budget_gib=64)
    planner = LayoutPlanner(cfg, shape=shape, workers=1, default_micro_batch=2, emit=emitted.append)
    planner.start(learner)
    records = [{"tokens": n} for n in (300, 500, 700, 900)]
    planner.before_iteration(0, records, iterations_left=3, target=learner)
    decisions = [e for e in emitted if isinstance(e, ev.SelectorDecision)]
    assert [d.stage for d in decisions] == ["experience", "train"]
    assert all(d.old_layout is None and not d.switched and d.reason.startswith("start") for d in decisions)
    assert {c["layout"] for c in decisions[1].candidates} == {"tp1.dp1.mb1", "tp1.dp1.mb8", "tp1.dp1.mb1+ckpt",
                                                                "tp1.dp1.mb8+ckpt"}
    train_layout = Layout.parse("train", decisions[1].new_layout["key"])
    assert learner.train_micro_batch == train_layout.micro_batch
    assert learner.checkpointing == train_layout.checkpointing
    assert learner.experience_micro_batch == Layout.parse("experience", decisions[0].new_layout["key"]).micro_batch
    out = planner.after_iteration({"memory/train_peak_bytes": 1e9, "memory/experience_peak_bytes": 1e9}, records)
    assert out["selector/over_budget_events"] == 0.0


class _DeviceOf:
    """A stage target with a fixed device: layouts whose micro-batch x context is over ``limit`` tokens run out
    of memory when profiled, as a GPU's allocator would report it; the others run at 1,000 tok/s per sequence."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.profiled: list[tuple[str, int, int]] = []
        self.layouts: dict[str, tuple[int, bool]] = {}

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False) -> dict[str, float]:
        self.profiled.append((stage, micro_batch, context))
        if micro_batch * context > self.limit:
            return {"seconds": 0.1, "tokens_per_s": 0.0, "out_of_memory": 1.0, "peak_bytes": 1e6}
        return {"seconds": 1.0, "tokens_per_s": 1000.0 * micro_batch, "peak_bytes": 1e6 + micro_batch * context}

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None:
        self.layouts[stage] = (micro_batch, checkpointing)

    def relayout(self, tp: int, fsdp: bool = False) -> float:
        raise AssertionError("one worker: no split change")


def test_a_layout_that_ran_out_of_memory_while_profiling_is_never_chosen(protocol_model: Path) -> None:
    shape = ModelShape.from_hf_config(Learner(protocol_model, algo=AlgoConfig(), seed=0).model.config.to_dict())
    emitted: list[ev.Event] = []
    cfg = ParallelismConfig(mode="auto", micro_batches="1,8", profile_contexts="128,1024", memory_budget_gib=1,
                            checkpointing=False)
    planner = LayoutPlanner(cfg, shape=shape, workers=1, default_micro_batch=1, emit=emitted.append)
    target = _DeviceOf(limit=4096)  # mb8 fits 128 tokens (1,024) but not 1,024 (8,192)
    planner.start(target)
    assert ("train", 8, 1024) in target.profiled
    assert any("ran out of device memory" in e.message for e in emitted if isinstance(e, ev.Log))
    # At short context mb8 is 8x faster and chosen; from the context where it ran out of memory on it is
    # predicted over the budget (whatever the bytes it reported): mb1 instead.
    planner.before_iteration(0, [{"tokens": 120}] * 8, iterations_left=1, target=target)
    assert target.layouts["train"][0] == 8
    planner.before_iteration(1, [{"tokens": 1024}] * 8, iterations_left=1, target=target)
    assert target.layouts["train"][0] == 1
    last = [e for e in emitted if isinstance(e, ev.SelectorDecision) and e.stage == "train"][-1]
    assert last.reason.startswith("forced")
    assert {c["layout"]: c["fits"] for c in last.candidates}["tp1.dp1.mb8"] is False


class _Ranks:
    """A stage target of ``workers`` ranks whose peaks are what the memory model's formula gives for its current
    split (plus a fixed 100 MB). Speed relative to plain DP: FSDP 0.9x, TP=2 0.5x (``tp2`` to change it), TP=4
    0.4x, recomputation ``ckpt`` (0.8x unless given)."""

    def __init__(self, shape: ModelShape, workers: int = 2, *, tp2: float = 0.5, ckpt: float = 0.8) -> None:
        self.memory = MemoryModel(shape)
        self.workers = workers
        self.speeds = {1: 1.0, 2: tp2, 4: 0.4}
        self.ckpt = ckpt
        self.split = (1, False)
        self.relayouts: list[tuple[int, bool]] = []
        self.layouts: dict[str, tuple[int, bool]] = {}

    def profile(self, stage: str, micro_batch: int, context: int, checkpointing: bool = False) -> dict[str, float]:
        tp, fsdp = self.split
        layout = Layout(stage, tp=tp, dp=self.workers // tp, micro_batch=micro_batch, checkpointing=checkpointing,
                        shard="fsdp" if fsdp and stage == "train" else "none")
        peak = self.memory.estimate(layout, Work(sequences=micro_batch * layout.dp, context=context)).dynamic + 1e8
        speed = self.speeds[tp] * (0.9 if fsdp else 1.0) * (self.ckpt if checkpointing else 1.0)
        return {"seconds": 1.0, "tokens_per_s": 1000.0 * speed, "peak_bytes": float(peak)}

    def set_layout(self, stage: str, micro_batch: int, checkpointing: bool = False) -> None:
        self.layouts[stage] = (micro_batch, checkpointing)

    def relayout(self, tp: int, fsdp: bool = False) -> float:
        self.split = (tp, fsdp)
        self.relayouts.append(self.split)
        return 0.01


# 134M parameters: big enough that where the training state is kept decides what fits a budget of ~2 GiB.
_BIG = ModelShape(hidden=1024, layers=8, heads=8, kv_heads=8, head_dim=128, intermediate=4096, vocab=1000)


def _fsdp_planner(workers: int, profile_contexts: str, budget_gib: float) -> tuple[LayoutPlanner, list[ev.Event]]:
    """An auto-mode planner with FSDP candidates over ``workers`` ranks of ``_BIG``, and the events it emits."""
    emitted: list[ev.Event] = []
    cfg = ParallelismConfig(mode="auto", micro_batches="1", profile_contexts=profile_contexts,
                            memory_budget_gib=budget_gib, train_fsdp=True)
    return LayoutPlanner(cfg, shape=_BIG, workers=workers, default_micro_batch=1, emit=emitted.append), emitted


def test_auto_mode_shards_with_fsdp_when_only_sharded_state_fits() -> None:
    # Weights, gradients and Adam moments of _BIG take 2.15 GB per replica, over the 1.9 GiB budget;
    # sharded over two ranks (or split by TP=2) they fit, and FSDP is the faster of the two.
    planner, emitted = _fsdp_planner(2, "128,512", 1.9)
    assert planner.splits() == [(1, "none"), (2, "none"), (1, "fsdp")]
    target = _Ranks(_BIG)
    planner.start(target)
    # Profiled on every split (out and back: each switch timed), the plain DP train layouts never ran.
    assert target.relayouts == [(2, False), (1, True), (1, False)]
    assert planner.relayout_s == pytest.approx(0.01)
    planner.before_iteration(0, [{"tokens": 400}] * 4, iterations_left=3, target=target)
    assert target.relayouts[-1] == (1, True) and planner.split == (1, "fsdp")
    decisions = {e.stage: e for e in emitted if isinstance(e, ev.SelectorDecision)}
    assert decisions["train"].new_layout["key"] == "tp1.dp2.mb1+fsdp"
    fits = {c["layout"]: c["fits"] for c in decisions["train"].candidates}
    assert fits == {"tp1.dp2.mb1+fsdp": True, "tp1.dp2.mb1+fsdp+ckpt": True, "tp2.dp1.mb1": True,
                    "tp2.dp1.mb1+ckpt": True}
    out = planner.after_iteration({"memory/train_peak_bytes": 1e9, "memory/experience_peak_bytes": 1e9,
                                   "perf/train_s": 1.0, "perf/experience_s": 0.5}, [{"tokens": 400}] * 4)
    assert out["selector/train_fsdp"] == 1.0 and out["selector/train_tp"] == 1.0


def test_auto_mode_runs_fsdp_by_tp_in_2d_when_that_is_the_fastest_layout_that_fits() -> None:
    # Four ranks of _BIG. At 2,048 tokens under a 1.5 GiB budget (predicted peaks: tp1.dp4+fsdp 2.64 GiB,
    # tp2.dp2 1.77, tp2.dp2+fsdp 1.32, tp4.dp1 0.82) the plain FSDP and TP=2 layouts no longer fit; of those that
    # do, FSDP x TP (2 replicas at 0.7 x 0.9 of a plain rank's speed) beats TP=4 (1 at 0.4) and the recomputing
    # ones (0.3x: tp1.dp4+fsdp+ckpt makes 4 x 0.27).
    planner, emitted = _fsdp_planner(4, "512,2048", 1.5)
    assert planner.splits() == [(1, "none"), (2, "none"), (4, "none"), (1, "fsdp"), (2, "fsdp")]
    target = _Ranks(_BIG, workers=4, tp2=0.7, ckpt=0.3)
    planner.start(target)
    assert (2, True) in target.relayouts and (4, True) not in target.relayouts  # TP=4 leaves one DP rank
    planner.before_iteration(0, [{"tokens": 400}] * 4, iterations_left=3, target=target)
    assert planner.split == (1, "fsdp")
    planner.before_iteration(1, [{"tokens": 2000}] * 4, iterations_left=3, target=target)
    assert planner.split == (2, "fsdp") and target.split == (2, True)
    last = [e for e in emitted if isinstance(e, ev.SelectorDecision) and e.stage == "train"][-1]
    assert last.new_layout["key"] == "tp2.dp2.mb1+fsdp"
    fits = {c["layout"]: c["fits"] for c in last.candidates}
    assert fits["tp1.dp4.mb1+fsdp"] is False and fits["tp2.dp2.mb1"] is False and fits["tp4.dp1.mb1"] is True


def test_running_out_of_memory_without_a_budget_asks_for_one(protocol_model: Path) -> None:
    shape = ModelShape.from_hf_config(Learner(protocol_model, algo=AlgoConfig(), seed=0).model.config.to_dict())
    emitted: list[ev.Event] = []
    cfg = ParallelismConfig(mode="auto", micro_batches="1,8", profile_contexts="128,1024")
    LayoutPlanner(cfg, shape=shape, workers=1, default_micro_batch=1, emit=emitted.append).start(_DeviceOf(4096))
    warnings = [e.message for e in emitted if isinstance(e, ev.Log) and e.level == "warning"]
    assert len(warnings) == 1 and "parallelism.memory_budget_gib" in warnings[0]
