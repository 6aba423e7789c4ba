"""Byte-level BPE tokenizer trained on protocol text, returned as the Qwen2 fast tokenizer HF loads it as."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from earl_core.errors import ConfigError

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# ChatML, as Qwen models use it: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, and the
# generation prompt opens an assistant turn. The agent protocol renders the very same text.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Byte-level BPE can always fall back to single bytes, so the vocabulary must at least hold the
# 256 byte symbols plus the special tokens.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def train_tokenizer(corpus: Iterable[str], *, vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus``; deterministic for a given corpus.

    The pipeline is exactly the one ``Qwen2Tokenizer`` rebuilds on load (NFC, Qwen's split regex,
    byte-level without prefix space): AutoTokenizer maps every ``qwen2`` checkpoint to that class,
    which ignores the pre-tokenizer stored in tokenizer.json, so anything else would tokenize
    differently after a save/load round trip. With that regex a board row ``X . . O`` splits into
    one piece per cell (``X``, ``Ġ.``, ``Ġ.``, ``ĠO``); a row-final ``.`` carries the newline.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError("model.vocab_size", f"{vocab_size} is too small", allowed=f">= {MIN_VOCAB_SIZE}")
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        # Seed every byte so unseen text (other languages, odd symbols) still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(backend.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]],
        unk_token=None,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        extra_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
