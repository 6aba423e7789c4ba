"""Tensor parallelism of a Hugging Face decoder (Qwen2 / Llama family) with PyTorch's own DTensor APIs.

Megatron-style: in every layer the q/k/v and gate/up projections are split by output column (each rank holds
whole attention heads and a slice of the MLP), o_proj and down_proj by input row, so a layer costs one
all-reduce in the forward pass and one in the backward pass. Embeddings, norms and the LM head stay replicated.
Moving weights between layouts goes through full tensors in memory (`full_state_dict` / `load_full_state_dict`),
never through disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from earl_core.errors import ConfigError

COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("self_attn.o_proj", "mlp.down_proj")


def check_tp_degree(config: Any, tp: int) -> None:
    """A TP degree must split attention heads, KV heads and the MLP width evenly."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = int(getattr(config, name))
        if tp < 1 or value % tp:
            raise ConfigError("layout.tp", f"{tp} does not divide {name}={value}",
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
