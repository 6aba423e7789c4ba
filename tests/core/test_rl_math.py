"""Advantages and losses against hand computation."""

from __future__ import annotations

import math
import random

import pytest
import torch

from earl_core.rl.advantages import RunningBaseline, answer_weights, grpo_advantages
from earl_core.rl.batch import micro_batches, mini_batch_rows, pack
from earl_core.rl.losses import clipped_policy_loss, kl_to_reference, token_logprobs


def test_grpo_hand_computed() -> None:
    # group 0: rewards 1, -1, 1, -1 -> mean 0, std 1 -> advantages = rewards
    # group 1: rewards 1, 0 -> mean .5, std .5 -> +1, -1 ; group 2: all equal -> 0
    adv = grpo_advantages([1, -1, 1, -1, 1, 0, 1, 1], [0, 0, 0, 0, 1, 1, 2, 2], eps=0.0)
    assert adv.tolist() == pytest.approx([1, -1, 1, -1, 1, -1, 0, 0])
    unnorm = grpo_advantages([1, 0, 0], [5, 5, 5], normalize_std=False)
    assert unnorm.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    # std with eps: r = (2, 0) -> (1 / (1 + 1e-6), -1 / (1 + 1e-6))
    assert grpo_advantages([2, 0], [0, 0]).tolist() == pytest.approx([1 / (1 + 1e-6), -1 / (1 + 1e-6)])


def test_running_baseline() -> None:
    b = RunningBaseline(decay=0.5)
    assert b.advantages([1.0, 0.0]).tolist() == pytest.approx([0.5, -0.5])  # first batch: its own mean
    assert b.value == pytest.approx(0.5)
    assert b.advantages([1.0, 1.0]).tolist() == pytest.approx([0.5, 0.5])
    assert b.value == pytest.approx(0.75)


def test_clipped_loss_values() -> None:
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, clipped, ratio = clipped_policy_loss(old.clone(), old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-(2 + 2) + 1)  # ratio 1: -adv per masked token
    assert clipped.item() == 0 and ratio.item() == pytest.approx(3)
    # ratio e^0.5 ~ 1.65 > 1.2 with positive advantage -> clipped to 1.2
    new = torch.full((2, 3), 0.5)
    loss, clipped, _ = clipped_policy_loss(new, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-(1.2 * 2) * 2 + math.exp(0.5) * 1)  # negative adv keeps the larger ratio
    assert clipped.item() == 2


def test_kl_k3() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    mask = torch.ones(1, 2)
    expected = (0.5 - math.log(0.5) - 1) + 0.0
    assert kl_to_reference(lp, ref, mask).item() == pytest.approx(expected)
    assert kl_to_reference(lp, lp, mask).item() == 0


def test_token_logprobs_alignment() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2 strongly
    ids = torch.tensor([[1, 2, 3]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert lp[0, 0].item() == pytest.approx(torch.log_softmax(logits[0, 0], -1)[2].item())
    assert lp[0, 1].item() == pytest.approx(math.log(0.25))


def test_pack_and_micro_batches() -> None:
    recs = [{"token_ids": [5, 6, 7, 8], "action_mask": [0, 0, 1, 1]}, {"token_ids": [9, 10], "action_mask": [0, 1]}]
    b = pack(recs, [1.0, -1.0], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert b.action_mask.tolist() == [[0, 1, 1], [1, 0, 0]]  # shifted: target t+1
    assert b.action_tokens == 3
    mbs = list(micro_batches(b, 1))
    assert [m.input_ids.shape[1] for m in mbs] == [2, 4]  # short first, padding trimmed
    assert mbs[0].advantages.tolist() == [-1.0]


def test_answer_weights_discount_each_answer_by_its_distance_from_the_end() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1, 1, 0],
                         [1, 0, 0, 0, 1, 1, 0, 0, 0, 0],
                         [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    w = answer_weights(mask, 0.5)
    assert w.tolist() == [[0, 0.25, 0.25, 0, 0, 0.5, 0, 1, 1, 0],
                          [0.5, 0, 0, 0, 1, 1, 0, 0, 0, 0],
                          [0] * 10]
    assert torch.equal(answer_weights(mask, 1.0), mask)  # no discount: the mask itself, bit for bit
    assert answer_weights(mask, 0.0).tolist()[0] == [0, 0, 0, 0, 0, 0, 0, 1, 1, 0]  # only the last answer counts


@pytest.mark.parametrize(("size", "parts"), [(64, 4), (10, 3), (7, 7), (3, 5), (5, 1)])
def test_mini_batch_rows_deal_every_row_once_in_near_equal_parts(size: int, parts: int) -> None:
    rows = mini_batch_rows(size, parts, random.Random(0))
    assert len(rows) == parts
    assert sorted(r for part in rows for r in part) == list(range(size))
    assert max(map(len, rows)) - min(map(len, rows)) <= 1


def test_mini_batch_rows_one_part_keeps_the_order_and_more_parts_shuffle() -> None:
    assert mini_batch_rows(6, 1, random.Random(0)) == [[0, 1, 2, 3, 4, 5]]
    parts = mini_batch_rows(64, 2, random.Random(0))
    assert parts != [list(range(0, 64, 2)), list(range(1, 64, 2))]  # dealt after a shuffle, not by position
    assert mini_batch_rows(64, 2, random.Random(0)) == parts  # the seed decides the deal
    with pytest.raises(ValueError):
        mini_batch_rows(4, 0, random.Random(0))
