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
memory is missing or full, the shipment goes over the socket as before.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from earl_core.dispatch.plan import ReceiveSchedule
from earl_core.dispatch.shipment import Shipment

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
         timeout_s: float = 300.0, shared_memory: bool = True) -> Member:
    """Join the dispatch group as ``rank`` of ``world``; traffic leaves from ``host`` (this node's address, so the
    group works inside network namespaces where the hostname does not resolve to an interface of the node).
    Members learn each other's address (one all-gather), and use shared memory between members with the same
    one, unless ``shared_memory`` is off or this machine has no ``/dev/shm``."""
    if not isinstance(store, dist.Store):
        store = dist.TCPStore(store[0], store[1], world, False, timedelta(seconds=timeout_s))
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    group = dist.ProcessGroupGloo(dist.PrefixStore("dispatch", store), rank, world, options)
    usable = shared_memory and SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)
    if usable:
        _sweep(SHM_DIR)
    # Each member's address, and in the last byte whether it takes shared memory: only a pair of members with
    # the same address that both do use it.
    mine = torch.zeros(NAME_BYTES, dtype=torch.uint8)
    encoded = host.encode()[: NAME_BYTES - 1]
    mine[: len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    mine[-1] = int(usable)
    everyone = [torch.empty(NAME_BYTES, dtype=torch.uint8) for _ in range(world)]
    group.allgather([everyone], [mine]).wait()
    same = frozenset(r for r, other in enumerate(everyone) if r != rank and usable and torch.equal(other, mine))
    return Member(group=group, rank=rank, same_node=same, shm_dir=SHM_DIR if usable else None)


def _tensors(shipment: Shipment) -> list[torch.Tensor]:
    out = []
    for name, dtype in FIELDS:
        t = getattr(shipment, name)
        if t is not None:
            assert t.dtype == dtype, f"{name} is {t.dtype}, the wire format says {dtype}"
            out.append(t.contiguous())
    return out


def _sweep(directory: Path) -> None:
    """Remove shared-memory files whose sender process is gone: a receiver that failed before taking its
    shipment leaves the file behind, and nothing else would free that memory."""
    for path in directory.glob("earl-dispatch-*-*"):
        try:
            pid = int(path.name.split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                path.unlink(missing_ok=True)
            except PermissionError:  # another user's file (/dev/shm is sticky): not ours to remove
                continue
        except (ValueError, PermissionError):
            continue


def _to_shared_memory(member: Member, tensors: list[torch.Tensor]) -> str | None:
    """Write the fields into a new shared-memory file; its name, or None when there is no room (then the
    shipment goes over the socket). Written with write(), not through a mapping: a full /dev/shm is then an
    error here rather than a crash on a page fault."""
    if member.shm_dir is None:
        return None
    name = f"earl-dispatch-{os.getpid()}-{uuid.uuid4().hex}"
    path = member.shm_dir / name
    try:
        with open(path, "wb") as f:
            for t in tensors:
                f.write(t.numpy().data)
                pad = -(t.numel() * t.element_size()) % _ALIGN
                if pad:
                    f.write(bytes(pad))
    except OSError:
        path.unlink(missing_ok=True)
        return None
    return name


def _post(member: Member, shipments: Mapping[int, Shipment]) -> tuple[list[dist.Work], int]:
    works, sent = [], 0
    for rank, shipment in shipments.items():
        tensors = _tensors(shipment)
        name = _to_shared_memory(member, tensors) if rank in member.same_node else None
        header = torch.tensor([len(shipment), shipment.token_ids.numel(), int(shipment.advantages is not None),
                               int(name is not None)], dtype=torch.int64)
        works.append(member.group.send([header], rank, HEADER_TAG))
        if name is not None:
            message = torch.zeros(NAME_BYTES, dtype=torch.uint8)
            message[: len(name)] = torch.frombuffer(bytearray(name.encode()), dtype=torch.uint8)
            works.append(member.group.send([message], rank, NAME_TAG))
        else:
            for tag, tensor in enumerate(tensors, start=HEADER_TAG + 1):
                works.append(member.group.send([tensor], rank, tag))
        sent += sum(t.numel() * t.element_size() for t in tensors)
    return works, sent


def send(member: Member, shipments: Mapping[int, Shipment]) -> int:
    """Send one shipment to each destination rank of ``shipments`` (all at once); returns the bytes sent."""
    works, sent = _post(member, shipments)
    for work in works:
        work.wait()
    return sent


def exchange(member: Member, outgoing: Mapping[int, Shipment], sources: Sequence[int]) -> list[Shipment]:
    """Send ``outgoing`` and receive one shipment from each of ``sources`` at the same time (two ranks that send
    each other something both make progress: neither waits for its send before posting its receives)."""
    works, _ = _post(member, outgoing)
    got = receive(member, sources)
    for work in works:
        work.wait()
    return got


def _from_shared_memory(member: Member, name: str, sizes: Mapping[str, int],
                        fields: Sequence[tuple[str, torch.dtype]]) -> dict[str, torch.Tensor]:
    """Map a shared-memory file a peer wrote and view its fields in place; the name is removed at once (the
    mapping keeps the memory until the tensors are dropped)."""
    assert member.shm_dir is not None, "a peer sent a shared-memory shipment to a member without shared memory"
    path = member.shm_dir / name
    nbytes = path.stat().st_size
    raw = torch.empty(0, dtype=torch.uint8)
    if nbytes:
        raw = torch.tensor([], dtype=torch.uint8).set_(torch.UntypedStorage.from_file(str(path), True, nbytes))
    path.unlink()
    out, at = {}, 0
    for field, dtype in fields:
        size = sizes[field] * dtype.itemsize
        out[field] = raw[at: at + size].view(dtype)
        at += size + (-size % _ALIGN)
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
    works = []
    for i, (header, src) in enumerate(zip(headers, sources)):
        samples, tokens, with_advantages, shared = (int(v) for v in header.tolist())
        sizes = {"ids": samples, "groups": samples, "rewards": samples, "offsets": samples + 1,
                 "token_ids": tokens, "action_mask": tokens, "advantages": samples}
        present = [(name, dtype) for name, dtype in FIELDS if name != "advantages" or with_advantages]
        if shared:
            message = torch.empty(NAME_BYTES, dtype=torch.uint8)
            works.append(group.recv([message], src, NAME_TAG))
            names[i] = (message, sizes, present)
            buffers.append({})
            continue
        fields = {name: torch.empty(sizes[name], dtype=dtype) for name, dtype in present}
        for tag, tensor in enumerate(fields.values(), start=HEADER_TAG + 1):
            works.append(group.recv([tensor], src, tag))
        buffers.append(fields)
    for work in works:
        work.wait()
    for i, (message, sizes, present) in names.items():
        name = bytes(message.tolist()).rstrip(b"\0").decode()
        buffers[i] = _from_shared_memory(member, name, sizes, present)
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
