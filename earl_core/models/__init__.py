"""Policy models: tokenizer training, architecture presets, building and loading HF checkpoints."""

from __future__ import annotations

from earl_core.models.factory import MODEL_PRESETS, ModelPreset, create_model, get_preset, load_policy
from earl_core.models.tokenizer import CHATML_TEMPLATE, IM_END, IM_START, PAD_TOKEN, train_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "IM_END",
    "IM_START",
    "MODEL_PRESETS",
    "PAD_TOKEN",
    "ModelPreset",
    "create_model",
    "get_preset",
    "load_policy",
    "train_tokenizer",
]
