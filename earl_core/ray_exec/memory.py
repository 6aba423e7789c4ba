"""Memory readings of a worker process (device memory on GPU, resident set on CPU)."""

from __future__ import annotations

import resource
import sys

import psutil
import torch


def memory_reading(worker: str, stage: str, budget: int | None = None) -> dict[str, int | str | None]:
    """Current and peak bytes of this process for the `memory` event."""
    if torch.cuda.is_available():
        used = int(torch.cuda.memory_allocated())
        peak = int(torch.cuda.max_memory_allocated())
    else:
        used = int(psutil.Process().memory_info().rss)
        # ru_maxrss is KiB on Linux, bytes on macOS.
        scale = 1 if sys.platform == "darwin" else 1024
        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale
    return {"worker": worker, "stage": stage, "used": used, "peak": max(peak, used), "budget": budget}
