"""Command line of the core: train, eval, play, init-model, config-doc (`python -m earl_core ...`)."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from earl_core.config import BOARD_FORMATS, BOARD_VIEWS, RunConfig, apply_overrides, load_config, opponent_list
from earl_core.errors import EarlError
from earl_core.events import EventSink


def _progress_sink(total: int, quiet: bool) -> EventSink:
    """Shows a progress bar with the key metrics; errors and logs go to stderr."""
    from tqdm import tqdm  # tqdm is only needed when someone watches a terminal

    bar = tqdm(total=total, unit="it", disable=quiet, dynamic_ncols=True)

    def show(envelope: dict[str, Any]) -> None:
        kind, data = envelope["type"], envelope["data"]
        if kind == "metrics" and "rollout/win_rate" in data["values"]:
            v = data["values"]
            bar.set_postfix(win=f"{v['rollout/win_rate']:.2f}", reward=f"{v['rollout/reward_mean']:+.2f}",
                            ctx=f"{v.get('context/mean', 0):.0f}", tok_s=f"{v['perf/rollout_tokens_per_s']:.0f}")
            bar.update(1)
        elif kind in ("log", "run.status"):
            bar.write(f"[{kind}] {data.get('status', data.get('level', ''))}: {data.get('message', '')}")
        elif kind == "error":
            bar.write(f"[error] {data['kind']}: {data['message']}")
        if kind == "run.status" and data["status"] in ("succeeded", "failed", "cancelled"):
            bar.close()

    return show


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set) if args.config else RunConfig.from_dict(apply_overrides({}, args.set))
    from earl_core.loop import train  # heavy (torch, ray, transformers): import only when training

    summary = train(cfg, _progress_sink(cfg.iterations, args.quiet), resume=args.resume)
    print(json.dumps({"status": summary.status, "run_dir": summary.run_dir, "checkpoint": summary.last_checkpoint,
                      "iterations": summary.iterations_done}))
    if cfg.eval_games and summary.last_checkpoint:
        from earl_core.evaluate import run_limits

        for opponent in opponent_list(cfg.game.opponent, "game.opponent"):
            print(f"evaluation against {opponent}:")
            _print_eval(summary.last_checkpoint, opponent, cfg.eval_games, cfg.rollout.engine, cfg.seed,
                        limits=run_limits(cfg))
    return 0


def _print_eval(checkpoint: str, opponent: str, games: int, engine: str, seed: int, *, limits: Any = None,
                temperature: float = 0.0) -> int:
    from earl_core.evaluate import evaluate_checkpoint

    results = evaluate_checkpoint(checkpoint, opponent=opponent, games=games, engine=engine, seed=seed, limits=limits,
                                  temperature=temperature)
    for side in results.values():
        d = side.as_dict()
        lo, hi = d["win_rate_ci95"]
        print(f"as {side.side:6s}: {side.wins}W {side.draws}D {side.losses}L of {side.games}  "
              f"win rate {side.win_rate:.3f} (95% CI {lo:.3f}-{hi:.3f}), invalid answers {side.invalid_answers}")
        if side.losses:
            print("          losses: " + ", ".join(f"{n} {cause}" for cause, n in side.loss_causes.items()))
    print(json.dumps({k: v.as_dict() for k, v in results.items()}))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from earl_core.evaluate import checkpoint_limits

    limits = checkpoint_limits(args.checkpoint, board_format=args.board_format, board_view=args.board_view)
    return _print_eval(args.checkpoint, args.opponent, args.games, args.engine, args.seed, limits=limits,
                       temperature=args.temperature)


def cmd_init_model(args: argparse.Namespace) -> int:
    from earl_core.agent.teacher import protocol_corpus
    from earl_core.models import create_model

    corpus = protocol_corpus(400, seed=args.seed, board_format=args.board_format)
    out = create_model(args.preset, Path(args.out), corpus=corpus, seed=args.seed)
    print(out)
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from earl_core.evaluate import checkpoint_limits
    from earl_core.play import play_in_terminal

    limits = checkpoint_limits(args.checkpoint, board_format=args.board_format, board_view=args.board_view)
    return play_in_terminal(args.checkpoint, human_side=args.side, engine=args.engine,
                            seed=args.seed or random.randrange(1 << 30), limits=limits)


def cmd_config_doc(args: argparse.Namespace) -> int:
    from earl_core.config_doc import config_reference

    print(config_reference())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m earl_core", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a policy (progress bar, metrics.jsonl, HF checkpoints)")
    t.add_argument("--config", help="YAML config file (see `config-doc`); omitted = all defaults")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. rollout.groups=4")
    t.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("eval", help="win/draw/loss of a checkpoint against an opponent, as first and second player")
    e.add_argument("--checkpoint", required=True, help="HF model folder (a checkpoint) or hub id")
    e.add_argument("--opponent", default="random", help="random | heuristic | solver | solver:D")
    e.add_argument("--games", type=int, default=100, help="games per side")
    e.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); 0.01..2 samples, as in "
                   "training: against a nearly deterministic opponent greedy play repeats the same few games")
    e.add_argument("--board-format", choices=BOARD_FORMATS, help="board text in the prompts (default: the one the "
                   "checkpoint was trained with, rows for a model without earl_state.json)")
    e.add_argument("--board-view", choices=BOARD_VIEWS, help="whose stones are X: absolute (the first player's) or "
                   "relative (the agent's) (default: the checkpoint's, absolute for a model without earl_state.json)")
    e.set_defaults(func=cmd_eval)
    pl = sub.add_parser("play", help="play against a checkpoint in the terminal")
    pl.add_argument("--checkpoint", required=True)
    pl.add_argument("--side", type=int, choices=[1, 2], default=1, help="1 = you move first")
    pl.add_argument("--engine", default="hf", choices=["vllm", "hf"])
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--board-format", choices=BOARD_FORMATS, help="board text in the prompts (default: the checkpoint's)")
    pl.add_argument("--board-view", choices=BOARD_VIEWS, help="whose stones are X in the agent's prompts: absolute or "
                    "relative (default: the checkpoint's)")
    pl.set_defaults(func=cmd_play)
    m = sub.add_parser("init-model", help="build a fresh model of a preset (random weights) + tokenizer in Hugging Face format")
    m.add_argument("--preset", default="tiny")
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--board-format", choices=BOARD_FORMATS, default="rows",
                   help="board text the tokenizer is trained on (use the game.board_format the model will play with)")
    m.set_defaults(func=cmd_init_model)
    d = sub.add_parser("config-doc", help="print the config reference (every field, default and meaning)")
    d.set_defaults(func=cmd_config_doc)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except EarlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
