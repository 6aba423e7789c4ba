"""The warm start's batches: every conversation once per epoch, and by_length batches that waste little on padding."""

from __future__ import annotations

import random

import pytest

from earl_core.config import SFTConfig
from earl_core.errors import ConfigError
from earl_core.rl.batch import LENGTH_POOL_BATCHES, sft_batches


def conversations(lengths: list[int]) -> list[dict[str, object]]:
    return [{"index": i, "token_ids": [7] * n} for i, n in enumerate(lengths)]


def lengths_drawn(seed: int, lo: int, hi: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(count)]


def padded_tokens(batches: list[list[dict[str, object]]]) -> int:
    """What the trainer computes: each batch is padded to its longest conversation."""
    return sum(len(b) * max(len(c["token_ids"]) for c in b) for b in batches)


@pytest.mark.parametrize("batching", ["by_length", "shuffled"])
def test_every_conversation_once_and_full_batches_but_the_last(batching: str) -> None:
    items = conversations(lengths_drawn(3, 50, 4000, 1003))
    batches = sft_batches(items, 8, random.Random(0), batching=batching)
    assert sorted(c["index"] for b in batches for c in b) == list(range(1003))
    assert [len(b) for b in batches] == [8] * 125 + [3]


def test_shuffled_is_the_seeded_shuffle_cut_in_order() -> None:
    # The batching of runs before by_length existed: their bench commands reproduce with sft.batching=shuffled.
    items = conversations(list(range(1, 41)))
    order = list(range(40))
    random.Random(5).shuffle(order)
    batches = sft_batches(items, 8, random.Random(5), batching="shuffled")
    assert [[c["index"] for c in b] for b in batches] == [order[k : k + 8] for k in range(0, 40, 8)]


def test_by_length_sorts_within_pools_and_cuts_padding() -> None:
    # Three pools of lengths spread like teacher games (500 to 4,000 tokens).
    size = 8
    lengths = lengths_drawn(1, 500, 4000, 3 * size * LENGTH_POOL_BATCHES)
    items = conversations(lengths)
    by_length = sft_batches(items, size, random.Random(0), batching="by_length")
    shuffled = sft_batches(items, size, random.Random(0), batching="shuffled")
    # Within a pool the batches follow each other in length order and do not overlap.
    for pool in range(3):
        run = by_length[pool * LENGTH_POOL_BATCHES : (pool + 1) * LENGTH_POOL_BATCHES]
        spans = [(min(len(c["token_ids"]) for c in b), max(len(c["token_ids"]) for c in b)) for b in run]
        assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:]))
    # The same conversations as the shuffled batching, and padding near nothing against about 40% of it.
    real = sum(lengths)
    assert padded_tokens(by_length) < 1.03 * real
    assert padded_tokens(shuffled) > 1.4 * real


def test_by_length_changes_who_meets_with_the_seed() -> None:
    items = conversations(lengths_drawn(2, 50, 4000, 800))
    first = {tuple(sorted(c["index"] for c in b)) for b in sft_batches(items, 8, random.Random(0))}
    second = {tuple(sorted(c["index"] for c in b)) for b in sft_batches(items, 8, random.Random(1))}
    assert len(first & second) < len(first) // 2


def test_unknown_batching_is_refused_naming_the_field_and_choices() -> None:
    with pytest.raises(ConfigError) as err:
        SFTConfig(batching="sorted")
    assert "sft.batching" in str(err.value) and "by_length" in str(err.value) and "shuffled" in str(err.value)
    with pytest.raises(ValueError, match="by_length"):
        sft_batches(conversations([5, 6]), 1, random.Random(0), batching="sorted")
