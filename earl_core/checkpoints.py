"""Which checkpoint folders of a run are complete (light: the web side reads them without loading the trainer)."""

from __future__ import annotations

from pathlib import Path

# Written last by the trainer's save, inside the temporary folder that is then renamed into place.
STATE_FILE = "earl_state.json"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(iteration, folder) of every complete checkpoint, by iteration; half-written ones end in .tmp and are skipped."""
    found = [(int(p.name[5:]), p) for p in (run_dir / "checkpoints").glob("iter_*")
             if p.name[5:].isdigit() and (p / STATE_FILE).exists()]
    return sorted(found)
