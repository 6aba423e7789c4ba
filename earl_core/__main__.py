"""Entry point of `python -m earl_core`."""

from __future__ import annotations

import sys

from earl_core.cli import main

if __name__ == "__main__":
    sys.exit(main())
