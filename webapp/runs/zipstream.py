"""A folder as a zip archive streamed chunk by chunk: a checkpoint of many GiB is never held in memory or on disk."""

from __future__ import annotations

import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from asgiref.sync import sync_to_async

CHUNK = 1 << 20


class _Sink:
    """A write-only, unseekable stream that hands back what was written since the last take()."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._written = 0

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:  # zipfile records offsets; it never seeks on a stream it was told is unseekable
        return self._written

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


def zip_chunks(folder: Path) -> Iterator[bytes]:
    """The folder's regular files (links left out) under `<folder name>/`, deflated, about CHUNK bytes at a time."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as archive:  # type: ignore[arg-type]
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            info = zipfile.ZipInfo.from_file(path, f"{folder.name}/{path.relative_to(folder)}")
            info.compress_type = zipfile.ZIP_DEFLATED
            with path.open("rb") as src, archive.open(info, "w") as dest:
                while block := src.read(CHUNK):
                    dest.write(block)
                    if data := sink.take():
                        yield data
    if data := sink.take():  # the central directory
        yield data


async def zip_chunks_async(folder: Path) -> AsyncIterator[bytes]:
    """The same chunks for an ASGI response (Django would read a sync iterator whole into memory first); each
    chunk is made in a worker thread so the event loop keeps serving others."""
    chunks = zip_chunks(folder)
    step = sync_to_async(next, thread_sensitive=False)
    while (data := await step(chunks, None)) is not None:
        yield data
