"""Connect to an existing Ray cluster (RAY_ADDRESS) or start a private local one on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

# Local clusters are private to this machine: no token auth, and never Redis' port 6379.
_LOCAL_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@contextmanager
def ray_cluster(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[str]:
    """Yield a description of the cluster in use; shut down only what this call started.

    `address` (or RAY_ADDRESS) joins an existing cluster. Otherwise a local instance is started on
    127.0.0.1 with at least `num_cpus` logical CPUs, so a small machine can still place every worker.
    """
    for key, value in _LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        yield "existing ray session"
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=True)
        where = f"ray cluster at {address}"
    else:
        cpus = max(os.cpu_count() or 1, num_cpus or 0)
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
            runtime_env={"env_vars": dict(_LOCAL_ENV)},
        )
        where = f"local ray ({cpus} CPUs)"
    try:
        yield where
    finally:
        ray.shutdown()
