"""Packs finished episodes into padded training tensors, with the agent-token mask shifted to next-token targets."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from earl_core.config import SFT_BATCHINGS

# Conversations sorted together when batching by length: 50 batches' worth, so each batch holds similar lengths
# while which conversations meet in a batch still changes from epoch to epoch (HF Trainer's group_by_length does
# the same with its mega-batches).
LENGTH_POOL_BATCHES = 50


@dataclass
class TrainBatch:
    """Right-padded sequences. `action_mask` and `old_logprobs` align with next-token targets (B, T-1)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    action_mask: torch.Tensor  # (B, T-1) float: 1 where token t+1 was written by the agent
    advantages: torch.Tensor  # (B,) float
    old_logprobs: torch.Tensor | None = None  # (B, T-1)
    ref_logprobs: torch.Tensor | None = None  # (B, T-1)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def action_tokens(self) -> int:
        return int(self.action_mask.sum().item())

    def slice(self, idx: list[int]) -> TrainBatch:
        t = int(self.attention_mask[idx].sum(dim=1).max().item())  # trim padding of this slice
        def cut(x: torch.Tensor | None, width: int) -> torch.Tensor | None:
            return None if x is None else x[idx, :width]
        return TrainBatch(
            input_ids=self.input_ids[idx, :t],
            attention_mask=self.attention_mask[idx, :t],
            action_mask=self.action_mask[idx, : t - 1],
            advantages=self.advantages[idx],
            old_logprobs=cut(self.old_logprobs, t - 1),
            ref_logprobs=cut(self.ref_logprobs, t - 1),
        )


def pack(records: Sequence[dict[str, Any]], advantages: Sequence[float] | torch.Tensor, *, pad_id: int) -> TrainBatch:
    """Episode records (token_ids, action_mask) plus one advantage each -> a TrainBatch."""
    if not records:
        raise ValueError("cannot pack an empty list of episodes")
    width = max(len(r["token_ids"]) for r in records)
    b = len(records)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    act = torch.zeros((b, width), dtype=torch.float32)
    for i, r in enumerate(records):
        n = len(r["token_ids"])
        ids[i, :n] = torch.tensor(r["token_ids"], dtype=torch.long)
        attn[i, :n] = 1
        act[i, :n] = torch.tensor(r["action_mask"], dtype=torch.float32)
    adv = torch.as_tensor(advantages, dtype=torch.float32).reshape(b)
    return TrainBatch(input_ids=ids, attention_mask=attn, action_mask=act[:, 1:].contiguous(), advantages=adv)


def chunk_by_length(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices of micro-batches of at most `size` sequences, grouped by length so little compute goes to padding
    (each micro-batch is padded to its longest sequence)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + size] for start in range(0, len(order), size)]


def sft_batches(items: Sequence[dict[str, Any]], size: int, rng: random.Random, *,
                batching: str = "by_length") -> list[list[dict[str, Any]]]:
    """`items` (conversations with token_ids) shuffled and cut into batches of `size`; the last may be smaller.
    by_length sorts each pool of LENGTH_POOL_BATCHES batches by length first: a batch is padded to its longest
    conversation, and teacher games run from ~500 to ~4,000 tokens, so shuffled batches of them spend more than
    half their compute on padding. The batches come in length order; the caller shuffles them."""
    if batching not in SFT_BATCHINGS:
        raise ValueError(f"batching must be one of {SFT_BATCHINGS}, got {batching!r}")
    order = list(range(len(items)))
    rng.shuffle(order)
    if batching == "shuffled":
        return [[items[i] for i in order[start : start + size]] for start in range(0, len(order), size)]
    pool = size * LENGTH_POOL_BATCHES  # a whole number of batches, so no batch straddles two pools
    batches = []
    for start in range(0, len(order), pool):
        members = order[start : start + pool]
        lengths = [len(items[i]["token_ids"]) for i in members]
        batches += [[items[members[j]] for j in chunk] for chunk in chunk_by_length(lengths, size)]
    return batches


def balance_by_tokens(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Indices per data-parallel rank, longest first onto the lightest rank, so ranks get similar token counts."""
    loads = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = loads.index(min(loads))
        out[k].append(i)
        loads[k] += lengths[i]
    return out


def mini_batch_rows(size: int, parts: int, rng: random.Random) -> list[list[int]]:
    """Row indices of `parts` optimiser steps over `size` sequences: shuffled, then dealt in turn, so the parts'
    sizes differ by at most one and each mixes the iteration's groups and opponents. One part keeps every row in
    order (the one-step-per-epoch default, unchanged). A part is empty where there are fewer rows than parts."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    rows = list(range(size))
    if parts == 1:
        return [rows]
    rng.shuffle(rows)
    return [rows[k::parts] for k in range(parts)]


def micro_batch_indices(batch: TrainBatch, size: int) -> Iterator[list[int]]:
    """Row indices of the micro-batches of `batch` (see chunk_by_length)."""
    yield from chunk_by_length(batch.attention_mask.sum(dim=1).tolist(), size)


def micro_batches(batch: TrainBatch, size: int) -> Iterator[TrainBatch]:
    """The micro-batches themselves (see micro_batch_indices)."""
    for idx in micro_batch_indices(batch, size):
        yield batch.slice(idx)
