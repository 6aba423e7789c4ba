"""Data-parallel trainer ranks on Ray (gloo all-reduce) take the same step as one learner on the whole batch;
worker groups are placed all or nothing (one placement group per group, gone when the group closes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch
import torch.distributed as dist

from earl_core.agent.chat import ChatEncoder
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import teacher_policy
from earl_core.config import AlgoConfig
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent
from earl_core.ray_exec.cluster import ray_cluster
from earl_core.errors import PlacementError
from earl_core.ray_exec.groups import Gang, TrainerGroup
from earl_core.rl.learner import Learner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_session():  # noqa: ANN201 - yields the cluster description
    """One local Ray for the module: each start and stop costs seconds on this machine."""
    with ray_cluster(num_cpus=3) as where:
        yield where


def test_two_ranks_match_one_learner(
        ray_session: str, protocol_model: Path, protocol_tokenizer) -> None:  # noqa: ANN001
    enc = ChatEncoder(protocol_tokenizer)
    specs = [GameSpec(i, i // 2, 1 + i % 2, RandomOpponent(), 100 + i) for i in range(6)]
    records = [e.record() for e in play_episodes(specs, teacher_policy(HeuristicOpponent(), enc), enc,
                                                 limits=RunnerLimits())]
    advantages = [1.0, -0.5, 0.25, -1.0, 0.75, -0.25]
    algo = AlgoConfig(lr=1e-3, micro_batch=2, epochs=1)

    single = Learner(protocol_model, algo=algo, seed=0)
    single.rl_step(single.prepare(records, advantages))
    expected = single.state_dict()

    group = TrainerGroup(str(protocol_model), workers=2, algo=algo.__dict__, reference_dir=None, seed=0)
    try:
        held = ray.util.placement_group_table(group.gang.group)
        group.rl_step(records, advantages)
        got = ray.get(group.weights()[0])
        with pytest.raises(PlacementError, match=r"trainer workers: 1 x \{'CPU': 64.0\} could not be reserved"):
            Gang("trainer workers", 1, cpus=64, timeout_s=2)
    finally:
        group.close()
    released = ray.util.placement_group_table(group.gang.group)
    assert held["state"] == "CREATED" and len(held["bundles"]) == 2
    assert released["state"] == "REMOVED"
    # AdamW's first step moves each weight by about lr * sign(gradient), so float noise in a gradient that
    # is almost zero can flip a few signs: compare update directions, which a missing or wrongly scaled
    # all-reduce changes a lot (each rank would follow the sign of half the data).
    base = Learner(protocol_model, algo=algo).state_dict()
    want = torch.cat([(expected[k] - base[k]).flatten() for k in base])
    have = torch.cat([(got[k] - base[k]).flatten() for k in base])
    assert want.abs().max() > 0, "the step changed the weights"
    cosine = torch.nn.functional.cosine_similarity(want, have, dim=0).item()
    assert cosine > 0.99, cosine
    assert (torch.sign(want) == torch.sign(have)).float().mean().item() > 0.99


def test_tensor_parallel_ranks_match_one_learner_and_checkpoint_in_the_tp1_format(
        ray_session: str, protocol_model: Path, protocol_tokenizer, tmp_path: Path) -> None:  # noqa: ANN001
    enc = ChatEncoder(protocol_tokenizer)
    specs = [GameSpec(i, i // 2, 1 + i % 2, RandomOpponent(), 200 + i) for i in range(4)]
    records = [e.record() for e in play_episodes(specs, teacher_policy(HeuristicOpponent(), enc), enc,
                                                 limits=RunnerLimits())]
    advantages = [1.0, -0.5, 0.25, -1.0]
    algo = AlgoConfig(lr=1e-3, micro_batch=2, epochs=1, kl_coef=0.1)  # the reference model is split too

    single = Learner(protocol_model, algo=algo, reference_dir=protocol_model, seed=0)
    want_metrics = single.rl_step(single.prepare(records, advantages))
    expected = single.state_dict()

    group = TrainerGroup(str(protocol_model), workers=2, tp=2, algo=algo.__dict__,
                         reference_dir=str(protocol_model), seed=0)
    try:
        stored = group.local_parameters()
        metrics = group.rl_step(records, advantages)
        got = ray.get(group.weights()[0])
        ckpt = group.save(str(tmp_path / "ckpt"), {"iteration": 1})
    finally:
        group.close()
    full = sum(v.numel() for v in expected.values())
    assert len(stored) == 2 and all(n < full for n in stored)  # each rank holds part of the model
    # TP ranks see the same data as one learner; only the order of float sums differs.
    assert metrics["losses/policy_loss"] == pytest.approx(want_metrics["losses/policy_loss"], rel=1e-4, abs=1e-6)
    assert metrics["losses/grad_norm"] == pytest.approx(want_metrics["losses/grad_norm"], rel=1e-4)
    base = Learner(protocol_model, algo=algo).state_dict()
    want = torch.cat([(expected[k] - base[k]).flatten() for k in base])
    have = torch.cat([(got[k] - base[k]).flatten() for k in base])
    assert want.abs().max() > 0
    assert torch.nn.functional.cosine_similarity(want, have, dim=0).item() > 0.999
    # The checkpoint is the TP=1 format: a plain learner loads the same weights and a full optimizer state.
    plain = Learner(ckpt, algo=algo)
    plain.load_optimizer(ckpt)
    assert all(torch.equal(v, got[k]) for k, v in plain.state_dict().items())
    single_state = single.optimizer.state_dict()["state"]
    plain_state = plain.optimizer.state_dict()["state"]
    assert set(plain_state) == set(single_state)
    for idx, entry in plain_state.items():
        assert entry["exp_avg"].shape == single_state[idx]["exp_avg"].shape
        assert torch.allclose(entry["exp_avg_sq"], single_state[idx]["exp_avg_sq"], rtol=1e-3, atol=1e-12)


def process_groups(group: TrainerGroup) -> list[int]:
    """How many process groups each trainer rank holds (c10d's registry)."""
    count = lambda _worker: len(dist.distributed_c10d._world.pg_map)  # noqa: E731
    return ray.get([a.__ray_call__.remote(count) for a in group.actors])


def test_layout_switch_between_dp_and_tp_moves_weights_and_optimizer_in_memory(
        ray_session: str, protocol_model: Path, protocol_tokenizer) -> None:  # noqa: ANN001
    enc = ChatEncoder(protocol_tokenizer)
    specs = [GameSpec(i, i // 2, 1 + i % 2, RandomOpponent(), 300 + i) for i in range(4)]
    records = [e.record() for e in play_episodes(specs, teacher_policy(HeuristicOpponent(), enc), enc,
                                                 limits=RunnerLimits())]
    advantages = [1.0, -0.5, 0.25, -1.0]
    algo = AlgoConfig(lr=1e-3, micro_batch=2, epochs=1, kl_coef=0.1)
    # Reference: one learner taking two steps on the same games.
    single = Learner(protocol_model, algo=algo, reference_dir=protocol_model, seed=0)
    for _ in range(2):
        single.rl_step(single.prepare(records, advantages))
    expected = single.state_dict()

    group = TrainerGroup(str(protocol_model), workers=2, tp=1, algo=algo.__dict__,
                         reference_dir=str(protocol_model), seed=0)
    try:
        group.rl_step(records, advantages)                    # step 1 on DP=2
        before = ray.get(group.weights()[0])
        to_tp = group.relayout(2)                             # DP=2 -> TP=2
        after = ray.get(group.weights()[0])
        split = group.local_parameters()
        group.rl_step(records, advantages)                    # step 2 on TP=2, with the moved Adam moments
        back = group.relayout(1)                              # TP=2 -> DP=2
        got = ray.get(group.weights()[0])
        whole = group.local_parameters()
        held = process_groups(group)
        group.relayout(2)
        group.relayout(1)                                     # another round trip
        held_again = process_groups(group)
        group.rl_step(records, advantages)                    # the groups in use survived the cleanup
    finally:
        group.close()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the switch moved the weights bit for bit
    assert whole[0] == whole[1] > max(split)  # split in two while TP=2, whole again on DP=2
    assert to_tp > 0 and back > 0
    assert held_again == held  # a switch destroys the old layout's groups instead of piling them up
    # Two steps across the switch land where one learner's two steps do: the optimizer state moved too (a
    # fresh AdamW for step 2 would take a different, sign-sized step).
    base = Learner(protocol_model, algo=algo).state_dict()
    want = torch.cat([(expected[k] - base[k]).flatten() for k in base])
    have = torch.cat([(got[k] - base[k]).flatten() for k in base])
    assert torch.nn.functional.cosine_similarity(want, have, dim=0).item() > 0.99
