"""dispatch_bench: the Data Dispatcher's two modes on an emulated cluster whose per-node links are the bottleneck.

Runs as the driver inside node n0 of ../shared/tools/netemu.sh (network namespaces joined by a bridge, each node's
link shaped with tc; one Ray node per namespace, custom resource ``nodeK`` on node K). Worker nodes 1..W each host
one source and one destination worker (Ray actors pinned by that resource). Each source worker holds ``S`` MiB of
samples (ragged lengths, the Shipment format a run moves); for each pair of source/destination layouts and each
size, both modes move every sample to the destination ranks the plan (earl_core.dispatch.plan_transfers) names:

- layout_aware over the object store (``layout_aware:object_store``): each source puts one shipment per receiving
  rank in its own object store; the driver passes the references; receivers fetch straight from the source's node
  (a second rank of a TP group on the same node reads that node's copy);
- layout_aware over point-to-point messages (``layout_aware:collective``): sources and destinations form one gloo
  dispatch group (earl_core.dispatch.wire); each source sends its shipments, each destination takes them by its
  receive schedule (a rank relaying for a TP peer on its node passes its copy on); the driver sends only the plan;
- centralized: the driver fetches every source's samples, cuts one shipment per destination group and puts it in
  its own store; every receiving rank fetches its group's shipment from the driver's node.

Latency is from the first request to the last receiver holding its samples (each receiver checks it got exactly its
expected ids). Bytes through the driver's link are read from n0's interface counters. The lower bound is what the
plan's bytes need at the link rate: per node and direction bytes / rate, the largest; for centralized the gather and
the scatter run one after the other, so their driver-link times add.

    bash ../shared/tools/netemu.sh up 9 400mbit && bash ../shared/tools/netemu.sh ray-up .venv 1879048192
    (object stores: 9 of them must fit in RAM together; Ray keeps fetched copies until it needs the room)
    ip netns exec n0 .venv/bin/python bench/dispatch_bench.py [--sizes 46,93,187] [--pairs ...]
    bash ../shared/tools/netemu.sh down
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch

from bench_io import write_result
from earl_core.dispatch import wire
from earl_core.dispatch.plan import GroupLayout, ReceiveSchedule, Sample, TransferPlan, plan_transfers
from earl_core.dispatch.shipment import Shipment

MIB = 1 << 20
DEFAULT_PAIRS = "dp8.tp1>dp8.tp1,dp8.tp1>dp4.tp2,dp4.tp2>dp2.tp4,dp8.tp1>dp2.tp4"
DEFAULT_MODES = "layout_aware:collective,layout_aware:object_store,centralized"


def parse_layout(text: str, nodes: list[str]) -> GroupLayout:
    """``dp4.tp2`` over the worker nodes, rank r on worker node r (ranks of a TP group are neighbours)."""
    dp, tp = (int(part[2:]) for part in text.split("."))
    if dp * tp != len(nodes):
        raise SystemExit(f"layout {text} has {dp * tp} ranks; there are {len(nodes)} worker nodes")
    return GroupLayout(dp, tp, tuple(nodes))


def make_samples(group: int, payload_mib: float, per_worker: int, seed: int) -> Shipment:
    """About ``payload_mib`` MiB of ragged samples (lengths vary 4x), ids unique over groups; 5 bytes per token."""
    rng = random.Random(seed * 1000 + group)
    weights = [rng.uniform(1, 4) for _ in range(per_worker)]
    tokens = int(payload_mib * MIB / 5)
    lengths = [max(1, int(tokens * w / sum(weights))) for w in weights]
    offsets = torch.zeros(per_worker + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    gen = torch.Generator().manual_seed(seed * 1000 + group)
    n = int(offsets[-1])
    return Shipment(ids=torch.arange(per_worker, dtype=torch.int64) + group * per_worker,
                    groups=torch.arange(per_worker, dtype=torch.int64) // 2 + group * per_worker,
                    rewards=torch.ones(per_worker, dtype=torch.float64), offsets=offsets,
                    token_ids=torch.randint(0, 150_000, (n,), generator=gen, dtype=torch.int32),
                    action_mask=torch.randint(0, 2, (n,), generator=gen, dtype=torch.uint8))


@ray.remote(num_cpus=0)
class SourceWorker:
    """Holds one source rank's samples (replicas of a TP group hold the same ones)."""

    def load(self, group: int, payload_mib: float, per_worker: int, seed: int) -> list[tuple[int, int]]:
        self.samples = make_samples(group, payload_mib, per_worker, seed)
        lengths = (self.samples.offsets[1:] - self.samples.offsets[:-1]).tolist()
        return list(zip(self.samples.ids.tolist(), lengths))

    def ship(self, sends: dict[int, list[int]]) -> dict[int, list[ray.ObjectRef]]:
        return {dest: [ray.put(self.samples.subset(ids))] for dest, ids in sends.items()}

    def drop(self) -> None:
        self.samples = None

    def join(self, store: tuple[str, int], rank: int, world: int) -> None:
        self.group = wire.join(host=ray.util.get_node_ip_address(), store=store, rank=rank, world=world)

    def send(self, sends: dict[int, list[int]]) -> int:
        """Send this rank's shipments over the dispatch group (keys: dispatch-group ranks)."""
        return wire.send(self.group, {dest: self.samples.subset(ids) for dest, ids in sends.items()})


@ray.remote(num_cpus=0)
class DestinationWorker:
    """One destination rank: fetches its shipments and checks it got exactly its samples."""

    def receive(self, refs: list[ray.ObjectRef], expected: list[int]) -> int:
        parts = ray.get(refs)
        got = sorted(s for p in parts for s in p.ids.tolist())
        if got != sorted(expected):
            raise RuntimeError(f"rank got {len(got)} samples, expected {len(expected)}")
        return sum(p.nbytes for p in parts)

    def host_store(self, world: int) -> tuple[str, int]:
        ip = ray.util.get_node_ip_address()
        self.store, port = wire.host_store(ip, world)
        return ip, port

    def join(self, store: tuple[str, int], rank: int, world: int) -> None:
        self.group = wire.join(host=ray.util.get_node_ip_address(), store=store, rank=rank, world=world)

    def receive_messages(self, schedule: ReceiveSchedule, offset: int, expected: list[int]) -> int:
        """Take this rank's shipments over the dispatch group by its receive schedule and check the samples."""
        parts = wire.receive_scheduled(self.group, schedule, offset=offset)
        got = sorted(s for p in parts for s in p.ids.tolist())
        if got != sorted(expected):
            raise RuntimeError(f"rank got {len(got)} samples, expected {len(expected)}")
        return sum(p.nbytes for p in parts)


def driver_link_bytes() -> int:
    """Bytes in + out of this namespace's link (the driver runs in n0)."""
    total = 0
    for dev in Path("/sys/class/net").iterdir():
        if dev.name != "lo":
            total += int((dev / "statistics/rx_bytes").read_text()) + int((dev / "statistics/tx_bytes").read_text())
    return total


def settle(quiet_bytes: int = 64 << 10, window_s: float = 0.5, limit_s: float = 60.0) -> float:
    """Wait until the driver's link is idle (Ray may still push or free objects of the previous run), so a run's
    link bytes are its own; returns the seconds waited."""
    start = time.perf_counter()
    last = driver_link_bytes()
    while time.perf_counter() - start < limit_s:
        time.sleep(window_s)
        now = driver_link_bytes()
        if now - last < quiet_bytes:
            break
        last = now
    return time.perf_counter() - start


def layout_aware(plan: TransferPlan, sources: list[Any], dests: list[Any]) -> None:
    sent = ray.get([s.ship.remote(plan.sends(i)) for i, s in enumerate(sources)])
    refs: list[list[ray.ObjectRef]] = [[] for _ in dests]
    for t in plan.transfers:
        ref = sent[t.sender][t.via if t.route == "peer" else t.receiver][0]
        if ref not in refs[t.receiver]:
            refs[t.receiver].append(ref)
    ray.get([d.receive.remote(refs[r], plan.expected(r)) for r, d in enumerate(dests)])


def collective(plan: TransferPlan, sources: list[Any], dests: list[Any]) -> None:
    """Sources send, destinations receive, all at once; dispatch-group rank of destination r is sources + r."""
    offset = len(sources)
    sends = [plan.sends(i) for i in range(len(sources))]
    sending = [s.send.remote({offset + r: ids for r, ids in part.items()}) for s, part in zip(sources, sends) if part]
    receiving = [d.receive_messages.remote(plan.receive_schedule(r), offset, plan.expected(r))
                 for r, d in enumerate(dests)]
    ray.get(sending + receiving)


def centralized(plan: TransferPlan, sources: list[Any], dests: list[Any], held: list[list[int]]) -> int:
    """The single-controller pattern; returns the bytes the driver gathered."""
    # One replica of each source group answers (the others hold the same samples).
    firsts = [plan.source.group_ranks(g)[0] for g in range(plan.source.dp)]
    sent = ray.get([sources[r].ship.remote({-1: held[r]}) for r in firsts])
    gathered: list[Shipment] = ray.get([s[-1][0] for s in sent])
    whole = Shipment.concat(gathered)
    refs = [ray.put(whole.subset(ids)) for ids in plan.assignment]
    ray.get([d.receive.remote([refs[r // plan.destination.tp]], plan.expected(r)) for r, d in enumerate(dests)])
    return sum(g.nbytes for g in gathered)


def lower_bounds(plan: TransferPlan, bytes_per_token: float, rate_bytes: float, gathered: int) -> dict[str, float]:
    links = plan.link_tokens()
    aware = max((max(o, i) * bytes_per_token for o, i in links.values()), default=0.0) / rate_bytes
    # Centralized: everything in through the driver's link, then each rank's group data out (one copy per rank's node).
    scatter = sum(len(plan.destination.group_nodes(g)) * sum(plan.tokens[s] for s in ids)
                  for g, ids in enumerate(plan.assignment)) * bytes_per_token
    return {"layout_aware": aware, "centralized": (gathered + scatter) / rate_bytes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="10.77.0.10:6380")
    ap.add_argument("--workers", type=int, default=8, help="worker nodes (node1..nodeW)")
    ap.add_argument("--sizes", default="46,93,187", help="MiB per source worker")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="source>destination layouts, comma-separated")
    ap.add_argument("--samples", type=int, default=64, help="samples per source group")
    ap.add_argument("--mbit", type=float, default=400, help="the shaped link rate (for the lower bound)")
    ap.add_argument("--modes", default=DEFAULT_MODES,
                    help="layout_aware:collective, layout_aware:object_store, centralized (comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode and size (the median is reported)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "dispatch_bench.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # netemu's cluster runs without token auth
    ray.init(address=args.address, log_to_driver=False)
    nodes = [f"node{k}" for k in range(1, args.workers + 1)]
    pin = [{"resources": {n: 0.001}} for n in nodes]
    sources = [SourceWorker.options(**p).remote() for p in pin]
    dests = [DestinationWorker.options(**p).remote() for p in pin]
    # Start every actor (a process per actor) and connect the nodes before anything is timed.
    ray.get([d.receive.remote([], []) for d in dests] + [s.drop.remote() for s in sources])
    modes = args.modes.split(",")
    if "layout_aware:collective" in modes:  # one dispatch group: sources 0..W-1, destinations W..2W-1
        world = 2 * len(nodes)
        store = ray.get(dests[0].host_store.remote(world))
        ray.get([a.join.remote(store, rank, world) for rank, a in enumerate(sources + dests)])
    rate = args.mbit * 1e6 / 8
    rows: list[dict[str, Any]] = []
    for pair in args.pairs.split(","):
        src_text, dst_text = pair.split(">")
        src, dst = parse_layout(src_text, nodes), parse_layout(dst_text, nodes)
        for size in [float(s) for s in args.sizes.split(",")]:
            meta = ray.get([sources[r].load.remote(r // src.tp, size, args.samples, args.seed) for r in range(src.ranks)])
            samples = [Sample(sid, n, r // src.tp) for r in range(0, src.ranks, src.tp) for sid, n in meta[r]]
            held = [[sid for sid, _ in meta[r]] for r in range(src.ranks)]
            plan = plan_transfers(samples, src, dst)
            bytes_per_token = 5.0
            row: dict[str, Any] = {"pair": pair, "mib_per_worker": size,
                                   "network_mib": sum(o for o, _ in plan.link_tokens().values()) * 5 / MIB}
            gathered = 0
            for mode in modes:
                runs = []
                for _ in range(args.repeat):
                    settle()
                    before, start = driver_link_bytes(), time.perf_counter()
                    if mode == "layout_aware:object_store":
                        layout_aware(plan, sources, dests)
                    elif mode == "layout_aware:collective":
                        collective(plan, sources, dests)
                    else:
                        gathered = centralized(plan, sources, dests, held)
                    runs.append((time.perf_counter() - start, (driver_link_bytes() - before) / MIB))
                # The median run (the first can include one-time connection set-up between nodes).
                seconds, driver_mib = sorted(runs)[len(runs) // 2]
                row[mode] = {"seconds": seconds, "driver_link_mib": driver_mib, "runs_s": [r[0] for r in runs],
                             "runs_driver_link_mib": [r[1] for r in runs]}
            bounds = lower_bounds(plan, bytes_per_token, rate, gathered or int(size * MIB) * src.dp)
            for mode in modes:
                bound = bounds[mode.split(":")[0]]  # both layout-aware transports carry the same plan's bytes
                row[mode]["bound_s"] = bound
                row[mode]["vs_bound"] = row[mode]["seconds"] / bound if bound > 0 else None
                if mode != "centralized" and "centralized" in row:
                    row[mode]["speedup"] = row["centralized"]["seconds"] / row[mode]["seconds"]
            rows.append(row)
            for mode in modes:
                m = row[mode]
                print(f"{pair:<18} {size:5.0f} MiB  {mode:<26} {m['seconds']:7.2f}s  bound {m['bound_s']:6.2f}s "
                      f"({'  n/a' if m['vs_bound'] is None else format(m['vs_bound'], '5.2f')}x)  driver link {m['driver_link_mib']:8.1f} MiB"
                      + (f"  speedup {m['speedup']:5.1f}x" if "speedup" in m else ""), flush=True)
            ray.get([s.drop.remote() for s in sources])
    result = {"machine": {"cpus": 2, "platform": platform.platform(), "torch": torch.__version__},
              "args": vars(args), "rows": rows}
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
