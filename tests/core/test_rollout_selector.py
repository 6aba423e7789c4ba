"""Rollout-stage layouts: the KV-cache guard, the engine-rebuild switch cost, the turn-by-turn rollout outlook."""

from __future__ import annotations

import pytest

from earl_core.config import ConfigError, ParallelismConfig, RunConfig
from earl_core.parallel import CostModel, Layout, ModelShape, NoLayoutFits, ProfilePoint, Selector, SelectorPolicy
from earl_core.parallel.memory import Work
from earl_core.parallel.rollout_planner import KVCacheDemand, RolloutPlanner, rollout_outlook
from earl_core.parallel.selector import Outlook

TINY = ModelShape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=433)
# KV bytes per token per rank: 2 (k, v) x 2 layers x 2 KV heads x 32 x 4 bytes = 1 KiB; half of it per TP=2 rank.
TOKEN = 1024


def _planner(mode: str = "auto", games: int = 16, workers: int = 2) -> RolloutPlanner:
    return RolloutPlanner(ParallelismConfig(mode=mode, profile_contexts="256,4096", hysteresis=0.05, horizon=5),
                          shape=TINY, workers=workers, games=games, engine="vllm", step_tokens=70, new_tokens=8,
                          max_context=8192, emit=lambda e: None)


def _selector(planner: RolloutPlanner, rebuild: dict[int, float], capacity: dict[int, int]) -> Selector:
    """The planner's own budget and switch cost over a profile in which DP=2 engines are faster at every
    context, TP=2 catching up as context grows (per-call costs shrink next to attention)."""
    planner.rebuild_s.update(rebuild)
    planner.capacity.update(capacity)
    dp2, tp2 = planner.layout(1), planner.layout(2)
    cost = CostModel([ProfilePoint(dp2, 256, 4000.0), ProfilePoint(dp2, 4096, 1500.0),
                      ProfilePoint(tp2, 256, 2000.0), ProfilePoint(tp2, 4096, 1200.0)])
    return Selector("rollout", [dp2, tp2], cost=cost, memory=planner.demand, budget_bytes=None,
                    budget_for=planner.budget, switch_cost=planner.switch_cost, policy=SelectorPolicy(0.05, 5))


def _outlook(context: int, games: int = 16, left: int = 10) -> Outlook:
    return Outlook(context_mean=context / 2, context_max=context, sequences=games, iterations_left=left,
                   work_tokens=float(context * games))


def test_rollout_layouts_split_the_ranks_into_engines():
    planner = _planner(games=16)
    assert planner.options == [1, 2]
    assert planner.layout(1) == Layout("rollout", tp=1, dp=2, micro_batch=8)  # two engines, 8 games each
    assert planner.layout(2) == Layout("rollout", tp=2, dp=1, micro_batch=16)
    # Profiling builds the other degree first and ends on the configured one.
    assert planner.profile_order() == [2, 1]
    assert _planner(mode="static").options == [1]


def test_kv_demand_by_hand_halves_per_rank_under_tp():
    demand = KVCacheDemand(TINY)
    assert demand.predict(Layout("rollout", tp=1, dp=2, micro_batch=8), Work(16, 1000)).total == 8 * 1000 * TOKEN
    assert demand.predict(Layout("rollout", tp=2, dp=1, micro_batch=16), Work(16, 1000)).total == 16 * 1000 * TOKEN // 2


def test_budget_is_the_measured_kv_capacity_of_the_layouts_engines():
    planner = _planner()
    planner.capacity.update({1: 100_000, 2: 200_000})
    assert planner.budget(planner.layout(1)) == 100_000 * TOKEN
    assert planner.budget(planner.layout(2)) == 200_000 * TOKEN // 2
    assert planner.budget(Layout("rollout", tp=4, dp=1, micro_batch=16)) is None  # never built: not known


def test_rollout_decision_table_kv_cache_decides_at_long_context():
    # As on a GPU: a TP=2 engine holds half the weights per rank, so it has more room for KV than two DP engines
    # together (capacities are what the engines report after allocating their cache).
    planner = _planner()
    selector = _selector(planner, {1: 5.0, 2: 20.0}, {1: 40_000, 2: 100_000})
    dp2 = planner.layout(1)
    # 8 games of 2K per DP engine = 16K tokens: fits; DP is faster.
    assert selector.decide(_outlook(2048), None).new == dp2
    assert selector.decide(_outlook(5000), None).new == dp2  # 8 x 5K = 40K: still fits
    # 8 x 5.5K = 44K does not fit a DP engine (vLLM would preempt); one TP engine holds 16 x 5.5K = 88K.
    forced = selector.decide(_outlook(5500), dp2)
    assert forced.new.tp == 2 and forced.switched and forced.reason.startswith("forced: tp1.dp2.mb8 needs")
    assert [c.fits for c in forced.candidates if c.layout == dp2] == [False]
    # 16 x 6.5K = 104K fits nowhere: a clear error naming the stage, not a hang in preemption.
    with pytest.raises(NoLayoutFits, match="rollout: no layout fits"):
        selector.decide(_outlook(6500), dp2)


def test_engine_rebuild_must_pay_back():
    planner = _planner()
    # Only KV decides here, so make TP the faster layout at long context to exercise the pay-back rule.
    planner.rebuild_s.update({1: 5.0, 2: 30.0})
    planner.capacity.update({1: 10**7, 2: 10**7})
    dp2, tp2 = planner.layout(1), planner.layout(2)
    cost = CostModel([ProfilePoint(dp2, 256, 4000.0), ProfilePoint(dp2, 4096, 400.0),
                      ProfilePoint(tp2, 256, 2000.0), ProfilePoint(tp2, 4096, 800.0)])
    selector = Selector("rollout", [dp2, tp2], cost=cost, memory=planner.demand, budget_bytes=None,
                        budget_for=planner.budget, switch_cost=planner.switch_cost, policy=SelectorPolicy(0.05, 5))
    # At 4K x 16 games, DP takes ~164 s, TP ~82 s: saving 82 s per iteration beats a 30 s rebuild.
    assert selector.decide(_outlook(8192, left=10), dp2).switched
    # With one iteration left and a tiny workload the rebuild does not pay back.
    small = Outlook(context_mean=3000, context_max=3000, sequences=16, iterations_left=1, work_tokens=2000.0)
    kept = selector.decide(small, dp2)
    assert not kept.switched and "switching costs 30.00 s" in kept.reason
    assert planner.switch_cost(dp2, planner.layout(1)) == 0.0


def test_rollout_outlook_uses_the_turn_contexts():
    records = [{"tokens": 900, "turn_context": [300, 500, 700, 880]},
               {"tokens": 500, "turn_context": [300, 480]}]
    out = rollout_outlook(records, iterations_left=3)
    assert out.context_mean == pytest.approx((300 + 500 + 700 + 880 + 300 + 480) / 6)
    assert out.context_max == 900 and out.sequences == 2 and out.tokens == 1400 and out.iterations_left == 3


def test_rollout_tp_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="parallelism.rollout_tp") as info:
        RunConfig.from_dict({"rollout": {"workers": 3}, "parallelism": {"rollout_tp": 2}})
    assert "(allowed: 1, 3)" in str(info.value)
    with pytest.raises(ConfigError, match="parallelism.rollout_tp"):
        RunConfig.from_dict({"rollout": {"workers": 2, "engine": "hf"}, "parallelism": {"rollout_tp": 2}})
    with pytest.raises(ConfigError, match="parallelism.rollout_tp"):
        ParallelismConfig(rollout_tp=0)


@pytest.mark.parametrize(("workers", "engine", "tp", "message"), [
    (3, "vllm", 2, "cannot form engines of 2"),
    (2, "vllm", 0, "cannot form engines of 0"),
    (2, "hf", 2, "the hf engine has no tensor parallelism"),
])
def test_rollout_groups_refuse_splits_they_cannot_run(workers: int, engine: str, tp: int, message: str) -> None:
    # One check serves the group's start and its relayout (a relayout once let an hf engine take TP=2).
    from earl_core.ray_exec.groups import _check_rollout_tp

    with pytest.raises(ValueError, match=message):
        _check_rollout_tp(workers, engine, tp)
    _check_rollout_tp(workers, "vllm", 1)
