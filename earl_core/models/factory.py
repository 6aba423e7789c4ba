"""Model presets, building a fresh Qwen2 policy on disk, and loading any Hugging Face policy."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from earl_core.errors import ConfigError, ModelLoadError
from earl_core.models.tokenizer import PAD_TOKEN, train_tokenizer

# vLLM's CPU attention kernels only exist for these head sizes; GPU kernels accept all of them too.
SUPPORTED_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
# Files a loadable model directory must hold (weights may be sharded, checked separately).
REQUIRED_FILES = ("config.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ModelPreset:
    """A Qwen2 architecture: small ones to train on CPU, and real models' shapes (random weights) for GPU benches."""

    hidden_size: int
    """Width of the residual stream."""
    num_attention_heads: int
    """Query heads; head size = hidden_size / num_attention_heads."""
    num_key_value_heads: int
    """KV heads (grouped-query attention); must divide num_attention_heads."""
    intermediate_size: int
    """Width of the MLP."""
    num_hidden_layers: int
    """Transformer blocks."""
    max_position_embeddings: int = 16384
    """Longest sequence the rotary embedding is configured for."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the LM head (halves parameters at this size)."""
    embedding_rows: int | None = None
    """Rows of the embedding and LM head when the model has more than the tokenizer's vocabulary (Qwen2.5 pads
    its vocabulary to 151,936); None: exactly the tokenizer's. Speed and memory depend on it, not on the tokens."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("model.hidden_size", "must be a multiple of num_attention_heads")
        if self.head_dim not in SUPPORTED_HEAD_SIZES:
            raise ConfigError(
                "model.head_dim", f"{self.head_dim} is not supported by vLLM", allowed=SUPPORTED_HEAD_SIZES
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("model.num_key_value_heads", "must divide num_attention_heads")
        if self.embedding_rows is not None and self.embedding_rows < 1:
            raise ConfigError("model.embedding_rows", f"must be positive, got {self.embedding_rows}", allowed=">= 1")

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.hidden_size // self.num_attention_heads


_TINY = ModelPreset(
    hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256, num_hidden_layers=2
)
MODEL_PRESETS: dict[str, ModelPreset] = {
    "tiny": _TINY,
    # tiny's width at twice its depth: whether seeing a four through a landing cell needs more layers (bench/README.md).
    "tiny-deep": replace(_TINY, num_hidden_layers=4),
    "small": ModelPreset(
        hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768, num_hidden_layers=4
    ),
    # The shapes of Qwen2.5-0.5B and -1.5B (their config.json), built with random weights: for GPU benches, where
    # speed and memory depend on the shape and not on what the weights have learnt. Too large to train on CPU.
    "qwen2.5-0.5b-shape": ModelPreset(
        hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, num_hidden_layers=24,
        max_position_embeddings=32768, embedding_rows=151936,
    ),
    "qwen2.5-1.5b-shape": ModelPreset(
        hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960, num_hidden_layers=28,
        max_position_embeddings=32768, embedding_rows=151936,
    ),
}


def get_preset(preset: str) -> ModelPreset:
    """The preset called ``preset``; ConfigError listing the known ones otherwise."""
    if preset not in MODEL_PRESETS:
        raise ConfigError("model.preset", f"unknown preset {preset!r}", allowed=list(MODEL_PRESETS))
    return MODEL_PRESETS[preset]


def model_config(spec: ModelPreset, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The Qwen2 config of ``spec`` for ``tokenizer`` (special token ids from it, embedding rows from either)."""
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    if spec.embedding_rows is not None and spec.embedding_rows < len(tokenizer):
        raise ConfigError("model.embedding_rows", f"{spec.embedding_rows} rows cannot hold the tokenizer's "
                          f"{len(tokenizer)} tokens", allowed=f">= {len(tokenizer)}")
    return Qwen2Config(
        vocab_size=spec.embedding_rows or len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        # Qwen convention: <|endoftext|> is BOS/pad, <|im_end|> ends a turn.
        bos_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def create_model(
    preset: str, out_dir: Path, *, corpus: Iterable[str], seed: int = 0, vocab_size: int = 512
) -> Path:
    """Train a tokenizer on ``corpus``, build a freshly initialised Qwen2 and save both in HF format."""
    spec = get_preset(preset)
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    config = model_config(spec, tokenizer)
    pad_id = config.pad_token_id
    # fork_rng keeps the caller's global RNG stream untouched by our seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    # A plain generation config: vLLM reads it for default sampling, so it carries no sampling knobs.
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad_id
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def load_policy(
    path_or_id: str, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer the way any HF user would (local directory or hub id)."""
    path = Path(path_or_id).expanduser()
    # Anything that exists or looks like a filesystem path is local; the rest is a hub id.
    if path.exists() or path_or_id.startswith((".", "/", "~")):
        _check_model_dir(path)
        path_or_id = str(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path_or_id)
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"could not load model {path_or_id!r}: {exc}") from exc
    model.eval()
    return model, tokenizer


def _check_model_dir(path: Path) -> None:
    """Fail early, naming the path, when a local model directory is missing or incomplete."""
    if not path.is_dir():
        raise ModelLoadError(f"model directory {str(path)!r} does not exist")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    if not has_weights:
        missing.append("model.safetensors")
    if missing:
        raise ModelLoadError(f"model directory {str(path)!r} is incomplete: missing {', '.join(missing)}")
