"""Run-config presets for the new-run page, read from the YAML files in configs/ (the same files the CLI uses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

# Friendlier labels (and order) for the files we ship; any other configs/*.yaml is listed after them by file name.
KNOWN = {"tiny_test": "tiny smoke test", "demo": "demo"}


@dataclass(frozen=True)
class Preset:
    """One config file offered as a starting point."""

    key: str
    label: str
    description: str
    config: dict[str, Any]


def configs_dir() -> Path:
    return Path(settings.BASE_DIR) / "configs"


def _leading_comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def _service_view(config: dict[str, Any]) -> dict[str, Any]:
    # The service chooses where a run writes; offering output_dir would only earn a validation error.
    return {k: v for k, v in config.items() if k != "output_dir"}


def load_presets(folder: Path | None = None) -> list[Preset]:
    """Every readable YAML mapping in the folder; a broken file is skipped rather than breaking the page."""
    folder = folder or configs_dir()
    found: list[Preset] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            text = path.read_text()
            data = yaml.safe_load(text)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            found.append(Preset(key=path.stem, label=KNOWN.get(path.stem, path.stem.replace("_", " ")),
                                description=_leading_comment(text), config=_service_view(data)))
    order = list(KNOWN)
    return sorted(found, key=lambda p: (order.index(p.key) if p.key in order else len(order), p.key))
