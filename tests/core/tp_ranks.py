"""One rank of the tensor-parallel checks (run as `python -m tests.core.tp_ranks`, one process per rank).

Each rank builds the model twice from the same folder: a plain copy (the TP=1 reference) and one split across
the ranks with earl_core.parallel.tensor_parallel; it compares logits and gradients, and checks that moving
weights into and out of the split layout is bit-exact. Rank 0 writes the measured differences as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from transformers import AutoModelForCausalLM

from earl_core.parallel.tensor_parallel import (clip_grad_norm, full_state_dict, load_full_state_dict, local_numel,
                                                shard_model)
from earl_core.rl.losses import token_logprobs
from tests.core.rank_process import join_gloo_group


def _loss(model: torch.nn.Module, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=ids).logits
    return logits, -(token_logprobs(logits, ids) * weights).sum() / weights.sum()


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    g = p.grad
    return g.full_tensor() if isinstance(g, DTensor) else g


def main() -> None:
    args, mesh = join_gloo_group()

    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    split = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    original = {k: v.clone() for k, v in reference.state_dict().items()}
    shard_model(split, mesh)

    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, reference.config.vocab_size, (3, 40), generator=gen)
    weights = (torch.rand(3, 39, generator=gen) > 0.5).float()
    ref_logits, ref_loss = _loss(reference, ids, weights)
    ref_loss.backward()
    tp_logits, tp_loss = _loss(split, ids, weights)
    tp_loss.backward()

    names = [n for n, _ in reference.named_parameters()]
    ref_params = dict(reference.named_parameters())
    tp_params = dict(split.named_parameters())
    grad_diff = {n: float((_grad(tp_params[n]) - ref_params[n].grad).abs().max()) for n in names}
    grad_scale = max(float(ref_params[n].grad.abs().max()) for n in names)

    # Layout switch round trip: TP -> full -> TP (into a model with other weights) -> full, bit for bit.
    out_of_split = full_state_dict(split)
    other = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    with torch.no_grad():
        for q in other.parameters():
            q.add_(1.0)
    shard_model(other, mesh)
    load_full_state_dict(other, out_of_split)
    back = full_state_dict(other)
    plain = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    with torch.no_grad():
        for q in plain.parameters():
            q.mul_(0.0)
    load_full_state_dict(plain, back)  # TP -> TP=1

    # Gradient clipping over hand-made gradients: one partial (each rank holds a summand), one sharded, one
    # replicated; the norm must be that of the full gradients, and clipping must scale the full gradients.
    full = {"partial": torch.arange(6.0) * 3, "sharded": torch.arange(8.0) - 2, "replicated": torch.full((3,), 0.5)}
    summand = full["partial"] * (1 + 2 * args.rank) / args.world ** 2  # sum over ranks of 1+2r: world**2
    clip_params = []
    for name, placement, local_grad in (("partial", Partial(), summand),
                                        ("sharded", Shard(0), full["sharded"].chunk(args.world)[args.rank]),
                                        ("replicated", Replicate(), full["replicated"])):
        q = torch.nn.Parameter(distribute_tensor(torch.zeros_like(full[name]), mesh, [Replicate()]))
        q.grad = DTensor.from_local(local_grad.clone(), mesh, [placement])
        clip_params.append(q)
    expected_norm = float(torch.cat(list(full.values())).norm())
    clip_norm = clip_grad_norm(clip_params, max_norm=1.0)
    clipped = torch.cat([q.grad.full_tensor() for q in clip_params])
    clipped_expected = torch.cat(list(full.values())) / (expected_norm + 1e-6)

    result = {
        "clip_norm": clip_norm,
        "clip_norm_expected": expected_norm,
        "clipped_max_diff": float((clipped - clipped_expected).abs().max()),
        "logits_max_diff": float((tp_logits - ref_logits).detach().abs().max()),
        "loss_diff": float((tp_loss - ref_loss).detach().abs()),
        "grad_max_diff": max(grad_diff.values()),
        "grad_scale": grad_scale,
        "grads_compared": len(grad_diff),
        "sharded_params": sum(isinstance(q, DTensor) for q in split.parameters()),
        "local_numel": local_numel(split),
        "full_numel": sum(q.numel() for q in reference.parameters()),
        "full_out_equals_original": all(torch.equal(out_of_split[k], original[k]) for k in original),
        "round_trip_bit_exact": all(torch.equal(back[k], original[k]) for k in original),
        "tp1_after_round_trip_bit_exact": all(torch.equal(v, original[k]) for k, v in plain.state_dict().items()),
    }
    if args.rank == 0:
        Path(args.out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
