"""What every benchmark does with its result: write it as JSON next to the others and say where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result(result: dict[str, Any], out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return path
