"""The start of one rank process of the multi-process checks (tp_ranks, fsdp_ranks): its arguments, as
`run_ranks` passes them, and its place in a gloo group over loopback."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def join_gloo_group() -> tuple[argparse.Namespace, DeviceMesh]:
    """Parse --rank/--world/--port/--model/--out, join the gloo group on 127.0.0.1 and return the 1-D mesh of all
    ranks. One compute thread per rank: the checks start two (or four) ranks on a 2-core machine."""
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(minutes=5))
    return args, init_device_mesh("cpu", (args.world,))
