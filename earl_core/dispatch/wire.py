"""Shipments over torch.distributed point-to-point messages (gloo): the Data Dispatcher's collective transport.

A dispatch group is a gloo process group of its own that spans the rollout engines and the trainer ranks (it does
not touch the trainer's default process group): source rank ``i`` is engine ``i``, destination rank ``r`` is
``engines + r``. Its rendezvous store is hosted by one member, so the driver never carries bulk bytes nor the
store's traffic. Each shipment goes as one header message then one message per field, each on its own tag, so a
receiver sizes its buffers before the bulk arrives and messages from several senders never mix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from earl_core.dispatch.plan import ReceiveSchedule
from earl_core.dispatch.shipment import Shipment

HEADER_TAG = 1
FIELDS: tuple[tuple[str, torch.dtype], ...] = (
    ("ids", torch.int64), ("groups", torch.int64), ("rewards", torch.float64), ("offsets", torch.int64),
    ("token_ids", torch.int32), ("action_mask", torch.uint8), ("advantages", torch.float32))
"""Fields in the order they travel, with their dtypes (the receiver allocates from the header's sizes)."""


def host_store(host: str, world: int, *, timeout_s: float = 300.0) -> tuple[dist.TCPStore, int]:
    """Start the group's rendezvous store on ``host`` (a free port); keep the returned store alive while the group
    lives."""
    store = dist.TCPStore(host, 0, world, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    return store, int(store.port)


def join(*, host: str, store: tuple[str, int] | dist.Store, rank: int, world: int,
         timeout_s: float = 300.0) -> dist.ProcessGroupGloo:
    """Join the dispatch group as ``rank`` of ``world``; traffic leaves from ``host`` (this node's address, so the
    group works inside network namespaces where the hostname does not resolve to an interface of the node)."""
    if not isinstance(store, dist.Store):
        store = dist.TCPStore(store[0], store[1], world, False, timedelta(seconds=timeout_s))
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(dist.PrefixStore("dispatch", store), rank, world, options)


def _tensors(shipment: Shipment) -> list[torch.Tensor]:
    out = []
    for name, dtype in FIELDS:
        t = getattr(shipment, name)
        if t is not None:
            assert t.dtype == dtype, f"{name} is {t.dtype}, the wire format says {dtype}"
            out.append(t.contiguous())
    return out


def _post(group: dist.ProcessGroupGloo, shipments: Mapping[int, Shipment]) -> tuple[list[dist.Work], int]:
    works, sent = [], 0
    for rank, shipment in shipments.items():
        header = torch.tensor([len(shipment), shipment.token_ids.numel(), int(shipment.advantages is not None)],
                              dtype=torch.int64)
        works.append(group.send([header], rank, HEADER_TAG))
        for tag, tensor in enumerate(_tensors(shipment), start=HEADER_TAG + 1):
            works.append(group.send([tensor], rank, tag))
            sent += tensor.numel() * tensor.element_size()
    return works, sent


def send(group: dist.ProcessGroupGloo, shipments: Mapping[int, Shipment]) -> int:
    """Send one shipment to each destination rank of ``shipments`` (all at once); returns the bytes sent."""
    works, sent = _post(group, shipments)
    for work in works:
        work.wait()
    return sent


def exchange(group: dist.ProcessGroupGloo, outgoing: Mapping[int, Shipment], sources: Sequence[int]) -> list[Shipment]:
    """Send ``outgoing`` and receive one shipment from each of ``sources`` at the same time (two ranks that send
    each other something both make progress: neither waits for its send before posting its receives)."""
    works, _ = _post(group, outgoing)
    got = receive(group, sources)
    for work in works:
        work.wait()
    return got


def receive(group: dist.ProcessGroupGloo, sources: Sequence[int]) -> list[Shipment]:
    """One shipment from each rank of ``sources`` (headers first, then every field of every sender at once), in
    the order of ``sources``."""
    headers = [torch.empty(3, dtype=torch.int64) for _ in sources]
    for work in [group.recv([h], src, HEADER_TAG) for h, src in zip(headers, sources)]:
        work.wait()
    buffers: list[dict[str, torch.Tensor]] = []
    works = []
    for header, src in zip(headers, sources):
        samples, tokens, with_advantages = (int(v) for v in header.tolist())
        sizes = {"ids": samples, "groups": samples, "rewards": samples, "offsets": samples + 1,
                 "token_ids": tokens, "action_mask": tokens, "advantages": samples}
        fields = {name: torch.empty(sizes[name], dtype=dtype) for name, dtype in FIELDS
                  if name != "advantages" or with_advantages}
        for tag, tensor in enumerate(fields.values(), start=HEADER_TAG + 1):
            works.append(group.recv([tensor], src, tag))
        buffers.append(fields)
    for work in works:
        work.wait()
    return [Shipment(**fields) for fields in buffers]


def receive_scheduled(group: dist.ProcessGroupGloo, schedule: ReceiveSchedule, *, offset: int) -> list[Shipment]:
    """A destination rank's part of a plan (TransferPlan.receive_schedule): one shipment from each sender, then
    what TP peers on its node read through it passed on (as one shipment each) while the relayed ones come in.
    Source rank i is group rank i; destination rank r is group rank ``offset + r``."""
    direct = receive(group, schedule.senders)
    by_sender = dict(zip(schedule.senders, direct))
    outgoing = {offset + peer: Shipment.concat([by_sender[s] for s in senders])
                for peer, senders in schedule.forward.items()}
    return direct + exchange(group, outgoing, [offset + via for via in schedule.vias])
