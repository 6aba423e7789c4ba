"""Which checkpoint folders of a run are complete (light: the web side reads them without loading the trainer)."""

from __future__ import annotations

import os
from pathlib import Path

# Written last by the trainer's save, inside the temporary folder that is then renamed into place.
STATE_FILE = "earl_state.json"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(iteration, folder) of every complete checkpoint, by iteration; half-written ones end in .tmp and are skipped."""
    found = [(int(p.name[5:]), p) for p in (run_dir / "checkpoints").glob("iter_*")
             if p.name[5:].isdigit() and (p / STATE_FILE).exists()]
    return sorted(found)


def fsync_tree(folder: Path) -> None:
    """Flush every file of a finished folder, and the folder, to disk before it is renamed into place: the rename
    then never points at data still in the page cache (a power loss after it would leave files cut short)."""
    for path in sorted(folder.rglob("*"), reverse=True):  # files before the folders that hold them
        _fsync(path)
    _fsync(folder)


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable."""
    _fsync(folder)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
