"""Worker tests use the web side's fixtures: the test Redis, the runs folder, people and their API clients."""

from tests.webapp.conftest import alice, ants, as_alice, redis_url, runs_dir  # noqa: F401 (fixtures)
