"""`earl`: submit, list, watch and cancel EARL service runs from a terminal or a CI job."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from webapp.client import commands
from webapp.client.config import DEFAULT_URL, ENV_CONFIG, ENV_TOKEN, ENV_URL
from webapp.client.errors import ClientError

PRIORITIES = ["low", "normal", "high", "urgent"]
STATUSES = "queued, starting, running, cancelling, cancelled, succeeded, failed"

EPILOG = f"""environment:
  {ENV_URL}     service URL (overrides the stored one; default {DEFAULT_URL})
  {ENV_TOKEN}   API token (overrides the stored one; for CI jobs)
  {ENV_CONFIG}  credentials file (default ~/.config/earl/config.json)

exit status: 0 ok, 1 failed (or a watched run did not succeed), 2 invalid input, 130 interrupted"""


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _command(parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="earl", description=__doc__, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(sub.add_parser("login", help="exchange a password for an API token and store it"), commands.login)
    p.add_argument("--url", help=f"service URL (default: {ENV_URL}, the stored one, or {DEFAULT_URL})")
    p.add_argument("--username", help="asked for when missing")
    p.add_argument("--password", help="asked for (without echo) when missing")

    _command(sub.add_parser("logout", help="revoke the stored token and forget it"), commands.logout)

    p = _command(sub.add_parser("submit", help="submit a run; prints its id"), commands.submit)
    p.add_argument("config", type=Path, help="run config, YAML or JSON")
    p.add_argument("--team", required=True, help="team id or slug")
    p.add_argument("--name", help="run name (default: the config's name)")
    p.add_argument("--priority", choices=PRIORITIES, help="default normal; urgent is for team admins")
    p.add_argument("--watch", action="store_true",
                   help="follow it with a progress bar; exit 0 if it succeeds, 1 if it fails or is cancelled")

    runs = sub.add_parser("runs", help="list, inspect, cancel or clone runs").add_subparsers(
        dest="runs_command", required=True, metavar="COMMAND")

    p = _command(runs.add_parser("list", help="runs of your teams, newest first"), commands.runs_list)
    p.add_argument("--team", help="team id or slug")
    p.add_argument("--status", help=f"comma-separated: {STATUSES}")
    p.add_argument("--search", help="text in the run's name or owner")
    p.add_argument("--limit", type=count, default=50, help="at most this many runs (0: all; default 50)")
    p.add_argument("--json", action="store_true", help="print the runs as a JSON list")

    p = _command(runs.add_parser("show", help="one run's details"), commands.runs_show)
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true", help="print the run as JSON")

    p = _command(runs.add_parser("cancel", help="cancel a queued or running run"), commands.runs_cancel)
    p.add_argument("id", type=int)

    p = _command(runs.add_parser("clone", help="submit a copy of a run; prints the new id"), commands.runs_clone)
    p.add_argument("id", type=int)
    p.add_argument("--name", help="default: '<name> (clone)'")

    p = _command(runs.add_parser("events", help="a run's events, one per line"), commands.runs_events)
    p.add_argument("id", type=int)
    p.add_argument("--after", type=count, default=0, help="only events with a higher seq")
    p.add_argument("--type", help="comma-separated event types (run.status, metrics, log, error, game.end, ...)")
    p.add_argument("--follow", action="store_true", help="keep streaming until the run finishes")
    p.add_argument("--json", action="store_true", help="print the raw event envelopes as JSON lines")

    p = _command(runs.add_parser("metrics", help="a run's metrics per iteration"), commands.runs_metrics)
    p.add_argument("id", type=int)
    form = p.add_mutually_exclusive_group()
    form.add_argument("--csv", action="store_true", help="print CSV (iteration, then one column per metric)")
    form.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ClientError as exc:
        for line in exc.lines():
            print(f"earl: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("earl: interrupted", file=sys.stderr)
        return commands.EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader (`| head`) went away: not an error; keep Python from complaining at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
