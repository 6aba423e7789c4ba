"""Measured peak memory of a piece of work in this process: device memory on GPU, sampled resident set on CPU."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from types import TracebackType

import psutil
import torch


class PeakMemory:
    """``with PeakMemory() as peak: ...`` then ``peak.bytes``: the highest memory the block reached.

    On GPU this is ``torch.cuda.max_memory_allocated`` reset at entry. On CPU no allocator keeps a peak that can
    be reset, so a thread samples the process's resident set every ``interval`` seconds (a block shorter
    than that is still measured at entry and exit). Resident memory includes the interpreter and libraries; the
    memory model's calibration carries that as its fixed overhead. At entry, memory freed by earlier work is
    handed back to the OS first (glibc keeps freed heap pages resident), so a block is not charged for the
    high-water mark of whatever ran before it.
    """

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.bytes = 0
        self._cuda = torch.cuda.is_available()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    def _rss(self) -> int:
        return int(self._proc.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.bytes = max(self.bytes, self._rss())

    def __enter__(self) -> PeakMemory:
        if self._cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.bytes = int(torch.cuda.memory_allocated())
        else:
            _release_free_heap()
            self.bytes = self._rss()
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._cuda:
            torch.cuda.synchronize()
            self.bytes = max(self.bytes, int(torch.cuda.max_memory_allocated()))
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bytes = max(self.bytes, self._rss())


_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if ctypes.util.find_library("c") else None


def _release_free_heap() -> None:
    """glibc's malloc_trim(0): return free heap memory to the OS (a no-op elsewhere)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
