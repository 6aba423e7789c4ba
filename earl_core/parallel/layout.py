"""Parallel layouts of a stage (TP x DP, micro-batch, sharding, activation checkpointing) and their candidates."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from earl_core.errors import ConfigError

STAGES = ("rollout", "experience", "train")
"""The stages a layout is chosen for: generation, reference/old log-probs, the training step."""
SHARDING = ("none", "fsdp")
"""Training state sharding over the data-parallel ranks: none (replicated) or FSDP (parameters, gradients and
optimizer state sharded, parameters gathered one block at a time)."""

_KEY_RE = re.compile(r"^tp(\d+)\.dp(\d+)\.mb(\d+)(\+fsdp)?(\+ckpt)?$")


@dataclass(frozen=True)
class Layout:
    """How one stage's work is spread: ``tp`` x ``dp`` workers, ``micro_batch`` sequences per forward pass."""

    stage: str
    tp: int = 1
    """Tensor-parallel degree: each weight matrix split over this many workers."""
    dp: int = 1
    """Data-parallel degree: replicas (or FSDP shards) each taking a share of the sequences."""
    micro_batch: int = 1
    """Sequences per forward pass on one replica (for rollout: sequences decoded together per replica)."""
    shard: str = "none"
    """Training only: none or fsdp."""
    checkpointing: bool = False
    """Training only: recompute activations in the backward pass instead of keeping them."""

    def __post_init__(self) -> None:
        field = f"parallelism.{self.stage}"
        if self.stage not in STAGES:
            raise ConfigError("parallelism.stage", f"unknown stage {self.stage!r}", allowed=STAGES)
        for name in ("tp", "dp", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
                raise ConfigError(f"{field}.{name}", f"must be a whole number, got {value!r}", allowed="1..4096")
        if self.shard not in SHARDING:
            raise ConfigError(f"{field}.shard", f"unknown sharding {self.shard!r}", allowed=SHARDING)
        if not isinstance(self.checkpointing, bool):
            raise ConfigError(f"{field}.checkpointing", f"must be true or false, got {self.checkpointing!r}",
                              allowed="true, false")
        if self.stage != "train" and (self.shard != "none" or self.checkpointing):
            # Nothing is trained outside the train stage, so there is no optimizer state to shard or backward to save.
            raise ConfigError(f"{field}.shard", "sharding and activation checkpointing apply to the train stage only",
                              allowed="shard=none, checkpointing=false")

    @property
    def workers(self) -> int:
        """Workers the layout occupies."""
        return self.tp * self.dp

    @property
    def key(self) -> str:
        """Short stable name, e.g. ``tp2.dp1.mb8+fsdp+ckpt`` (what profiles and events refer to)."""
        text = f"tp{self.tp}.dp{self.dp}.mb{self.micro_batch}"
        if self.shard == "fsdp":
            text += "+fsdp"
        if self.checkpointing:
            text += "+ckpt"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "key": self.key}

    @classmethod
    def parse(cls, stage: str, key: str) -> Layout:
        """The layout a key names (``tp1.dp2.mb4``, optionally ``+fsdp`` / ``+ckpt``); ConfigError otherwise."""
        match = _KEY_RE.match(key.strip().lower()) if isinstance(key, str) else None
        if match is None:
            raise ConfigError(f"parallelism.{stage}", f"cannot read layout {key!r}",
                              allowed="tpT.dpD.mbM with optional +fsdp and +ckpt, e.g. tp1.dp2.mb8")
        tp, dp, mb = (int(g) for g in match.groups()[:3])
        return cls(stage, tp=tp, dp=dp, micro_batch=mb, shard="fsdp" if match.group(4) else "none",
                   checkpointing=bool(match.group(5)))


def tp_degrees(workers: int, heads: int, kv_heads: int) -> list[int]:
    """Tensor-parallel degrees that divide the workers and split the attention heads evenly.

    Query heads must divide evenly; KV heads must divide evenly or be a divisor of the degree (vLLM then replicates
    each KV head over ``tp / kv_heads`` ranks).
    """
    out = []
    for tp in range(1, workers + 1):
        if workers % tp or heads % tp:
            continue
        if kv_heads % tp and tp % kv_heads:
            continue
        out.append(tp)
    return out


def candidate_layouts(stage: str, workers: int, *, heads: int, kv_heads: int,
                      micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16),
                      train_options: bool = True) -> list[Layout]:
    """Every layout of ``stage`` that uses all ``workers`` (TP x DP = workers), for each micro-batch size.

    For the train stage, with ``train_options``, each also comes with FSDP sharding (when DP > 1) and with
    activation checkpointing: the memory guard then has lighter layouts to fall back on at long context.
    """
    if workers < 1:
        raise ConfigError("parallelism.workers", f"must be at least 1, got {workers}", allowed=">= 1")
    layouts = []
    for tp in tp_degrees(workers, heads, kv_heads):
        dp = workers // tp
        for mb in micro_batches:
            layouts.append(Layout(stage, tp=tp, dp=dp, micro_batch=mb))
            if stage == "train" and train_options:
                shards = ("none", "fsdp") if dp > 1 else ("none",)
                for shard in shards:
                    for ckpt in (False, True):
                        if shard == "none" and not ckpt:
                            continue  # the plain layout, added above
                        layouts.append(Layout(stage, tp=tp, dp=dp, micro_batch=mb, shard=shard, checkpointing=ckpt))
    return layouts
