"""Tensor parallelism of a Hugging Face decoder (Qwen2 / Llama family) with PyTorch's own DTensor APIs.

Megatron-style: in every layer the q/k/v and gate/up projections are split by output column (each rank holds
whole attention heads and a slice of the MLP), o_proj and down_proj by input row, so a layer costs one
all-reduce in the forward pass and one in the backward pass. Embeddings, norms and the LM head stay replicated.
Moving weights between layouts goes through full tensors in memory (`full_state_dict` / `load_full_state_dict`),
never through disk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from earl_core.errors import ConfigError

COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("self_attn.o_proj", "mlp.down_proj")


def check_tp_degree(config: Any, tp: int, field: str = "layout.tp") -> None:
    """A TP degree must split attention heads, KV heads and the MLP width evenly."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = int(getattr(config, name))
        if tp < 1 or value % tp:
            raise ConfigError(field, f"{tp} does not divide {name}={value}",
                              allowed=[d for d in range(1, value + 1) if value % d == 0 and
                                       all(int(getattr(config, n)) % d == 0 for n in
                                           ("num_attention_heads", "num_key_value_heads", "intermediate_size"))])


def decoder_plan(model: torch.nn.Module) -> dict[str, ParallelStyle]:
    """The per-layer plan for `model.model.layers` (module names as in Hugging Face's Qwen2/Llama)."""
    plan: dict[str, ParallelStyle] = {}
    for i in range(len(model.model.layers)):
        for name in COLUMN:
            plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
        for name in ROW:
            plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
    return plan


def shard_model(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Split `model` in place across the 1-D `mesh` (every rank must hold the same full weights first)."""
    check_tp_degree(model.config, mesh.size())
    return parallelize_module(model, mesh, decoder_plan(model))


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full CPU tensors of every parameter and buffer (sharded ones are gathered; a collective on every rank)."""
    out = {}
    for key, value in model.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        out[key] = value.detach().to("cpu", copy=True)
    return out


@torch.no_grad()
def load_full_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy full tensors into `model`, each rank keeping its own shard of the sharded ones (bit-exact: a
    shard is a slice of the full tensor, nothing is recomputed)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise KeyError(f"state is missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for key, target in own.items():
        source = state[key]
        if isinstance(target, DTensor):
            # src_data_rank=None: every rank already holds the full tensor, so each just takes its slice.
            shard = distribute_tensor(source.to(target.device), target.device_mesh, target.placements,
                                      src_data_rank=None)
            target.to_local().copy_(shard.to_local())
        else:
            target.copy_(source)


def local_numel(model: torch.nn.Module) -> int:
    """Parameters this rank stores (a shard counts its local part only)."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank stores (the tensor itself when it is not sharded); shares its storage."""
    return t.to_local() if isinstance(t, DTensor) else t


def clip_grad_norm(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip gradients by their global norm and return the norm before clipping.

    A sharded gradient's squares are summed over the mesh dimensions it is sharded on (TP, FSDP's data-parallel
    ranks, or both in 2-D); over a dimension it is replicated on, and for a plain tensor, each copy counts once;
    a partial gradient (pending a sum over ranks) is summed first. Clipping scales every local part alike, which
    is right for partial ones too (scaling commutes with the pending sum).
    Gradients are bucketed by (mesh, sharded dimensions) in the order they come, the same on every rank, so each
    bucket costs one all-reduce per sharded dimension (and each partial gradient one more, to sum it).
    """
    grads = [p.grad for p in params if p.grad is not None]
    plain: torch.Tensor | None = None
    buckets: dict[tuple[Any, ...], tuple[DeviceMesh, tuple[int, ...], torch.Tensor]] = {}
    for g in grads:
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            # A partial gradient's local part is a summand, not a copy: its square counts only once summed (a
            # collective over those dimensions; every rank meets the same parameters in the same order).
            g = g.detach().redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
        # Squares stay on the gradient's device: NCCL reduces only CUDA tensors (gloo takes CPU ones).
        sq = local(g).detach().double().pow(2).sum()
        # Sharded on a dimension: Shard, or FSDP's _StridedShard under TP (which is not a Shard subclass).
        dims = (tuple(i for i, pl in enumerate(g.placements) if not (pl.is_replicate() or pl.is_partial()))
                if isinstance(g, DTensor) else ())
        if not dims:
            plain = sq if plain is None else plain + sq
            continue
        mesh = g.device_mesh
        key = (mesh.mesh_dim_names, tuple(mesh.shape), tuple(mesh.mesh.flatten().tolist()), dims)
        if key not in buckets:
            buckets[key] = (mesh, dims, torch.zeros((), dtype=torch.float64, device=sq.device))
        buckets[key][2].add_(sq)
    total = 0.0 if plain is None else float(plain)
    # Every rank meets the buckets in the same order (the same parameters), so the collectives line up.
    for mesh, dims, sq in buckets.values():
        for dim in dims:
            dist.all_reduce(sq, group=mesh.get_group(dim))
        total += float(sq)
    norm = math.sqrt(total)
    if max_norm > 0 and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for g in grads:
            local(g).mul_(coef)
    return norm


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state_dict with every sharded state tensor gathered (a collective on every rank): the same
    format a TP=1 optimizer writes, so a checkpoint resumes under any layout."""
    state = optimizer.state_dict()
    state["state"] = {idx: {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().to("cpu", copy=True)
                            if torch.is_tensor(v) else v for k, v in entry.items()}
                      for idx, entry in state["state"].items()}
    return state


@torch.no_grad()
def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load a full (TP=1 format) optimizer state, each rank keeping its own shard of a sharded parameter's state."""
    optimizer.load_state_dict(dict(state))
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor) or p not in optimizer.state:
                continue
            entry = optimizer.state[p]
            for k, v in list(entry.items()):
                if torch.is_tensor(v) and not isinstance(v, DTensor) and v.shape == p.shape:
                    entry[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
