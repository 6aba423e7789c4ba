"""Shared fixtures: a tiny model built locally (no downloads) once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests run only where CUDA is present; CI has none."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skipif(True, reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def protocol_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh 'tiny' Qwen2 policy with a tokenizer trained on the agent protocol's text."""
    from earl_core.agent.teacher import protocol_corpus
    from earl_core.models import create_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    return create_model("tiny", out, corpus=protocol_corpus(200, seed=0), seed=0)


@pytest.fixture(scope="session")
def protocol_tokenizer(protocol_model: Path):  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(protocol_model)
