"""Shipments over torch.distributed point-to-point messages (gloo): the Data Dispatcher's collective transport.

A dispatch group is a gloo process group of its own that spans the rollout engines and the trainer ranks (it does
not touch the trainer's default process group): source rank ``i`` is engine ``i``, destination rank ``r`` is
``engines + r``. Its rendezvous store is hosted by one member, so the driver never carries bulk bytes nor the
store's traffic. Each shipment goes as one header message then one message per field, each on its own tag, so a
receiver sizes its buffers before the bulk arrives and messages from several senders never mix.

Between two members on the same node (the same address) the bulk skips the socket: the sender writes the fields
once into a file in shared memory (``/dev/shm``) and sends only its name; the receiver maps the file (no copy) and
removes its name at once, so the memory is freed when the receiver drops the tensors. Over loopback TCP the same
bytes were copied into and out of the kernel with every rank of the machine competing for its cores. When shared
memory is missing or has no room, the shipment goes over the socket as before.

No file outlives a failure: a gloo send completes only once its receiver has posted the matching receive, so a
sender whose call fails removes each file whose name did not reach its receiver, and a receiver removes every file
it was named, whether the shipment could be read or not. Only a process killed between those points leaves a file; members sweep the files
of dead senders (older than the group's timeout) when they join.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from earl_core.dispatch.plan import ReceiveSchedule
from earl_core.dispatch.shipment import Shipment

T = TypeVar("T")

HEADER_TAG = 1
FIELDS: tuple[tuple[str, torch.dtype], ...] = (
    ("ids", torch.int64), ("groups", torch.int64), ("rewards", torch.float64), ("offsets", torch.int64),
    ("token_ids", torch.int32), ("action_mask", torch.uint8), ("advantages", torch.float32))
"""Fields in the order they travel, with their dtypes (the receiver allocates from the header's sizes)."""
NAME_TAG = 64
"""The tag of the message that names a shared-memory file (after the field tags)."""
NAME_BYTES = 128
SHM_DIR = Path("/dev/shm")
_ALIGN = 8  # every field starts 8-byte aligned in a shared-memory file, so it can be viewed as its dtype
_FILE = re.compile(r"earl-dispatch-[0-9]+-[0-9a-f]{32}")
_HEADROOM = 64 << 20
"""Bytes of shared memory a shipment leaves free (other processes of the node use /dev/shm too); a shipment that
would leave less goes over the socket instead of filling it."""


@dataclass(frozen=True)
class Member:
    """This process's place in a dispatch group: the gloo group, and which ranks share its node (their
    shipments may go through shared memory)."""

    group: dist.ProcessGroupGloo
    rank: int
    same_node: frozenset[int]
    shm_dir: Path | None
    """Where shared-memory files go; None: every shipment goes over the socket."""


def host_store(host: str, world: int, *, timeout_s: float = 300.0) -> tuple[dist.TCPStore, int]:
    """Start the group's rendezvous store on ``host`` (a free port); keep the returned store alive while the group
    lives."""
    store = dist.TCPStore(host, 0, world, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    return store, int(store.port)


def join(*, host: str, store: tuple[str, int] | dist.Store, rank: int, world: int,
         timeout_s: float = 300.0, shared_memory: bool = True, shm_dir: Path = SHM_DIR) -> Member:
    """Join the dispatch group as ``rank`` of ``world``; traffic leaves from ``host`` (this node's address, so the
    group works inside network namespaces where the hostname does not resolve to an interface of the node).

    Two members use shared memory between them when both have it on, name the same address, and each sees a
    file the other made in ``shm_dir``: the address keeps emulated nodes (network namespaces of one machine,
    which share /dev/shm) apart; the file keeps apart containers that share an address but not /dev/shm."""
    if not isinstance(store, dist.Store):
        store = dist.TCPStore(store[0], store[1], world, False, timedelta(seconds=timeout_s))
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    group = dist.ProcessGroupGloo(dist.PrefixStore("dispatch", store), rank, world, options)
    probe = _make_probe(shm_dir, timeout_s) if shared_memory else None
    try:
        # Each member's address and its probe file's name (empty: no shared memory), then which probes each sees.
        mine = torch.cat([_encode(host), _encode(probe.name if probe else "")])
        everyone = [torch.empty(2 * NAME_BYTES, dtype=torch.uint8) for _ in range(world)]
        group.allgather([everyone], [mine]).wait()
        seen = torch.zeros(world, dtype=torch.uint8)
        for r, other in enumerate(everyone):
            address, name = _decode(other[:NAME_BYTES]), _decode(other[NAME_BYTES:])
            seen[r] = int(probe is not None and r != rank and address == host and bool(_FILE.fullmatch(name))
                          and (shm_dir / name).exists())
        views = [torch.empty(world, dtype=torch.uint8) for _ in range(world)]
        group.allgather([views], [seen]).wait()
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)
    same = frozenset(r for r in range(world) if seen[r] and views[r][rank])
    return Member(group=group, rank=rank, same_node=same, shm_dir=shm_dir if probe is not None else None)


def _make_probe(shm_dir: Path, stale_s: float) -> Path | None:
    """Sweep the files of dead senders, then make this member's probe file; None when shared memory cannot be
    used here (no such directory, or not writable)."""
    if not (shm_dir.is_dir() and os.access(shm_dir, os.W_OK)):
        return None
    _sweep(shm_dir, stale_s)
    probe = shm_dir / _new_name()
    try:
        probe.touch(exist_ok=False)
    except OSError:
        return None
    return probe


def _new_name() -> str:
    return f"earl-dispatch-{os.getpid()}-{uuid.uuid4().hex}"


def _encode(text: str) -> torch.Tensor:
    out = torch.zeros(NAME_BYTES, dtype=torch.uint8)
    encoded = text.encode()[: NAME_BYTES - 1]
    if encoded:
        out[: len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    return out


def _decode(message: torch.Tensor) -> str:
    return bytes(message.tolist()).rstrip(b"\0").decode(errors="replace")


def _tensors(shipment: Shipment) -> list[torch.Tensor]:
    out = []
    for name, dtype in FIELDS:
        t = getattr(shipment, name)
        if t is not None:
            assert t.dtype == dtype, f"{name} is {t.dtype}, the wire format says {dtype}"
            out.append(t.contiguous())
    return out


def _sweep(directory: Path, stale_s: float) -> None:
    """Remove shared-memory files whose sender process is gone and that are older than ``stale_s`` (the group's
    timeout): a receiver that failed before taking its shipment leaves the file behind, and nothing else would
    free that memory. The age guards a live sender in another PID namespace sharing this /dev/shm (containers):
    its pid means nothing here, but a file of its is in flight for at most the timeout of its send."""
    now = time.time()
    for path in directory.glob("earl-dispatch-*-*"):
        try:
            pid = int(path.name.split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                if now - path.stat().st_mtime > stale_s:
                    path.unlink(missing_ok=True)
            except (PermissionError, FileNotFoundError):  # another user's file (/dev/shm is sticky), or gone
                continue
        except (ValueError, PermissionError):
            continue


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % _ALIGN)


def _to_shared_memory(member: Member, tensors: list[torch.Tensor]) -> Path | None:
    """Write the fields into a new shared-memory file; its path, or None when there is no room (then the
    shipment goes over the socket). Free space is checked first, so a shipment never fills /dev/shm for the
    node's other processes; it is written with write(), not through a mapping, so losing a race for the last
    pages is an error here (ENOSPC) rather than a crash on a page fault."""
    if member.shm_dir is None:
        return None
    nbytes = sum(_padded(t.numel() * t.element_size()) for t in tensors)
    room = os.statvfs(member.shm_dir)
    if room.f_bavail * room.f_frsize < nbytes + _HEADROOM:
        return None
    path = member.shm_dir / _new_name()
    try:
        with open(path, "xb") as f:
            for t in tensors:
                data = t.numpy().data
                f.write(data)
                f.write(bytes(_padded(data.nbytes) - data.nbytes))
    except OSError:
        path.unlink(missing_ok=True)
        return None
    return path


def _post(member: Member, shipments: Mapping[int, Shipment], works: list[dist.Work],
          files: list[tuple[Path, dist.Work | None]]) -> int:
    """Post every message of ``shipments`` (appending to ``works``, and to ``files`` each shared-memory file
    written with the send of its name, None until that is posted); returns the bytes sent."""
    sent = 0
    for rank, shipment in shipments.items():
        tensors = _tensors(shipment)
        path = _to_shared_memory(member, tensors) if rank in member.same_node else None
        if path is not None:
            files.append((path, None))
        header = torch.tensor([len(shipment), shipment.token_ids.numel(), int(shipment.advantages is not None),
                               int(path is not None)], dtype=torch.int64)
        works.append(member.group.send([header], rank, HEADER_TAG))
        if path is not None:
            works.append(member.group.send([_encode(path.name)], rank, NAME_TAG))
            files[-1] = (path, works[-1])
        else:
            for tag, tensor in enumerate(tensors, start=HEADER_TAG + 1):
                works.append(member.group.send([tensor], rank, tag))
        sent += sum(t.numel() * t.element_size() for t in tensors)
    return sent


def _sending(member: Member, shipments: Mapping[int, Shipment], then: Callable[[], T]) -> tuple[int, T]:
    """Post ``shipments``, run ``then`` (what this rank does while they go), wait for the sends. If anything
    fails, each file this call wrote whose name did not reach its receiver is removed (the send of a name
    completes only once the receiver has it; a receiver that has it owns the file)."""
    works: list[dist.Work] = []
    files: list[tuple[Path, dist.Work | None]] = []
    try:
        sent = _post(member, shipments, works, files)
        result = then()
        for work in works:
            work.wait()
    except BaseException:
        for path, named in files:
            if not _delivered(named):
                path.unlink(missing_ok=True)
        raise
    return sent, result


def _delivered(work: dist.Work | None) -> bool:
    """Whether a posted send or receive went through, waiting for it if it is still running (at most the group's
    timeout). A finished one is asked, not waited on again: a second wait on a gloo work blocks until the
    timeout."""
    if work is None:
        return False
    if work.is_completed():
        return work.exception() is None
    try:
        return bool(work.wait())
    except Exception:  # noqa: BLE001 - a failed send is the answer here, not an error to pass on
        return False


def send(member: Member, shipments: Mapping[int, Shipment]) -> int:
    """Send one shipment to each destination rank of ``shipments`` (all at once); returns the bytes sent."""
    sent, _ = _sending(member, shipments, lambda: None)
    return sent


def exchange(member: Member, outgoing: Mapping[int, Shipment], sources: Sequence[int]) -> list[Shipment]:
    """Send ``outgoing`` and receive one shipment from each of ``sources`` at the same time (two ranks that send
    each other something both make progress: neither waits for its send before posting its receives)."""
    _, got = _sending(member, outgoing, lambda: receive(member, sources))
    return got


def _from_shared_memory(member: Member, name: str, sizes: Mapping[str, int],
                        fields: Sequence[tuple[str, torch.dtype]]) -> dict[str, torch.Tensor]:
    """Map a shared-memory file a peer wrote and view its fields in place; the name is removed at once (the
    mapping keeps the memory until the tensors are dropped). A file of another size than the header's fields
    is refused: mapping it would read past its end, or zero-fill it to the size asked for."""
    assert member.shm_dir is not None, "a peer sent a shared-memory shipment to a member without shared memory"
    if not _FILE.fullmatch(name):
        raise RuntimeError(f"dispatch: a peer named {name!r} as its shared-memory shipment, not a dispatch file")
    path = member.shm_dir / name
    try:
        expected = sum(_padded(sizes[field] * dtype.itemsize) for field, dtype in fields)
        found = path.stat().st_size
        if found != expected:
            raise RuntimeError(f"dispatch: shared-memory shipment {path} holds {found} bytes, its header "
                               f"describes {expected}")
        raw = torch.empty(0, dtype=torch.uint8)
        if expected:
            raw = torch.tensor([], dtype=torch.uint8).set_(torch.UntypedStorage.from_file(str(path), True, expected))
    finally:
        path.unlink(missing_ok=True)
    out, at = {}, 0
    for field, dtype in fields:
        size = sizes[field] * dtype.itemsize
        out[field] = raw[at: at + size].view(dtype)
        at += _padded(size)
    return out


def receive(member: Member, sources: Sequence[int]) -> list[Shipment]:
    """One shipment from each rank of ``sources`` (headers first, then every field of every sender at once), in
    the order of ``sources``."""
    group = member.group
    headers = [torch.empty(4, dtype=torch.int64) for _ in sources]
    for work in [group.recv([h], src, HEADER_TAG) for h, src in zip(headers, sources)]:
        work.wait()
    buffers: list[dict[str, torch.Tensor]] = []
    names: dict[int, tuple[torch.Tensor, dict[str, int], list[tuple[str, torch.dtype]]]] = {}
    works: list[dist.Work] = []
    named: list[dist.Work] = []
    try:
        for i, (header, src) in enumerate(zip(headers, sources)):
            samples, tokens, with_advantages, shared = (int(v) for v in header.tolist())
            sizes = {"ids": samples, "groups": samples, "rewards": samples, "offsets": samples + 1,
                     "token_ids": tokens, "action_mask": tokens, "advantages": samples}
            present = [(name, dtype) for name, dtype in FIELDS if name != "advantages" or with_advantages]
            if shared:
                message = torch.zeros(NAME_BYTES, dtype=torch.uint8)
                named.append(group.recv([message], src, NAME_TAG))
                names[i] = (message, sizes, present)
                buffers.append({})
                continue
            fields = {name: torch.empty(sizes[name], dtype=dtype) for name, dtype in present}
            for tag, tensor in enumerate(fields.values(), start=HEADER_TAG + 1):
                works.append(group.recv([tensor], src, tag))
            buffers.append(fields)
        # Names first: once each has arrived this rank owns its file, whatever happens to the other messages.
        for work in named + works:
            work.wait()
        for i, (message, sizes, present) in names.items():
            buffers[i] = _from_shared_memory(member, _decode(message), sizes, present)
    except BaseException:
        # Every file this rank is named is its own to remove: its sender's send completes (and so keeps the
        # file) once the name is here, so names still on their way are waited for (at most the group's timeout).
        for work in named:
            _delivered(work)
        for message, _, _ in names.values():
            if member.shm_dir is not None and _FILE.fullmatch(name := _decode(message)):
                (member.shm_dir / name).unlink(missing_ok=True)
        raise
    return [Shipment(**fields) for fields in buffers]


def receive_scheduled(member: Member, schedule: ReceiveSchedule, *, offset: int) -> list[Shipment]:
    """A destination rank's part of a plan (TransferPlan.receive_schedule): one shipment from each sender, then
    what TP peers on its node read through it passed on (as one shipment each) while the relayed ones come in.
    Source rank i is group rank i; destination rank r is group rank ``offset + r``."""
    direct = receive(member, schedule.senders)
    by_sender = dict(zip(schedule.senders, direct))
    outgoing = {offset + peer: Shipment.concat([by_sender[s] for s in senders])
                for peer, senders in schedule.forward.items()}
    return direct + exchange(member, outgoing, [offset + via for via in schedule.vias])
