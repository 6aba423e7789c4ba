"""A run's ``resources`` JSON as a gang of bundles: the shapes accepted, their checks, the default from the config."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from earl_core.config import RunConfig
from earl_core.errors import ConfigError
from webapp.scheduling.resources import GIB, Resources, SchedulingError

BUNDLE_KEYS = ("cpus", "gpus", "memory_gib")
"""Keys of one bundle; cpus defaults to 1 (like a Ray actor), gpus and memory_gib to 0."""
MAX_BUNDLES = 2048
"""At most rollout.workers (256) + trainer_workers (1024) bundles are ever needed; more is a typo."""
_LIMITS: Mapping[str, tuple[float, str]] = {
    "cpus": (100_000, "a number from 0 to 100000"),
    "gpus": (1024, "a whole number from 0 to 1024"),
    "memory_gib": (1_048_576, "a number of GiB from 0 to 1048576"),
}
SHAPES = ('{} (default: one 1-CPU bundle per rollout worker and one trainer_cpus bundle per trainer worker), '
          '{"cpus", "gpus", "memory_gib"} (one bundle), or {"bundles": [{"cpus", "gpus", "memory_gib"}, ...]}')


def resources_errors(value: Any) -> list[SchedulingError]:
    """Every bad part of a ``resources`` value (fields named ``resources...``); empty when it is one of ``SHAPES``."""
    return _read(value)[1]


def requested_gang(value: Mapping[str, Any], config: RunConfig) -> tuple[Resources, ...]:
    """The bundles a valid ``resources`` value asks for; ``{}`` means the default derived from ``config``.

    The default counts CPUs only: whether a worker gets a GPU is decided by the worker at run time from what the
    cluster has, so a GPU run must state its bundles to be held to a GPU quota.
    """
    bundles, errors = _read(value)
    assert not errors, "requested_gang takes a value resources_errors accepted"
    if bundles is not None:
        return bundles
    rollout = [Resources(cpus=1, gpus=0)] * config.rollout.workers
    trainer = [Resources(cpus=config.trainer_cpus, gpus=0)] * config.trainer_workers
    return (*rollout, *trainer)


def sizing_config(config: Any) -> RunConfig:
    """The config the default gang is derived from; the core's defaults for a config that does not build.

    The API never stores such a config, but a direct call may (a worker then fails the run with the config's own
    error, which is more use to its owner than a refusal here).
    """
    try:
        return RunConfig.from_dict(config)
    except (ConfigError, TypeError, AttributeError):
        return RunConfig()


def is_single_bundle(value: Mapping[str, Any]) -> bool:
    """Whether ``value`` is the flat one-bundle shape (its fields are then ``resources.gpus``, not ``bundles[0]``)."""
    return bool(value) and "bundles" not in value


def _read(value: Any) -> tuple[tuple[Resources, ...] | None, list[SchedulingError]]:
    """(bundles, errors); bundles is None for the default (``{}`` or null) and when there are errors."""
    if value is None or value == {}:
        return None, []
    if not isinstance(value, dict):
        return None, [SchedulingError("resources", f"must be a JSON object, got {type(value).__name__}",
                                      allowed=SHAPES)]
    if "bundles" not in value:
        bundle, errors = _bundle(value, "resources")
        return (None if errors else (bundle,)), errors
    errors = [SchedulingError(f"resources.{key}", "is not allowed next to bundles", allowed="only bundles")
              for key in value if key != "bundles"]
    raw = value["bundles"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BUNDLES:
        got = f"{len(raw)} bundles" if isinstance(raw, list) else type(raw).__name__
        allowed = f"1-{MAX_BUNDLES} objects with {', '.join(BUNDLE_KEYS)}"
        return None, [*errors, SchedulingError("resources.bundles", f"must be a list of 1-{MAX_BUNDLES} bundles, "
                                               f"got {got}", allowed=allowed)]
    bundles = []
    for i, one in enumerate(raw):
        bundle, bad = _bundle(one, f"resources.bundles[{i}]")
        bundles.append(bundle)
        errors += bad
    return (None if errors else tuple(bundles)), errors


def _bundle(raw: Any, where: str) -> tuple[Resources, list[SchedulingError]]:
    """One bundle from ``{"cpus", "gpus", "memory_gib"}``; errors name ``where.key``."""
    if not isinstance(raw, dict):
        return Resources.nothing(), [SchedulingError(where, f"must be an object, got {type(raw).__name__}",
                                                     allowed=f"an object with {', '.join(BUNDLE_KEYS)}")]
    errors = [SchedulingError(f"{where}.{key}"[:120], "unknown key", allowed=", ".join(BUNDLE_KEYS))
              for key in raw if key not in BUNDLE_KEYS]
    amounts = {"cpus": raw.get("cpus", 1), "gpus": raw.get("gpus", 0), "memory_gib": raw.get("memory_gib", 0)}
    for key, number in amounts.items():
        top, allowed = _LIMITS[key]
        whole = key == "gpus"
        kind_ok = isinstance(number, int) if whole else isinstance(number, (int, float))
        if isinstance(number, bool) or not kind_ok or not 0 <= number <= top or not math.isfinite(number):
            errors.append(SchedulingError(f"{where}.{key}", f"got {str(number)[:40]!r}", allowed=allowed))
    if errors:
        return Resources.nothing(), errors
    if not any(amounts.values()):
        # Ray refuses an empty placement-group bundle, and a worker that holds nothing is not scheduled at all.
        return Resources.nothing(), [SchedulingError(where, "asks for nothing",
                                                     allowed="at least one of cpus, gpus, memory_gib above 0")]
    return Resources(cpus=amounts["cpus"], gpus=amounts["gpus"],
                     memory_bytes=round(amounts["memory_gib"] * GIB)), []
