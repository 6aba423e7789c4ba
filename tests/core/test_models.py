"""Tokenizer training, model presets, building a model on disk and loading it back the HF way."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from earl_core.config import TRAINABLE_PRESETS
from earl_core.errors import ConfigError, ModelLoadError
from earl_core.models import (
    IM_END,
    IM_START,
    MODEL_PRESETS,
    PAD_TOKEN,
    ModelPreset,
    create_model,
    load_policy,
    train_tokenizer,
)
from earl_core.models.factory import model_config
from earl_core.parallel.memory import ModelShape

HEADER = "0 1 2 3 4 5 6"


def random_board(rng: random.Random) -> str:
    """A Connect Four rendering like the agent's: header row, then six rows of `.`, `X`, `O`."""
    rows = [" ".join(rng.choice("..XO") for _ in range(7)) for _ in range(6)]
    return "\n".join([HEADER, *rows])


def protocol_like_corpus(games: int = 120, *, seed: int = 0) -> list[str]:
    """ChatML conversations shaped like the game protocol (boards, legal columns, `[col N]` answers)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(games):
        parts = [f"{IM_START}system\nYou play Connect Four. Answer with [col N].{IM_END}\n"]
        for _ in range(rng.randint(1, 4)):
            legal = sorted(rng.sample(range(7), rng.randint(1, 7)))
            head = rng.choice(["Your move.", f"Opponent played [col {rng.randint(0, 6)}]."])
            user = f"{head}\n{random_board(rng)}\nLegal columns: {', '.join(map(str, legal))}."
            parts.append(f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n[col {rng.choice(legal)}]{IM_END}\n")
        texts.append("".join(parts))
    return texts


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(protocol_like_corpus(), vocab_size=400)


def test_round_trip_of_protocol_text(tokenizer: PreTrainedTokenizerFast) -> None:
    text = protocol_like_corpus(3, seed=7)[2] + "Ünïcode ♟ and unseen words still encode."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_every_board_cell_is_one_token(tokenizer: PreTrainedTokenizerFast) -> None:
    board = random_board(random.Random(3))
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(board, add_special_tokens=False))
    # Byte-level tokens spell a space as Ġ and a newline as Ċ; strip them to see the cell each carries.
    cells = [p.replace("Ġ", "").replace("Ċ", "") for p in pieces]
    assert [c for c in cells if c] == board.split()
    row = "X . . O . . ."
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(row, add_special_tokens=False)) == [
        "X", "Ġ.", "Ġ.", "ĠO", "Ġ.", "Ġ.", "Ġ.",
    ]


def test_special_tokens_are_single_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    for token in (PAD_TOKEN, IM_START, IM_END):
        ids = tokenizer.encode(f"a{token}b", add_special_tokens=False)
        assert tokenizer.convert_tokens_to_ids(token) in ids
        assert len(ids) == 3
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token == PAD_TOKEN
    # Frequent protocol phrases were merged into few tokens.
    assert len(tokenizer.encode("Legal columns:", add_special_tokens=False)) <= 3


def test_chat_template_renders_chatml(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Your move."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nYour move.<|im_end|>\n<|im_start|>assistant\n"
    )
    closed = tokenizer.apply_chat_template(messages[:1], tokenize=False)
    assert closed == "<|im_start|>system\nRules.<|im_end|>\n"


def test_training_is_deterministic() -> None:
    first = train_tokenizer(protocol_like_corpus(40, seed=1), vocab_size=350)
    second = train_tokenizer(protocol_like_corpus(40, seed=1), vocab_size=350)
    assert first.get_vocab() == second.get_vocab()


def test_too_small_vocab_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        train_tokenizer(["x"], vocab_size=100)
    assert info.value.field == "model.vocab_size"


def test_presets_have_vllm_head_sizes() -> None:
    assert MODEL_PRESETS["tiny"].head_dim == 32
    assert MODEL_PRESETS["small"].head_dim == 64
    with pytest.raises(ConfigError) as info:
        ModelPreset(
            hidden_size=120, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256, num_hidden_layers=1
        )
    assert info.value.field == "model.head_dim"


def test_trainable_presets_exist_and_tiny_deep_only_adds_layers() -> None:
    assert set(TRAINABLE_PRESETS) <= set(MODEL_PRESETS)
    tiny, deep = MODEL_PRESETS["tiny"], MODEL_PRESETS["tiny-deep"]
    assert deep == dataclasses.replace(tiny, num_hidden_layers=2 * tiny.num_hidden_layers)


@pytest.mark.parametrize(("preset", "params"), [("qwen2.5-0.5b-shape", 494_032_768), ("qwen2.5-1.5b-shape", 1_543_714_304)])
def test_realistic_shapes_match_the_real_models(preset: str, params: int) -> None:
    # Built on the meta device (no memory, no weights): the parameter count of Qwen2.5-0.5B / -1.5B as published,
    # and the memory model's count of the same config agrees.
    config = model_config(MODEL_PRESETS[preset], train_tokenizer(protocol_like_corpus(20)))
    assert config.vocab_size == 151_936
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == params
    assert ModelShape.from_hf_config(config.to_dict()).params == params


def test_embedding_rows_must_hold_the_tokenizer() -> None:
    spec = ModelPreset(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                       num_hidden_layers=1, embedding_rows=300)
    with pytest.raises(ConfigError) as info:
        model_config(spec, train_tokenizer(protocol_like_corpus(20)))
    assert info.value.field == "model.embedding_rows"


def test_create_then_load_round_trip(tmp_path: Path) -> None:
    corpus = protocol_like_corpus(60)
    out = create_model("tiny", tmp_path / "tiny", corpus=corpus, seed=3)
    files = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
    for name in files:
        assert (out / name).is_file(), name
    model, tokenizer = load_policy(str(out))
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size == 128 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.dtype == torch.float32
    # The loaded tokenizer tokenizes exactly like the freshly trained one.
    fresh = train_tokenizer(corpus)
    sample = protocol_like_corpus(2, seed=9)[1]
    assert tokenizer.encode(sample, add_special_tokens=False) == fresh.encode(sample, add_special_tokens=False)
    assert AutoTokenizer.from_pretrained(out).chat_template == fresh.chat_template
    # Same seed, same weights; another seed, other weights.
    again, _ = load_policy(str(create_model("tiny", tmp_path / "again", corpus=corpus, seed=3)))
    other, _ = load_policy(str(create_model("tiny", tmp_path / "other", corpus=corpus, seed=4)))
    weight = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(model.state_dict()[weight], again.state_dict()[weight])
    assert not torch.equal(model.state_dict()[weight], other.state_dict()[weight])


def test_unknown_preset_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        create_model("huge", tmp_path, corpus=["x"])
    assert info.value.field == "model.preset"
    assert "tiny" in info.value.allowed and "small" in info.value.allowed


def test_missing_model_dir_error_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match=str(missing)):
        load_policy(str(missing))


def test_incomplete_model_dir_error_names_the_path(tmp_path: Path) -> None:
    out = create_model("tiny", tmp_path / "tiny", corpus=protocol_like_corpus(20))
    (out / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model.safetensors") as info:
        load_policy(str(out))
    assert str(out) in str(info.value)
