#!/bin/sh
# Starts one role of the EARL service in this container; usage: earl-entrypoint ROLE [extra arguments for it].
# Roles: web, worker, scheduler, migrate, manage, ray-head, ray-worker; anything else runs as a plain command.
# Every role ends in `exec`, so the service process receives the container's signals directly.
set -eu

role="${1:-web}"
if [ "$#" -gt 0 ]; then shift; fi

is_on() {  # the true spellings of webapp.env.env_bool
    case "$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')" in 1|true|yes|on) return 0 ;; *) return 1 ;; esac
}

# Ray 2.60 turns token auth on by default, and every process of one cluster (head, nodes, the Celery workers that
# drive it) must agree. Default here: off, for a cluster on a private network (the compose file publishes no Ray
# port; the web's dashboard reader sends no token). RAY_AUTH_MODE=token needs one shared RAY_AUTH_TOKEN everywhere:
# a head left to itself would invent its own token and no other container could join.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
if [ -z "${RAY_AUTH_TOKEN:-}" ]; then unset RAY_AUTH_TOKEN; fi
export RAY_USAGE_STATS_ENABLED=0

need_ray_token() {
    if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
        echo "earl-entrypoint: RAY_AUTH_MODE=token needs RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)," \
            "the same on every node" >&2
        exit 2
    fi
}

case "$role" in
    web)
        if [ "${1:-}" = "--migrate" ]; then
            shift
            python manage.py migrate --noinput
        fi
        # Behind the TLS proxy the client's address comes from X-Forwarded-For (the login throttle counts by it).
        if is_on "${EARL_BEHIND_PROXY:-1}"; then set -- --proxy-headers "$@"; fi
        exec daphne -b 0.0.0.0 -p "${EARL_PORT:-8000}" "$@" webapp.asgi:application
        ;;
    worker)
        need_ray_token
        if [ -n "${RAY_ADDRESS:-}" ]; then
            # A Ray driver must run on a node of its cluster (ray.init looks for a raylet on this host), so the
            # container joins as a node that offers no CPUs or GPUs: nothing of a run is placed here.
            ray start --address="$RAY_ADDRESS" --num-cpus=0 --num-gpus=0 --disable-usage-stats
        fi
        # The flags of webapp.stack.Stack.start_celery_worker: each run in a fresh child process.
        exec celery -A workers.celery_app worker -l "${LOG_LEVEL:-INFO}" -n "${EARL_WORKER_NAME:-worker}@%h" \
            -P prefork -c "${EARL_WORKER_CONCURRENCY:-1}" --max-tasks-per-child=1 --without-gossip --without-mingle "$@"
        ;;
    scheduler)
        exec python manage.py schedule --every "${EARL_SCHEDULE_EVERY_S:-15}" "$@"
        ;;
    migrate)
        exec python manage.py migrate --noinput "$@"
        ;;
    manage)
        exec python manage.py "$@"
        ;;
    ray-head)
        need_ray_token
        # Port 6380: Ray's default 6379 is Redis'. --block keeps Ray in the foreground as the container's process.
        exec ray start --head --block --port="${RAY_PORT:-6380}" --include-dashboard=true --dashboard-host=0.0.0.0 \
            --dashboard-port="${RAY_DASHBOARD_PORT:-8265}" --disable-usage-stats "$@"
        ;;
    ray-worker)
        need_ray_token
        exec ray start --address="${RAY_ADDRESS:?ray-worker needs RAY_ADDRESS, the head as host:port}" --block \
            --disable-usage-stats "$@"
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
