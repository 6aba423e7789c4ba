"""No secret in the repository: every tracked file is scanned for credentials that must come from the environment."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PATTERNS = {
    "private key": re.compile(r"-----BEGIN (?:RSA |EC |OPENSSH |DSA )?PRIVATE KEY-----"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}"),
    # A Django secret written as a literal: only the settings' labelled development default may exist.
    "SECRET_KEY literal": re.compile(r"""SECRET_KEY\s*[=:]\s*["'](?!insecure-dev-only-)[^"'$<{]{20,}["']"""),
    # Placeholders a user must replace ("change-me...", "password") and ${VARIABLES} are not secrets.
    "password in a URL": re.compile(r"\b(?:postgres|postgresql|redis|amqp)://[^:/\s@]+:(?!\$\{|change-me|password@)"
                                    r"[^@\s/]{6,}@"),
}


def test_no_tracked_file_holds_a_credential() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if name == "tests/core/test_no_secrets.py" or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        found += [f"{name}: {what}" for what, pattern in PATTERNS.items() if pattern.search(text)]
    assert found == []
