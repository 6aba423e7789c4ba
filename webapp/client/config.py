"""Where the CLI keeps the service URL and its API token: a 0600 JSON file; EARL_URL / EARL_TOKEN override it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from webapp.client.errors import ClientError

DEFAULT_URL = "http://localhost:8000"
ENV_CONFIG = "EARL_CONFIG"
ENV_URL = "EARL_URL"
ENV_TOKEN = "EARL_TOKEN"


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str | None  # None: not logged in


def config_path() -> Path:
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "earl" / "config.json"


def _read(path: Path) -> dict[str, str]:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot read {path} ({exc}): fix or delete it, then run `earl login`") from exc
    if not isinstance(raw, dict):
        raise ClientError(f"{path} is not a JSON object: delete it, then run `earl login`")
    return {k: v for k, v in raw.items() if isinstance(v, str)}


def load() -> Credentials:
    """The stored credentials, each overridden by its environment variable (CI jobs set those)."""
    stored = _read(config_path())
    url = os.environ.get(ENV_URL) or stored.get("url") or DEFAULT_URL
    token = os.environ.get(ENV_TOKEN) or stored.get("token") or None
    return Credentials(url=url.rstrip("/"), token=token)


def save(creds: Credentials) -> Path:
    """Write the file readable by its owner only, replacing it atomically (no window with a wider mode)."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {"url": creds.url, **({"token": creds.token} if creds.token else {})}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)  # O_CREAT's mode does not apply to a leftover tmp file
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def forget_token() -> Path | None:
    """Drop the stored token but keep the URL, so the next `earl login` needs no --url."""
    path = config_path()
    stored = _read(path)
    if "token" not in stored:
        return None
    save(Credentials(url=stored.get("url", DEFAULT_URL), token=None))
    return path
