"""Predicted peak memory of one worker for a (stage, layout, work) — weights, gradients, optimizer, activations, KV
cache — with a calibration fitted to measured peaks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from earl_core.parallel.layout import Layout

GIB = 1 << 30

# Saved activations per token per layer, in units of hidden_size / intermediate_size elements, for a
# Qwen2 block trained without recomputation: norms, q/k/v/o inputs and outputs, rotary copies, residuals
# (~16 x hidden) and the gated MLP's gate, up, activation and product (~4 x intermediate). Calibration
# corrects the overall scale against measured peaks.
_ACT_HIDDEN = 16
_ACT_INTERMEDIATE = 4


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on in a decoder-only transformer."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = True
    dtype_bytes: int = 4

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], *, dtype_bytes: int = 4) -> ModelShape:
        """From a Hugging Face ``config.json`` (Qwen2/Llama-style keys)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(hidden=hidden, layers=int(config["num_hidden_layers"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)), dtype_bytes=dtype_bytes)

    @property
    def params_per_layer(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        attn += self.heads * self.head_dim + 2 * self.kv_heads * self.head_dim  # q/k/v biases (Qwen2)
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embed + self.layers * self.params_per_layer + self.hidden


@dataclass(frozen=True)
class Work:
    """The work of one stage invocation: how many sequences, how long."""

    sequences: int
    """Sequences the whole stage handles (split over the DP replicas)."""
    context: int
    """Longest sequence in tokens (memory is sized for the worst case)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted bytes per worker, by part."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    kv_cache: int
    overhead: int

    @property
    def dynamic(self) -> int:
        """Everything the layout and work decide (the part calibration scales)."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache

    @property
    def total(self) -> int:
        return self.dynamic + self.overhead

    def to_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "kv_cache": self.kv_cache, "overhead": self.overhead,
                "total": self.total}


@dataclass(frozen=True)
class Calibration:
    """measured_peak ~= overhead + scale x predicted_dynamic (fitted by least squares)."""

    overhead: int = 0
    scale: float = 1.0
    samples: int = 0


class MemoryModel:
    """Peak memory of one worker of a layout, from the model's shape and the work."""

    def __init__(self, shape: ModelShape, calibration: Calibration | None = None) -> None:
        self.shape = shape
        self.calibration = calibration or Calibration()

    def estimate(self, layout: Layout, work: Work) -> MemoryEstimate:
        s, tp = self.shape, layout.tp
        b = s.dtype_bytes
        per_replica = -(-work.sequences // layout.dp)  # ceil: the fullest replica sizes the peak
        batch = min(layout.micro_batch, per_replica)
        weights = s.params * b // tp
        gradients = optimizer = activations = kv = 0
        if layout.stage == "rollout":
            # Every sequence of the replica holds its KV cache for its whole context while it decodes.
            kv_heads = max(1, s.kv_heads // tp)  # replicated KV heads when tp > kv_heads
            kv = 2 * s.layers * kv_heads * s.head_dim * b * work.context * per_replica
            activations = batch * s.vocab * 4 + batch * (s.hidden + s.intermediate // tp) * b * 4
        else:
            tokens = batch * work.context
            logits = tokens * (s.vocab // tp) * 4 * 2  # fp32 logits and their log-softmax
            if layout.stage == "experience":
                # Forward only: one block's activations live at a time, plus the logits.
                activations = tokens * (s.hidden * 4 + s.intermediate * 2 // tp) * b + logits
            else:
                per_layer = tokens * (_ACT_HIDDEN * s.hidden + _ACT_INTERMEDIATE * s.intermediate // tp) * b // tp
                if layout.checkpointing:
                    # Only each block's input is kept; one block is recomputed (and held) at a time in backward.
                    activations = s.layers * tokens * s.hidden * b + per_layer + logits
                else:
                    activations = s.layers * per_layer + logits
                shard = layout.dp if layout.shard == "fsdp" else 1
                gathered = s.params_per_layer * b // tp if shard > 1 else 0  # one block gathered in full
                weights = s.params * b // (tp * shard) + gathered
                gradients = s.params * b // (tp * shard) + gathered
                optimizer = 2 * s.params * 4 // (tp * shard)  # AdamW: two fp32 moments
        return MemoryEstimate(weights=weights, gradients=gradients, optimizer=optimizer, activations=activations,
                              kv_cache=kv, overhead=0)

    def predict(self, layout: Layout, work: Work) -> MemoryEstimate:
        """Calibrated estimate: the parts scaled, the fitted fixed overhead (runtime, libraries) added."""
        raw = self.estimate(layout, work)
        k = self.calibration.scale
        # Rounded up, part by part: a calibrated prediction never falls below a peak it was fitted to.
        return MemoryEstimate(weights=math.ceil(raw.weights * k), gradients=math.ceil(raw.gradients * k),
                              optimizer=math.ceil(raw.optimizer * k), activations=math.ceil(raw.activations * k),
                              kv_cache=math.ceil(raw.kv_cache * k), overhead=self.calibration.overhead)

    def calibrate(self, samples: Sequence[tuple[Layout, Work, int]]) -> Calibration:
        """Fit overhead and scale to measured peaks (bytes); keeps the fit and returns it.

        One sample fixes only the overhead (scale stays 1); from two distinct predictions on, both are fitted.
        The scale is kept >= 1 so calibration never makes the model more optimistic than its own formula.
        """
        if not samples:
            return self.calibration
        xs = [float(self.estimate(layout, work).dynamic) for layout, work, _ in samples]
        ys = [float(peak) for _, _, peak in samples]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        var = sum((x - mx) ** 2 for x in xs)
        scale = 1.0 if var == 0 else max(1.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var)
        # The overhead covers the worst sample, so no measured peak lies above the calibrated prediction.
        overhead = max(0.0, max(y - scale * x for x, y in zip(xs, ys)))
        self.calibration = Calibration(overhead=math.ceil(overhead), scale=scale, samples=n)
        return self.calibration
