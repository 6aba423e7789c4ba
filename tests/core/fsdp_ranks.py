"""One rank of the FSDP checks (run as `python -m tests.core.fsdp_ranks`, one process per rank).

The ranks form a (dp, tp) mesh: two data-parallel ranks, each a TP group of ``--tp`` ranks (1: plain FSDP; 2: FSDP
x TP in 2-D, four processes). Each rank trains two learners from the same folder: one sharded with FSDP2 over the
data-parallel ranks (and split by TP), fed only its data-parallel rank's share of the games (the first three, or
the last one, so the ranks run different numbers of micro-batches), and a plain single-process learner fed every
game (the reference). It compares losses, gradient norms and weights after an SFT step and an RL step, checks that
moving into and out of the sharded layout is bit-exact, takes an RL step in two mini-batches (one of
them empty on the rank with one game), and saves a checkpoint from the sharded learner. Rank 0
writes the measured figures as JSON.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM

from earl_core.config import AlgoConfig
from earl_core.parallel.tensor_parallel import full_optimizer_state, full_state_dict, local_numel
from earl_core.rl.learner import Learner
from tests.core.rank_process import join_gloo_group


def _records(vocab: int) -> list[dict]:
    rng = random.Random(3)
    out = []
    for n in (37, 52, 29, 61):
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        mask = [1 if rng.random() < 0.4 else 0 for _ in range(n)]
        mask[0] = 0
        out.append({"token_ids": ids, "action_mask": mask})
    return out


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Largest absolute difference and the share of entries differing by more than 1e-6."""
    worst, off, total = 0.0, 0, 0
    for k in a:
        d = (a[k].float() - b[k].float()).abs()
        worst = max(worst, float(d.max()))
        off += int((d > 1e-6).sum())
        total += d.numel()
    return worst, off / total


def main() -> None:
    args, _ = join_gloo_group()
    tp = args.world // 2
    grid = init_device_mesh("cpu", (2, tp), mesh_dim_names=("dp", "tp"))
    mesh, tp_mesh = grid["dp"], (grid["tp"] if tp > 1 else None)
    dp_rank = args.rank // tp

    def dp_sum(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=mesh.get_group())
        return t

    algo = AlgoConfig(micro_batch=1, lr=1e-3, kl_coef=0.05, max_grad_norm=1.0)
    sharded = Learner(args.model, algo=algo, seed=0, reduce=dp_sum, dp_mesh=mesh, tp_mesh=tp_mesh, fsdp=True)
    plain = Learner(args.model, algo=algo, seed=0)
    records = _records(int(plain.model.config.vocab_size))
    mine = records[:3] if dp_rank == 0 else records[3:]
    advantages = [0.7, -1.2, 0.4, 1.1]
    result: dict = {"fsdp": sharded.fsdp, "local_parameters": local_numel(sharded.model),
                    "parameters": sum(p.numel() for p in plain.model.parameters())}

    s1, p1 = sharded.sft_step(mine, lr=1e-3), plain.sft_step(records, lr=1e-3)
    result["sft"] = {"loss": [s1["sft/loss"], p1["sft/loss"]], "grad_norm": [s1["sft/grad_norm"], p1["sft/grad_norm"]]}
    # Each rank's loss is over its own tokens; the plain one over all: compare the gradient norm (global) and weights.
    result["sft"]["weights"] = _diff(full_state_dict(sharded.model), plain.state_dict())

    share = advantages[:3] if dp_rank == 0 else advantages[3:]
    s2 = sharded.rl_step(sharded.prepare(mine, share))
    p2 = plain.rl_step(plain.prepare(records, advantages))
    result["rl"] = {"grad_norm": [s2["losses/grad_norm"], p2["losses/grad_norm"]],
                    "tokens": [s2["perf/train_tokens"], p2["perf/train_tokens"]],
                    "weights": _diff(full_state_dict(sharded.model), plain.state_dict())}

    before_w, before_o = full_state_dict(sharded.model), full_optimizer_state(sharded.model, sharded.optimizer)
    sharded.relayout(None, dp_mesh=mesh, fsdp=False)
    whole = {"fsdp": sharded.fsdp, "local_parameters": local_numel(sharded.model)}
    mid_w = full_state_dict(sharded.model)
    sharded.relayout(tp_mesh, dp_mesh=mesh, fsdp=True)
    after_w, after_o = full_state_dict(sharded.model), full_optimizer_state(sharded.model, sharded.optimizer)
    moments = [(a, b) for ia in before_o["state"] for a, b in ((before_o["state"][ia], after_o["state"][ia]),)]
    result["relayout"] = {
        "whole": whole,
        "weights_exact": all(torch.equal(before_w[k], mid_w[k]) and torch.equal(before_w[k], after_w[k])
                             for k in before_w),
        "optimizer_exact": all(torch.equal(a[k], b[k]) for a, b in moments for k in a if torch.is_tensor(a[k])),
    }
    # Training goes on after the round trip, still equal to the reference.
    s3, p3 = sharded.sft_step(mine, lr=1e-3), plain.sft_step(records, lr=1e-3)
    result["after_relayout"] = {"grad_norm": [s3["sft/grad_norm"], p3["sft/grad_norm"]],
                                "weights": _diff(full_state_dict(sharded.model), plain.state_dict())}

    # Two mini-batches: rank 1 holds one game, so one of its parts is empty and it joins that step's passes
    # and collectives with nothing of its own; both steps must still count every rank's tokens.
    sharded.algo = replace(sharded.algo, mini_batches=2)
    steps = sharded.steps
    s4 = sharded.rl_step(sharded.prepare(mine, share))
    result["mini_batches"] = {"steps": sharded.steps - steps, "tokens": s4["perf/train_tokens"],
                              "all_tokens": p2["perf/train_tokens"]}

    out = Path(args.out)
    saved = sharded.save(out.with_name("checkpoint"), extra={"iteration": 1}, write=args.rank == 0)
    dist.barrier()
    loaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).state_dict()
    result["checkpoint_weights"] = _diff({k: loaded[k] for k in after_w}, full_state_dict(sharded.model))
    if args.rank == 0:
        out.write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
