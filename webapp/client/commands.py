"""What each `earl` subcommand does, given its parsed arguments; each returns the process's exit status."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from webapp.client import config
from webapp.client.api import EarlApi
from webapp.client.errors import ClientError, NotLoggedIn
from webapp.client.follow import RunFollower
from webapp.client.render import event_line, metrics_table, run_details, runs_table
from webapp.client.watch import watch_run

EXIT_INTERRUPTED = 130


def _api() -> EarlApi:
    creds = config.load()
    if not creds.token:
        raise NotLoggedIn()
    return EarlApi(creds.url, creds.token)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _stopped_watching(run_id: int) -> int:
    _err(f"earl: stopped watching; run {run_id} keeps going (cancel it with `earl runs cancel {run_id}`)")
    return EXIT_INTERRUPTED


def _ask(prompt: str) -> str:
    try:
        return input(prompt).strip()
    except EOFError:
        raise ClientError(f"no terminal to ask for {prompt.strip(': ')}: pass it as an option") from None


# ---- accounts ----------------------------------------------------------------------------------------

def login(args: argparse.Namespace) -> int:
    url = (args.url or config.load().url).rstrip("/")
    username = args.username or _ask("username: ")
    try:
        password = args.password if args.password is not None else getpass.getpass("password: ")
    except EOFError:
        raise ClientError("no terminal to ask for the password: pass --password") from None
    token = EarlApi(url, None).login(username, password, label=f"cli@{socket.gethostname()}"[:100])
    path = config.save(config.Credentials(url=url, token=token))
    _err(f"logged in to {url} as {username} (token stored in {path})")
    return 0


def logout(args: argparse.Namespace) -> int:
    creds = config.load()
    if creds.token:
        try:
            EarlApi(creds.url, creds.token).logout()
        except NotLoggedIn:
            pass  # already revoked on the server: forgetting it is all that is left
    path = config.forget_token()
    _err(f"logged out of {creds.url}" + (f" (token removed from {path})" if path else ""))
    if config.ENV_TOKEN in os.environ:
        _err(f"note: {config.ENV_TOKEN} is still set in your environment")
    return 0


# ---- runs --------------------------------------------------------------------------------------------

def _read_config(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        # JSON is read by its own parser for exact error positions; anything else as YAML
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ClientError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{' '.join(str(exc).split())}") from exc


def submit(args: argparse.Namespace) -> int:
    api = _api()
    run = api.submit(team=args.team, config=_read_config(args.config), name=args.name, priority=args.priority)
    print(run["id"], flush=True)
    _err(f"submitted run {run['id']} {run['name']!r} to {run.get('team_name') or run['team']} ({run['status']})")
    if not args.watch:
        return 0
    try:
        status = watch_run(api, run)
    except KeyboardInterrupt:
        return _stopped_watching(run["id"])
    _err(f"run {run['id']} {status}")
    return 0 if status == "succeeded" else 1


def runs_list(args: argparse.Namespace) -> int:
    rows, count = _api().runs(team=args.team, status=args.status, search=args.search, limit=args.limit)
    if args.json:
        _print_json(rows)
    elif rows:
        print(runs_table(rows))
    else:
        _err("no runs")
    if len(rows) < count and not args.json:
        _err(f"showing {len(rows)} of {count} runs (--limit 0 shows all)")
    return 0


def runs_show(args: argparse.Namespace) -> int:
    run = _api().run(args.id)
    if args.json:
        _print_json(run)
    else:
        print(run_details(run))
    return 0


def runs_cancel(args: argparse.Namespace) -> int:
    run = _api().cancel(args.id)
    if run["status"] == "cancelled":
        print(f"run {run['id']} cancelled")
    else:
        print(f"run {run['id']} {run['status']}: the worker stops it at its next safe point")
    return 0


def runs_clone(args: argparse.Namespace) -> int:
    run = _api().clone(args.id, name=args.name)
    print(run["id"])
    _err(f"cloned run {args.id} as run {run['id']} {run['name']!r} ({run['status']})")
    return 0


def runs_events(args: argparse.Namespace) -> int:
    api = _api()
    wanted = {t.strip() for t in args.type.split(",") if t.strip()} if args.type else None

    def show(envelope: dict[str, Any]) -> None:
        if wanted is None or envelope["type"] in wanted:
            print(json.dumps(envelope) if args.json else event_line(envelope), flush=True)

    if not args.follow:
        for envelope in api.all_events(args.id, after=args.after, types=args.type):
            show(envelope)
        return 0
    if args.type:
        api.events(args.id, after=args.after, types=args.type, limit=1)  # the server checks the type names
    # The follower sees every type: seq checking needs them all; the filter applies to what is printed.
    follower = RunFollower(api, args.id, after=args.after, on_notice=lambda line: _err(f"earl: {line}"))
    try:
        for envelope in follower:
            show(envelope)
    except KeyboardInterrupt:
        return _stopped_watching(args.id)
    return 0


def runs_metrics(args: argparse.Namespace) -> int:
    api = _api()
    if args.csv:
        sys.stdout.write(api.metrics_csv(args.id))
        return 0
    rows = api.metrics(args.id)
    if args.json:
        _print_json(rows)
    elif rows:
        print(metrics_table(rows))
    else:
        _err(f"run {args.id} has no metrics yet")
    return 0
