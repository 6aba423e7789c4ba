"""Memory readings of a worker process (device memory on GPU, resident set on CPU)."""

from __future__ import annotations

import resource
import sys

import psutil
import torch


def memory_reading(worker: str, stage: str, budget: int | None = None, *,
                   children: bool = False) -> dict[str, int | str | None]:
    """Current and peak bytes of this process for the `memory` event; with ``children`` on CPU, the processes it
    started count too (a tensor-parallel vLLM engine runs its ranks there)."""
    if torch.cuda.is_available():
        used = int(torch.cuda.memory_allocated())
        peak = int(torch.cuda.max_memory_allocated())
    else:
        me = psutil.Process()
        used = int(me.memory_info().rss)
        # ru_maxrss is KiB on Linux, bytes on macOS.
        scale = 1 if sys.platform == "darwin" else 1024
        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale
        if children:
            for child in me.children(recursive=True):
                try:
                    used += int(child.memory_info().rss)
                except psutil.Error:  # a child may exit while we look
                    continue
    return {"worker": worker, "stage": stage, "used": used, "peak": max(peak, used), "budget": budget}
