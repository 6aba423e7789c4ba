"""Parallelism Selector: layout arithmetic, memory and cost models, decision tables, budget guard, hysteresis."""

from __future__ import annotations

import pytest

from earl_core.errors import ConfigError
import jsonschema

from earl_core.events import SelectorDecision, load_schema
from earl_core.parallel import (
    CostModel,
    Layout,
    MemoryModel,
    ModelShape,
    NoLayoutFits,
    Outlook,
    ProfilePoint,
    Selector,
    SelectorPolicy,
    Work,
    candidate_layouts,
    fit_line,
    tp_degrees,
)
from earl_core.parallel.memory import GIB

TINY = ModelShape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=433)


# ---- layouts ---------------------------------------------------------------------------------------
def test_layout_key_round_trip_and_workers():
    lay = Layout("train", tp=2, dp=4, micro_batch=8, shard="fsdp", checkpointing=True)
    assert lay.key == "tp2.dp4.mb8+fsdp+ckpt"
    assert lay.workers == 8
    assert Layout.parse("train", lay.key) == lay
    assert Layout.parse("rollout", "TP1.DP2.MB16") == Layout("rollout", tp=1, dp=2, micro_batch=16)


@pytest.mark.parametrize("kwargs, field", [
    ({"stage": "eval"}, "parallelism.stage"),
    ({"stage": "train", "tp": 0}, "parallelism.train.tp"),
    ({"stage": "train", "dp": 1.5}, "parallelism.train.dp"),
    ({"stage": "train", "micro_batch": True}, "parallelism.train.micro_batch"),
    ({"stage": "train", "shard": "zero3"}, "parallelism.train.shard"),
    ({"stage": "rollout", "checkpointing": True}, "parallelism.rollout.shard"),
])
def test_bad_layout_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        Layout(**kwargs)
    assert err.value.field == field and err.value.allowed


def test_unreadable_layout_key():
    with pytest.raises(ConfigError, match="tpT.dpD.mbM"):
        Layout.parse("train", "tp2-dp2")


def test_tp_degrees_split_heads_evenly():
    assert tp_degrees(4, heads=4, kv_heads=2) == [1, 2, 4]  # tp 4 replicates each of the 2 KV heads twice
    assert tp_degrees(8, heads=4, kv_heads=2) == [1, 2, 4]
    assert tp_degrees(6, heads=12, kv_heads=4) == [1, 2]  # 3 and 6 split neither 4 KV heads nor are multiples
    assert tp_degrees(3, heads=4, kv_heads=4) == [1]


def test_candidates_use_every_worker():
    rollout = candidate_layouts("rollout", 4, heads=4, kv_heads=2, micro_batches=(4, 8))
    assert {(c.tp, c.dp, c.micro_batch) for c in rollout} == {(1, 4, 4), (1, 4, 8), (2, 2, 4), (2, 2, 8), (4, 1, 4), (4, 1, 8)}
    train = candidate_layouts("train", 2, heads=4, kv_heads=2, micro_batches=(8,))
    keys = sorted(c.key for c in train)
    assert keys == sorted(["tp1.dp2.mb8", "tp1.dp2.mb8+ckpt", "tp1.dp2.mb8+fsdp", "tp1.dp2.mb8+fsdp+ckpt",
                           "tp2.dp1.mb8", "tp2.dp1.mb8+ckpt"])
    assert all(c.workers == 2 for c in train)


# ---- memory model ----------------------------------------------------------------------------------
def test_parameter_count_matches_the_real_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=433, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    assert ModelShape.from_hf_config(config.to_dict()).params == sum(p.numel() for p in model.parameters())


def test_kv_cache_by_hand():
    lay = Layout("rollout", tp=1, dp=2, micro_batch=8)
    est = MemoryModel(TINY).estimate(lay, Work(sequences=10, context=1000))
    # 5 sequences on the fullest replica x 1000 tokens x (K and V) x 2 layers x 2 KV heads x 32 dims x 4 bytes
    assert est.kv_cache == 5 * 1000 * 2 * 2 * 2 * 32 * 4
    assert est.gradients == est.optimizer == 0
    tp2 = MemoryModel(TINY).estimate(Layout("rollout", tp=2, dp=1, micro_batch=8), Work(10, 1000))
    assert tp2.weights == est.weights // 2


def test_training_memory_moves_the_right_way():
    mm = MemoryModel(TINY)
    work = Work(sequences=64, context=4096)

    def total(**kw):
        return mm.estimate(Layout("train", **kw), work)

    base = total(dp=2, micro_batch=8)
    assert total(dp=2, micro_batch=16).activations > base.activations
    assert mm.estimate(Layout("train", dp=2, micro_batch=8), Work(64, 8192)).activations > base.activations
    assert total(dp=2, micro_batch=8, checkpointing=True).activations < base.activations
    fsdp = total(dp=2, micro_batch=8, shard="fsdp")
    assert fsdp.optimizer == base.optimizer // 2
    assert base.optimizer == 2 * TINY.params * 4
    assert total(tp=2, micro_batch=8).weights == base.weights // 2


def test_calibration_fits_and_never_under_predicts_a_sample():
    mm = MemoryModel(TINY)
    samples = []
    for mb, ctx in [(1, 512), (4, 1024), (8, 2048), (16, 4096)]:
        lay, work = Layout("train", micro_batch=mb), Work(16, ctx)
        measured = 300_000_000 + int(1.7 * mm.estimate(lay, work).dynamic)
        samples.append((lay, work, measured + (mb % 3) * 1000))  # a little noise
    cal = mm.calibrate(samples)
    assert cal.samples == 4 and cal.scale == pytest.approx(1.7, rel=1e-3)
    assert cal.overhead == pytest.approx(300_000_000, rel=1e-3)
    for lay, work, measured in samples:
        assert mm.predict(lay, work).total >= measured


# ---- cost model ------------------------------------------------------------------------------------
def test_fit_line_recovers_a_line_and_clamps_noise():
    fit = fit_line([(c, 1e-4 + 2e-8 * c) for c in (256, 1024, 4096)])
    assert fit.fixed == pytest.approx(1e-4) and fit.per_context == pytest.approx(2e-8)
    assert fit.seconds_per_token(8192) == pytest.approx(1e-4 + 2e-8 * 8192)
    assert fit_line([(256, 2e-4), (1024, 1e-4)]).per_context == 0.0  # cheaper tokens at longer context: noise
    assert fit_line([(512, 3e-4)]).seconds_per_token(99999) == pytest.approx(3e-4)


def test_cost_model_predicts_unprofiled_context():
    lay = Layout("rollout", tp=1, dp=2, micro_batch=8)
    cm = CostModel([ProfilePoint(lay, 512, 1000.0), ProfilePoint(lay, 2048, 500.0)])
    # 1/1000 = a + 512 b, 1/500 = a + 2048 b  ->  b = 0.001/1536
    b = 0.001 / 1536
    assert cm.tokens_per_s(lay, 8192) == pytest.approx(1 / (0.001 + (8192 - 512) * b))
    with pytest.raises(ValueError):
        cm.add(ProfilePoint(lay, 512, 0.0))


# ---- selector --------------------------------------------------------------------------------------
TP1 = Layout("rollout", tp=1, dp=2, micro_batch=8)
TP2 = Layout("rollout", tp=2, dp=1, micro_batch=8)


def crossing_profile() -> CostModel:
    """TP1 (two replicas) is faster at short context, TP2 at long context; they cross at 4096 tokens."""
    points = []
    for ctx in (512, 2048, 8192):
        points.append(ProfilePoint(TP1, ctx, 1.0 / (1e-4 + 4e-8 * ctx)))
        points.append(ProfilePoint(TP2, ctx, 1.0 / (2e-4 + 1.5559e-8 * ctx)))
    return CostModel(points)


def selector(budget: int | None = None, switch: float = 0.0, **policy) -> Selector:
    return Selector("rollout", [TP1, TP2], cost=crossing_profile(), memory=MemoryModel(TINY), budget_bytes=budget,
                    switch_cost=lambda a, b: switch, policy=SelectorPolicy(**policy))


@pytest.mark.parametrize("context, chosen", [(256, TP1), (1024, TP1), (3000, TP1), (6000, TP2), (16384, TP2)])
def test_decision_table(context, chosen):
    decision = selector().decide(Outlook(context_mean=context, context_max=context, sequences=64), None)
    assert decision.new == chosen
    assert not decision.switched and decision.reason.startswith("start")
    assert [c.layout for c in decision.candidates][0] == chosen  # fastest first


def test_switch_when_context_grows_and_the_event_validates():
    sel = selector(switch=1.0)
    short = sel.decide(Outlook(512, 600, 64, iterations_left=20), None)
    long = sel.decide(Outlook(12000, 14000, 64, iterations_left=20), short.new)
    assert (short.new, long.new, long.switched) == (TP1, TP2, True)
    assert "switched" in long.reason and "saves" in long.reason
    data = long.event_data()
    assert data["old_layout"]["key"] == TP1.key and data["new_layout"]["key"] == TP2.key
    event = SelectorDecision(**data)
    envelope = {"v": 1, "run": 1, "seq": 1, "ts": "2026-12-02T00:00:00Z", "type": event.type, "data": event.data()}
    jsonschema.Draft202012Validator(load_schema()).validate(envelope)


def test_switch_cost_must_be_paid_back():
    outlook = Outlook(12000, 14000, 64, iterations_left=1)
    kept = selector(switch=1e6).decide(outlook, TP1)
    assert kept.new == TP1 and not kept.switched and "switching costs" in kept.reason
    assert selector(switch=0.0).decide(outlook, TP1).new == TP2


def test_hysteresis_no_flapping_at_a_range_boundary():
    sel = selector(switch=0.0, hysteresis=0.05)
    current = sel.decide(Outlook(3500, 3500, 64), None).new
    history = []
    for ctx in [3900, 4200, 3950, 4250, 4000, 4150, 3980, 4300] * 3:  # the mean wobbles around the 4096 crossing
        d = sel.decide(Outlook(ctx, ctx, 64, iterations_left=10), current)
        history.append(d.switched)
        current = d.new
    assert not any(history)
    # Well past the crossing the gain clears the margin and it does switch, once.
    d = sel.decide(Outlook(9000, 9000, 64, iterations_left=10), current)
    assert d.switched and d.new == TP2
    assert not sel.decide(Outlook(9200, 9200, 64, iterations_left=10), d.new).switched


def test_budget_guard_refuses_a_layout_predicted_not_to_fit():
    outlook = Outlook(12000, 16000, 64)
    mm = MemoryModel(TINY)
    tp1_mem = mm.predict(TP1, Work(64, 16000)).total
    tp2_mem = mm.predict(TP2, Work(64, 16000)).total
    assert tp1_mem > tp2_mem  # each TP1 replica holds the whole model; TP2 ranks hold half of it each
    # TP1 is the faster layout at every context, but a budget between the two must keep it out.
    always_tp1 = CostModel([ProfilePoint(TP1, 1000, 2000.0), ProfilePoint(TP2, 1000, 1000.0)])
    budget = (tp1_mem + tp2_mem) // 2
    sel = Selector("rollout", [TP1, TP2], cost=always_tp1, memory=mm, budget_bytes=budget,
                   switch_cost=lambda a, b: 1e9)
    assert sel.decide(Outlook(1000, 1000, 64), None).new == TP1  # short context: TP1 fits
    d = sel.decide(outlook, None)
    assert d.new == TP2
    assert [c.fits for c in d.candidates if c.layout == TP1] == [False]
    # Running TP1 when the context grows past its budget: forced off it, whatever the switch cost.
    forced = sel.decide(outlook, TP1)
    assert forced.switched and forced.new == TP2 and forced.reason.startswith("forced")
    assert "> budget" in forced.reason


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(NoLayoutFits, match=r"no layout fits the budget of 0.00 GiB .* smallest, tp2.dp1.mb8"):
        selector(budget=1024).decide(Outlook(1000, 1000, 64), None)


def test_unprofiled_layouts_are_not_ranked():
    sel = Selector("rollout", [TP1, Layout("rollout", tp=1, dp=2, micro_batch=4)], cost=crossing_profile(),
                   memory=MemoryModel(TINY), budget_bytes=64 * GIB, switch_cost=lambda a, b: 0.0)
    d = sel.decide(Outlook(1000, 1000, 8), None)
    assert [c.layout for c in d.candidates] == [TP1]


def test_ragged_lengths_are_costed_with_their_padding():
    """Profiled on equal lengths, MB8 is twice as fast per token as MB1; but when one long game sits among
    short ones, MB8 pads every short game to the long one's length and MB1 wins."""
    mb1, mb8 = Layout("train", micro_batch=1), Layout("train", micro_batch=8)
    cost = CostModel([ProfilePoint(mb1, c, 1000.0) for c in (256, 4096)] +
                     [ProfilePoint(mb8, c, 2000.0) for c in (256, 4096)])
    sel = Selector("train", [mb1, mb8], cost=cost, memory=MemoryModel(TINY), budget_bytes=None,
                   switch_cost=lambda a, b: 0.0)
    even = (2000,) * 8
    ragged = (100,) * 7 + (4000,)
    for lengths, chosen in ((even, mb8), (ragged, mb1)):
        outlook = Outlook(sum(lengths) / 8, max(lengths), 8, lengths=lengths)
        assert sel.decide(outlook, None).new == chosen
    outlook = Outlook(sum(ragged) / 8, 4000, 8, lengths=ragged)
    assert sel.stage_seconds(mb8, outlook) == pytest.approx(8 * 4000 / 2000.0)  # all padded to 4000
    assert sel.stage_seconds(mb1, outlook) == pytest.approx(4700 / 1000.0)
    # Two DP ranks: the long game alone on one rank, the short ones on the other; the slowest rank counts.
    dp2 = Layout("train", dp=2, micro_batch=8)
    sel2 = Selector("train", [dp2], cost=CostModel([ProfilePoint(dp2, 256, 2000.0)]), memory=MemoryModel(TINY),
                    budget_bytes=None, switch_cost=lambda a, b: 0.0)
    assert sel2.stage_seconds(dp2, outlook) == pytest.approx(4000 / 1000.0)


def test_measured_stage_times_correct_the_profile():
    """Profiled, MB8 looks 2x faster than MB1; the real stage on MB8 then takes 3x its prediction. The selector
    learns that and moves to MB1; a layout never run borrows the median correction (the shared part)."""
    mb1, mb2, mb8 = (Layout("train", micro_batch=m) for m in (1, 2, 8))
    cost = CostModel([ProfilePoint(mb1, c, 1000.0) for c in (256, 4096)] +
                     [ProfilePoint(mb2, c, 1000.0) for c in (256, 4096)] +
                     [ProfilePoint(mb8, c, 2000.0) for c in (256, 4096)])
    sel = Selector("train", [mb1, mb2, mb8], cost=cost, memory=MemoryModel(TINY), budget_bytes=None,
                   switch_cost=lambda a, b: 0.0, policy=SelectorPolicy(hysteresis=0.05))
    lengths = (1000,) * 8
    outlook = Outlook(1000, 1000, 8, iterations_left=10, lengths=lengths)
    first = sel.decide(outlook, None)
    assert first.new == mb8
    predicted = sel.stage_seconds(mb8, outlook)
    assert predicted == pytest.approx(8000 / 2000.0)
    sel.observe(mb8, outlook, 3 * predicted)
    assert sel.stage_seconds(mb8, outlook) == pytest.approx(3 * predicted)
    # MB1 and MB2 were never run: they borrow MB8's ratio (the only one), so MB8 still leads ...
    assert cost.correction(mb1) == pytest.approx(3.0)
    assert sel.decide(outlook, mb8).new == mb8
    # ... until MB1 is measured at its prediction: the median of (3, 1) = 2 for MB2, MB1 at x1 now leads.
    sel.observe(mb1, outlook, sel.profiled_seconds(mb1, outlook))
    assert cost.correction(mb1) == pytest.approx(1.0) and cost.correction(mb2) == pytest.approx(2.0)
    second = sel.decide(outlook, mb8)
    assert second.new == mb1 and second.switched
    # Only recent ratios count, and junk is ignored.
    for _ in range(5):
        sel.observe(mb8, outlook, predicted)
    cost.observe(mb8, float("nan"))
    cost.observe(mb8, -1.0)
    assert cost.correction(mb8) == pytest.approx(1.0)
