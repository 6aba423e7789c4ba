"""The collective transport: shipments sent over a real gloo dispatch group arrive bit-exact, from many senders at
once, with and without advantages, and can be forwarded (the peer route)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.dispatch import wire
from earl_core.dispatch.shipment import Shipment

WORLD = 4


@pytest.fixture(scope="module")
def groups() -> Iterator[list[object]]:
    """Four ranks of one dispatch group, one per thread of this process, on loopback."""
    store, port = wire.host_store("127.0.0.1", WORLD, timeout_s=30)
    with ThreadPoolExecutor(WORLD) as pool:
        members = list(pool.map(lambda r: wire.join(host="127.0.0.1", store=("127.0.0.1", port), rank=r,
                                                    world=WORLD, timeout_s=30), range(WORLD)))
    yield members
    del store


def shipment(lengths: list[int], *, first_id: int, advantages: bool, seed: int) -> Shipment:
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    n, s = int(offsets[-1]), len(lengths)
    return Shipment(ids=torch.arange(first_id, first_id + s, dtype=torch.int64),
                    groups=torch.randint(0, 5, (s,), generator=gen, dtype=torch.int64),
                    rewards=torch.rand(s, generator=gen, dtype=torch.float64), offsets=offsets,
                    token_ids=torch.randint(0, 150_000, (n,), generator=gen, dtype=torch.int32),
                    action_mask=torch.randint(0, 2, (n,), generator=gen, dtype=torch.uint8),
                    advantages=torch.rand(s, generator=gen) if advantages else None)


def same(a: Shipment, b: Shipment) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f, _ in wire.FIELDS if getattr(a, f) is not None) \
        and (a.advantages is None) == (b.advantages is None)


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.lists(st.integers(0, 300), max_size=6), min_size=4, max_size=4),
       advantages=st.booleans())
def test_shipments_from_two_senders_reach_two_receivers_bit_exact(groups: list[object], lengths: list[list[int]],
                                                                  advantages: bool) -> None:
    # Ranks 0 and 1 send; ranks 2 and 3 receive one shipment from each (empty shipments included).
    out = {(src, dst): shipment(lengths[2 * src + dst - 2], first_id=100 * src + 10 * dst, advantages=advantages,
                                seed=src * 7 + dst) for src in (0, 1) for dst in (2, 3)}
    with ThreadPoolExecutor(WORLD) as pool:
        sends = [pool.submit(wire.send, groups[src], {dst: out[src, dst] for dst in (2, 3)}) for src in (0, 1)]
        got = [pool.submit(wire.receive, groups[dst], [0, 1]) for dst in (2, 3)]
        sent = sum(f.result(timeout=30) for f in sends)
        received = [f.result(timeout=30) for f in got]
    for dst, parts in zip((2, 3), received):
        assert all(same(part, out[src, dst]) for src, part in zip((0, 1), parts))
    assert sent == sum(s.nbytes for s in out.values())  # every field, as Shipment.nbytes counts them


def test_a_received_shipment_can_be_forwarded_to_a_peer(groups: list[object]) -> None:
    original = shipment([5, 0, 17], first_id=7, advantages=False, seed=3)

    def relay() -> None:
        (got,) = wire.receive(groups[1], [0])
        wire.send(groups[1], {2: got})

    with ThreadPoolExecutor(3) as pool:
        pool.submit(wire.send, groups[0], {1: original})
        forwarded = pool.submit(relay)
        final = pool.submit(wire.receive, groups[2], [1])
        forwarded.result(timeout=30)
        assert same(final.result(timeout=30)[0], original)


def test_two_ranks_that_send_each_other_a_shipment_both_finish(groups: list[object]) -> None:
    a, b = shipment([3, 9], first_id=1, advantages=True, seed=1), shipment([4], first_id=5, advantages=True, seed=2)
    with ThreadPoolExecutor(2) as pool:
        at_2 = pool.submit(wire.exchange, groups[2], {3: a}, [3])
        at_3 = pool.submit(wire.exchange, groups[3], {2: b}, [2])
        assert same(at_2.result(timeout=30)[0], b) and same(at_3.result(timeout=30)[0], a)
