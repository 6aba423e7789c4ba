"""Layering: the core library loads without Django, Celery or Channels."""

from __future__ import annotations

import subprocess
import sys


def test_core_imports_no_web_stack() -> None:
    code = (
        "import sys, earl_core, earl_core.loop, earl_core.cli, earl_core.evaluate, earl_core.env, earl_core.agent; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'celery', 'channels', 'rest_framework', "
        "'webapp', 'workers'}); print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
