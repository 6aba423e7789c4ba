"""The learner on a real tiny model: SFT lowers the loss, an RL step moves log-probs the way advantages say."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from earl_core.agent.chat import ChatEncoder, answer_spans
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import teacher_policy
from earl_core.config import AlgoConfig
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent
from earl_core.rl.batch import mini_batch_rows
from earl_core.rl.learner import Learner


@pytest.fixture(scope="module")
def teacher_records(protocol_tokenizer) -> list[dict]:  # noqa: ANN001
    enc = ChatEncoder(protocol_tokenizer)
    specs = [GameSpec(i, i // 2, 1 + i % 2, RandomOpponent(), i) for i in range(8)]
    eps = play_episodes(specs, teacher_policy(HeuristicOpponent(), enc), enc, limits=RunnerLimits())
    return [e.record() for e in eps]


def _answer_logprob(learner: Learner, records: list[dict]) -> torch.Tensor:
    batch = learner.prepare(records, [0.0] * len(records))
    return (batch.old_logprobs * batch.action_mask).sum(dim=1)  # (B,) log-prob of each game's answers


def test_sft_lowers_loss(protocol_model: Path, teacher_records: list[dict]) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(micro_batch=4), seed=0)
    first = learner.sft_step(teacher_records, lr=3e-3)["sft/loss"]
    for _ in range(5):
        last = learner.sft_step(teacher_records, lr=3e-3)["sft/loss"]
    assert last < first * 0.8


def test_rl_step_follows_advantages(protocol_model: Path, teacher_records: list[dict]) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3, epochs=2), seed=0)
    before = _answer_logprob(learner, teacher_records)
    params_before = {k: v.clone() for k, v in learner.state_dict().items()}
    adv = [1.0, -1.0] * 4
    metrics = learner.rl_step(learner.prepare(teacher_records, adv))
    after = _answer_logprob(learner, teacher_records)
    changed = sum(not torch.equal(params_before[k], v) for k, v in learner.state_dict().items())
    assert changed > 0
    delta = (after - before).tolist()
    assert sum(d for d, a in zip(delta, adv) if a > 0) > sum(d for d, a in zip(delta, adv) if a < 0)
    assert metrics["perf/train_tokens"] == sum(sum(r["action_mask"]) for r in teacher_records)
    assert 0 <= metrics["losses/clip_frac"] <= 1


def test_mini_batches_step_on_each_part_against_the_games_own_old_logprobs(protocol_model: Path,
                                                                            teacher_records: list[dict]) -> None:
    """algo.mini_batches=2: one rl_step is two optimiser steps, one per part of the games as mini_batch_rows deals
    them, both against the log-probs of the policy that played (not re-computed between the steps) -- the same
    weights as a one-part learner stepped on the two parts of one prepared batch in turn."""
    adv = [1.0, -1.0, 0.5, -0.5] * 2
    split = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3, mini_batches=2, kl_coef=0.1), seed=0)
    whole = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3, kl_coef=0.1), seed=0)
    m = split.rl_step(split.prepare(teacher_records, adv))
    assert split.steps == 2
    batch = whole.prepare(teacher_records, adv)
    parts = mini_batch_rows(len(teacher_records), 2, random.Random(0))
    assert all(parts)
    for rows in parts:
        whole.rl_step(batch.slice(rows))
    for k, v in whole.state_dict().items():
        assert torch.allclose(v, split.state_dict()[k], atol=1e-6), k
    assert m["perf/train_tokens"] == sum(sum(r["action_mask"]) for r in teacher_records)  # both parts counted
    once = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3, kl_coef=0.1), seed=0)
    once.rl_step(once.prepare(teacher_records, adv))
    assert once.steps == 1
    assert any(not torch.allclose(v, split.state_dict()[k], atol=1e-6) for k, v in once.state_dict().items())


def test_kl_reference_and_checkpoint_round_trip(protocol_model: Path, teacher_records: list[dict], tmp_path: Path) -> None:
    learner = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, kl_coef=0.1), seed=0)
    m = learner.rl_step(learner.prepare(teacher_records, [1.0, -1.0] * 4))
    assert m["losses/kl"] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    m = learner.rl_step(learner.prepare(teacher_records, [1.0, -1.0] * 4))
    assert m["losses/kl"] > 0
    ckpt = learner.save(tmp_path / "iter_000002", extra={"iteration": 2})
    assert (ckpt / "model.safetensors").exists() and (ckpt / "tokenizer.json").exists()
    assert not (tmp_path / "iter_000002.tmp").exists()
    again = Learner(ckpt, algo=AlgoConfig(lr=1e-3), seed=0)
    again.load_optimizer(ckpt)
    assert again.steps == 2
    for k, v in learner.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_after_a_warm_start_the_reference_is_the_warm_started_policy(protocol_model: Path,
                                                                     teacher_records: list[dict]) -> None:
    """KL is measured against the policy RL starts from: after SFT steps, reset_reference copies the policy, so
    the reference's log-probs are the policy's again (before it they are the fresh model's)."""
    learner = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, kl_coef=0.1, micro_batch=4), seed=0)
    for _ in range(3):
        learner.sft_step(teacher_records, lr=3e-3)
    batch = learner.prepare(teacher_records, [0.0] * len(teacher_records))
    assert not torch.equal(batch.ref_logprobs, batch.old_logprobs)
    learner.reset_reference()
    batch = learner.prepare(teacher_records, [0.0] * len(teacher_records))
    assert torch.equal(batch.ref_logprobs, batch.old_logprobs)
    assert learner.rl_step(learner.prepare(teacher_records, [1.0, -1.0] * 4))["losses/kl"] == pytest.approx(0, abs=1e-6)
    assert all(not p.requires_grad for p in learner.reference.parameters())


def test_padding_does_not_change_logprobs(protocol_model: Path, teacher_records: list[dict]) -> None:
    """Right padding without a mask is exact under causal attention: batched == one sequence at a time."""
    learner = Learner(protocol_model, algo=AlgoConfig(micro_batch=8), seed=0)
    batched = learner.prepare(teacher_records, [0.0] * len(teacher_records))
    for i, rec in enumerate(teacher_records[:3]):
        alone = learner.prepare([rec], [0.0])
        n = len(rec["token_ids"]) - 1
        torch.testing.assert_close(batched.old_logprobs[i, :n], alone.old_logprobs[0, :n], rtol=1e-4, atol=1e-5)


def _last_answer_only(record: dict) -> dict:
    spans = answer_spans(record["action_mask"])
    start, end = spans[-1]
    return {**record, "action_mask": [1 if start <= i < end else 0 for i in range(len(record["action_mask"]))]}


def test_turn_discount_zero_trains_only_each_games_last_answer(protocol_model: Path, teacher_records: list[dict]) -> None:
    """turn_discount=0 gives the last answer of a game all the credit: the same step as a plain learner trained on
    records whose earlier answers are masked out."""
    adv = [1.0, -1.0] * 4
    discounted = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3, turn_discount=0.0), seed=0)
    plain = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3), seed=0)
    assert all(len(answer_spans(r["action_mask"])) > 2 for r in teacher_records)
    m = discounted.rl_step(discounted.prepare(teacher_records, adv))
    plain.rl_step(plain.prepare([_last_answer_only(r) for r in teacher_records], adv))
    for k, v in plain.state_dict().items():
        assert torch.allclose(v, discounted.state_dict()[k], atol=1e-6), k
    assert m["perf/train_tokens"] == sum(sum(r["action_mask"]) for r in teacher_records)  # every token was seen
    untouched = Learner(protocol_model, algo=AlgoConfig(lr=1e-3, micro_batch=3), seed=0)
    untouched.rl_step(untouched.prepare(teacher_records, adv))
    assert any(not torch.allclose(v, discounted.state_dict()[k], atol=1e-6) for k, v in untouched.state_dict().items())
