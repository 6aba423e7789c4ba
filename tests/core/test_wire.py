"""The collective transport: shipments sent over a real gloo dispatch group arrive bit-exact, from many senders at
once, with and without advantages, and can be forwarded (the peer route) — over the socket, and through shared
memory between members on one node."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from earl_core.dispatch import wire
from earl_core.dispatch.shipment import Shipment

WORLD = 4


@pytest.fixture(scope="module", params=[False, True], ids=["socket", "shared_memory"])
def groups(request: pytest.FixtureRequest) -> Iterator[list[wire.Member]]:
    """Four ranks of one dispatch group, one per thread of this process, on loopback: one node, so with shared
    memory on every shipment goes through /dev/shm; with it off, over the socket."""
    store, port = wire.host_store("127.0.0.1", WORLD, timeout_s=30)
    with ThreadPoolExecutor(WORLD) as pool:
        members = list(pool.map(lambda r: wire.join(host="127.0.0.1", store=("127.0.0.1", port), rank=r,
                                                    world=WORLD, timeout_s=30, shared_memory=request.param),
                                range(WORLD)))
    assert members[0].same_node == (frozenset({1, 2, 3}) if request.param else frozenset())
    yield members
    del store


def shm_files() -> set[str]:
    return {p.name for p in wire.SHM_DIR.glob("earl-dispatch-*")}


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
def test_shipments_from_two_senders_reach_two_receivers_bit_exact(groups: list[wire.Member], lengths: list[list[int]],
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


def test_a_received_shipment_can_be_forwarded_to_a_peer(groups: list[wire.Member]) -> None:
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


def test_two_ranks_that_send_each_other_a_shipment_both_finish(groups: list[wire.Member]) -> None:
    a, b = shipment([3, 9], first_id=1, advantages=True, seed=1), shipment([4], first_id=5, advantages=True, seed=2)
    with ThreadPoolExecutor(2) as pool:
        at_2 = pool.submit(wire.exchange, groups[2], {3: a}, [3])
        at_3 = pool.submit(wire.exchange, groups[3], {2: b}, [2])
        assert same(at_2.result(timeout=30)[0], b) and same(at_3.result(timeout=30)[0], a)


def test_same_node_shipments_are_mapped_from_shared_memory_and_leave_no_file(groups: list[wire.Member]) -> None:
    original = shipment([40, 0, 333], first_id=9, advantages=True, seed=4)
    before = shm_files()
    with ThreadPoolExecutor(2) as pool:
        sent = pool.submit(wire.send, groups[0], {1: original})
        (got,) = pool.submit(wire.receive, groups[1], [0]).result(timeout=30)
        sent.result(timeout=30)
    assert same(got, original)
    backing = got.token_ids.untyped_storage().filename
    if groups[0].shm_dir is None:
        assert backing is None  # received into its own buffer from the socket
    else:
        assert backing is not None and backing.startswith(str(wire.SHM_DIR / "earl-dispatch-"))
    assert shm_files() == before  # the receiver removed the name at once


def test_members_on_different_addresses_use_the_socket() -> None:
    # Two members that name different addresses of this machine (127.0.0.1 and 127.0.0.2) are on different nodes
    # as far as the group knows: their shipments go over the socket even with shared memory on.
    store, port = wire.host_store("127.0.0.1", 2, timeout_s=30)
    with ThreadPoolExecutor(2) as pool:
        members = list(pool.map(lambda r: wire.join(host=f"127.0.0.{r + 1}", store=("127.0.0.1", port), rank=r,
                                                    world=2, timeout_s=30), range(2)))
        assert members[0].same_node == frozenset() == members[1].same_node
        original = shipment([12, 5], first_id=3, advantages=False, seed=5)
        pool.submit(wire.send, members[0], {1: original})
        (got,) = pool.submit(wire.receive, members[1], [0]).result(timeout=30)
    assert same(got, original) and got.token_ids.untyped_storage().filename is None
    del store


def test_joining_removes_files_whose_sender_is_gone_once_older_than_the_timeout(tmp_path: Path) -> None:
    # A pid that is gone here may be a live sender in another PID namespace sharing /dev/shm: only files older
    # than the group's timeout (30 s here), which no send can still be waiting on, are removed.
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"earl-dispatch-{int(child.stdout)}-left"
    fresh = tmp_path / f"earl-dispatch-{int(child.stdout)}-fresh"
    mine = tmp_path / f"earl-dispatch-{os.getpid()}-kept"
    for path in (gone, fresh, mine):
        path.write_bytes(b"x")
    an_hour_ago = time.time() - 3600
    os.utime(gone, (an_hour_ago, an_hour_ago))
    os.utime(mine, (an_hour_ago, an_hour_ago))
    store, port = wire.host_store("127.0.0.1", 1, timeout_s=30)
    wire.join(host="127.0.0.1", store=("127.0.0.1", port), rank=0, world=1, timeout_s=30, shm_dir=tmp_path)
    assert not gone.exists() and fresh.exists() and mine.exists()


def pair(shm_dirs: tuple[Path, Path], *, timeout_s: float = 30,
         need_room: bool = True) -> tuple[list[wire.Member], object]:
    """Two members on 127.0.0.1, each with its own idea of where shared memory is; the store, to keep alive."""
    for directory in shm_dirs if need_room else ():  # a shipment leaves 64 MiB free there, or goes over the socket
        room = os.statvfs(directory)
        if room.f_bavail * room.f_frsize < 128 << 20:
            pytest.skip(f"{directory} has less than 128 MiB free")
    store, port = wire.host_store("127.0.0.1", 2, timeout_s=timeout_s)
    with ThreadPoolExecutor(2) as pool:
        members = list(pool.map(lambda r: wire.join(host="127.0.0.1", store=("127.0.0.1", port), rank=r, world=2,
                                                    timeout_s=timeout_s, shm_dir=shm_dirs[r]), range(2)))
    return members, store


def files_in(directory: Path) -> list[Path]:
    return sorted(directory.glob("earl-dispatch-*"))


def test_members_that_share_an_address_but_not_shared_memory_use_the_socket(tmp_path: Path) -> None:
    # Two containers on one address, each with its own /dev/shm: neither sees the other's probe file.
    (a := tmp_path / "a").mkdir()
    (b := tmp_path / "b").mkdir()
    members, store = pair((a, b))
    assert members[0].same_node == frozenset() == members[1].same_node
    original = shipment([30, 2], first_id=1, advantages=True, seed=6)
    with ThreadPoolExecutor(2) as pool:
        sent = pool.submit(wire.send, members[0], {1: original})
        (got,) = pool.submit(wire.receive, members[1], [0]).result(timeout=30)
        assert sent.result(timeout=30) == original.nbytes
    assert same(got, original) and got.token_ids.untyped_storage().filename is None
    # The same two members with one shared directory do use it; the probes are gone once they have joined.
    members, store = pair((a, a))
    assert members[0].same_node == frozenset({1}) and members[1].same_node == frozenset({0})
    assert files_in(a) == [] and files_in(b) == []
    with ThreadPoolExecutor(2) as pool:
        sent = pool.submit(wire.send, members[0], {1: original})
        (got,) = pool.submit(wire.receive, members[1], [0]).result(timeout=30)
        assert sent.result(timeout=30) == original.nbytes
    assert same(got, original) and str(got.token_ids.untyped_storage().filename).startswith(str(a))
    del store


def test_a_send_that_nobody_receives_fails_and_removes_its_file(tmp_path: Path) -> None:
    members, store = pair((tmp_path, tmp_path), timeout_s=5)
    with pytest.raises(RuntimeError, match="[Tt]imed out"):
        wire.send(members[0], {1: shipment([50], first_id=0, advantages=False, seed=7)})
    assert files_in(tmp_path) == []
    del store


def test_a_shared_memory_file_that_does_not_match_its_header_is_refused_and_removed(tmp_path: Path) -> None:
    members, store = pair((tmp_path, tmp_path))
    original = shipment([64, 3], first_id=0, advantages=True, seed=8)
    expected = sum(-(-t.numel() * t.element_size() // 8) * 8 for t in wire._tensors(original))
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(wire.send, members[0], {1: original})
        deadline = time.monotonic() + 30
        while not (written := files_in(tmp_path)) or written[0].stat().st_size != expected:
            assert time.monotonic() < deadline, "the sender never wrote its file"
            time.sleep(0.01)
        with open(written[0], "ab") as f:  # damaged after the sender wrote it
            f.write(b"\0" * 8)
        with pytest.raises(RuntimeError, match=f"holds {expected + 8} bytes, its header describes {expected}"):
            wire.receive(members[1], [0])
        assert sent.result(timeout=30) == original.nbytes  # the sender's part was done
    assert files_in(tmp_path) == []
    del store


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 80 MiB tmpfs of its own: shared memory with little room (mounting needs root, as in CI here)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(mount)],
                                 capture_output=True).returncode == 0
    except FileNotFoundError:  # no mount command
        mounted = False
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root and mount)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)  # lazy: a failed test may still map a file


def test_a_shipment_that_would_fill_shared_memory_goes_over_the_socket(small_tmpfs: Path) -> None:
    # 80 MiB of room, 64 MiB of which stay free for the node's other processes: a 1 MiB shipment fits, 20 MiB not.
    members, store = pair((small_tmpfs, small_tmpfs), need_room=False)
    assert members[0].same_node == frozenset({1})
    small = shipment([1 << 18], first_id=0, advantages=False, seed=9)  # 256 Ki tokens x 5 bytes: 1.25 MiB
    large = shipment([4 << 20], first_id=1, advantages=False, seed=10)  # 20 MiB
    for original, through_file in ((small, True), (large, False)):
        with ThreadPoolExecutor(2) as pool:
            sent = pool.submit(wire.send, members[0], {1: original})
            (got,) = pool.submit(wire.receive, members[1], [0]).result(timeout=30)
            assert sent.result(timeout=30) == original.nbytes
        assert same(got, original)
        assert (got.token_ids.untyped_storage().filename is not None) == through_file
        del got
    assert files_in(small_tmpfs) == []
    del store
