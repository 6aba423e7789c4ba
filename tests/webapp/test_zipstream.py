"""Checkpoint downloads are streamed: the zip arrives in chunks, reads back byte for byte, and never whole in memory."""

from __future__ import annotations

import asyncio
import io
import os
import zipfile
from pathlib import Path

from webapp.runs.zipstream import CHUNK, zip_chunks, zip_chunks_async


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "iter_000003"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(5 * CHUNK + 123))  # incompressible: 5+ chunks
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "sub" / "empty.bin").write_bytes(b"")
    (folder / "link").symlink_to(folder / "config.json")
    return folder


def test_the_stream_is_a_valid_zip_of_the_folder_in_bounded_chunks(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    chunks = list(zip_chunks(folder))
    assert len(chunks) >= 5 and max(len(c) for c in chunks) < 2 * CHUNK  # streamed, never the whole archive
    archive = zipfile.ZipFile(io.BytesIO(b"".join(chunks)))
    assert archive.testzip() is None
    assert sorted(archive.namelist()) == ["iter_000003/config.json", "iter_000003/model.safetensors",
                                          "iter_000003/sub/empty.bin"]  # the link is left out
    assert archive.read("iter_000003/model.safetensors") == (folder / "model.safetensors").read_bytes()


def test_the_async_stream_gives_the_same_bytes(tmp_path: Path) -> None:
    folder = _folder(tmp_path)

    async def collect() -> bytes:
        return b"".join([c async for c in zip_chunks_async(folder)])

    got = zipfile.ZipFile(io.BytesIO(asyncio.run(collect())))
    assert got.read("iter_000003/config.json") == b'{"a": 1}'
