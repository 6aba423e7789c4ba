"""imitation_probe: how much of the heuristic a fresh model learns from the warm start, by kind of turn.

learn_bench asks whether a run reaches its win rates; this probe asks why it does or does not. A fresh model of a
given shape (built locally from a preset-like config) is trained with the run's own warm-start step
(`Learner.sft_step`: cross-entropy on the agent's tokens of whole heuristic games) for a fixed number of minutes,
and every minute its greedy column at each agent turn of 300 held-out heuristic games is checked against the
heuristic, split by what the turn asked for:

- `win`    a column wins at once (any winning column counts);  `vwin`: one of them completes a vertical four;
- `block`  the opponent threatens to win there (any such column); `vblock`: vertically;
- `avoid`  some column would hand the opponent a win on top (the teacher's column must match);
- `centre` none of these: the most central column (ties are broken at random by the teacher, so < 100% is the cap).

Options: `--tactic-weight W` weights the loss of win/block answers by W (the turns where the tactics are);
`--puzzles N` adds N one-turn conversations (system prompt + one position from the training games, 70% of them
win/block positions); `--puzzle-only` trains on those alone. For reference it scores a player that always names
the most central legal column the same way. Writes JSON with the accuracy curve.

    .venv/bin/python bench/imitation_probe.py     # --minutes 5 --games 3000 --batch 32 --lr 0.003
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from bench_io import write_result
from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder, answer_spans
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import answer_ids, protocol_corpus, teacher_policy
from earl_core.config import BOARD_FORMATS, BOARD_VIEWS, CHECK_FORMATS, AlgoConfig
from earl_core.env.connect_four import Board
from earl_core.env.opponents import make_opponent, opponent_wins_at
from earl_core.models import create_model
from earl_core.models import factory
from earl_core.rl.learner import Learner

ROOT = Path(__file__).resolve().parent
TACTICS = ("win", "vwin", "block", "vblock")


def vertical_four(board: Board, column: int, player: int) -> bool:
    """Whether `player` dropping into `column` completes a vertical four."""
    height = sum(1 for row in range(6) if board.cell(row, column) != 0)
    return 3 <= height < 6 and all(board.cell(height - k, column) == player for k in (1, 2, 3))


def turn_kind(board: Board) -> tuple[str, list[int] | None]:
    """What the heuristic's rules make of a position: the kind of turn and the columns that answer it (None: the
    teacher's own column is the answer)."""
    columns = board.legal_columns()
    me = board.to_move
    wins = [c for c in columns if board.can_win_with(c)]
    if wins:
        return ("vwin" if any(vertical_four(board, c, me) for c in wins) else "win"), wins
    threats = [c for c in columns if opponent_wins_at(board, c)]
    if threats:
        return ("vblock" if any(vertical_four(board, c, 3 - me) for c in threats) else "block"), threats
    if any(board.drop(c).can_win_with(c) for c in columns):
        return "avoid", None
    return "centre", None


def teacher_games(encoder: ChatEncoder, games: int, seed: int, weight: float, board_format: str,
                  board_view: str) -> list[dict[str, Any]]:
    """Heuristic games against random and heuristic opponents (as the warm start plays them), each agent turn
    labelled with its kind; win/block answers weigh `weight` in the loss (the action mask carries the weight)."""
    teacher = make_opponent("heuristic")
    opponents = ("random", "heuristic")
    specs = [GameSpec(index=i, group=i, agent_side=1 + i % 2, opponent=make_opponent(opponents[(i // 2) % 2]),
                      seed=seed + i) for i in range(games)]
    episodes = play_episodes(specs, teacher_policy(teacher, encoder, seed=seed), encoder,
                             limits=RunnerLimits(max_context=4096, board_format=board_format, board_view=board_view))
    out = []
    for ep in episodes:
        r = ep.record()
        board, turns = Board(), []
        for ch in r["board_moves"]:
            column = int(ch) - 1
            if board.to_move == r["agent_side"]:
                turns.append((board, *turn_kind(board), column))
            board = board.drop(column)
        spans = answer_spans(r["action_mask"])
        assert len(spans) == len(turns), "one answer per agent turn (the teacher never errs)"
        mask = [float(m) for m in r["action_mask"]]
        for (start, end), (_, kind, _, _) in zip(spans, turns):
            if kind in TACTICS:
                mask[start:end] = [weight] * (end - start)
        out.append({"token_ids": r["token_ids"], "action_mask": mask, "spans": spans, "side": r["agent_side"],
                    "turns": [(kind, good, column) for _, kind, good, column in turns],
                    "positions": turns})
    return out


def puzzles(encoder: ChatEncoder, games: list[dict[str, Any]], n: int, seed: int, weight: float,
            board_format: str, board_view: str) -> list[dict[str, Any]]:
    """One-turn conversations from the games' positions, 70% of them win/block turns."""
    rng = random.Random(seed)
    pool = [(g["side"], p) for g in games for p in g["positions"]]
    tactical = [x for x in pool if x[1][1] in TACTICS]
    other = [x for x in pool if x[1][1] not in TACTICS]
    out = []
    for _ in range(n):
        side, (board, kind, good, column) = rng.choice(tactical) if rng.random() < 0.7 else rng.choice(other)
        # The opponent's last move is not kept with the position; a first-turn prompt shows the board alone.
        ids = (encoder.message("system", protocol.system_prompt(side, board_format, board_view)) +
               encoder.message("user", protocol.turn_prompt(board, None, board_format, board_view)) +
               encoder.generation_prompt())
        answer = answer_ids(encoder, column)
        w = weight if kind in TACTICS else 1.0
        out.append({"token_ids": ids + answer, "action_mask": [0.0] * len(ids) + [w] * len(answer),
                    "spans": [(len(ids), len(ids) + len(answer))], "turns": [(kind, good, column)]})
    return out


def column_offset(tok: Any) -> tuple[int, dict[int, int]]:
    """Where in the answer `[col N]` the column's token sits, and token id -> column."""
    ids = {c: tok.encode(protocol.answer_text(c), add_special_tokens=False) for c in range(7)}
    width = min(len(v) for v in ids.values())
    at = next(k for k in range(width) if len({v[k] for v in ids.values()}) == 7)
    return at, {ids[c][at]: c for c in range(7)}


@torch.no_grad()
def accuracy(model: torch.nn.Module, held: list[dict[str, Any]], offset: int, columns: dict[int, int]) -> dict[str, float]:
    """Share of agent turns, per kind, where the model's likeliest column answers the turn; and of the win and
    block turns (all four kinds) by the side the agent plays (`tactics@first`, `tactics@second`)."""
    model.eval()
    right, total = Counter(), Counter()
    candidates = torch.tensor(sorted(columns))
    for k in range(0, len(held), 16):
        chunk = held[k : k + 16]
        width = max(len(r["token_ids"]) for r in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, r in enumerate(chunk):
            ids[i, : len(r["token_ids"])] = torch.tensor(r["token_ids"])
        logits = model(input_ids=ids).logits
        for i, r in enumerate(chunk):
            for (start, _), (kind, good, column) in zip(r["spans"], r["turns"]):
                scores = logits[i, start + offset - 1, candidates]
                guess = columns[int(candidates[int(scores.argmax())])]
                hit = guess in good if good else guess == column
                right[kind] += hit
                total[kind] += 1
                if kind in TACTICS:
                    side = "tactics@first" if r["side"] == 1 else "tactics@second"
                    right[side] += hit
                    total[side] += 1
    model.train()
    return {kind: round(right[kind] / total[kind], 3) for kind in sorted(total)}


def centre_only(held: list[dict[str, Any]]) -> dict[str, float]:
    """The same check for a player that always names the most central legal column: what preferring the centre
    alone scores on each kind of turn (the level a model sits at when it has learned nothing else)."""
    right, total = Counter(), Counter()
    for g in held:
        for board, kind, good, column in g["positions"]:
            guess = min(board.legal_columns(), key=lambda c: abs(3 - c))
            right[kind] += guess in good if good else guess == column
            total[kind] += 1
    return {kind: round(right[kind] / total[kind], 3) for kind in sorted(total)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(factory.MODEL_PRESETS))
    p.add_argument("--layers", type=int, help="override the preset's decoder layers")
    p.add_argument("--hidden", type=int, help="override the preset's width")
    p.add_argument("--heads", type=int, help="override the preset's attention heads")
    p.add_argument("--intermediate", type=int, help="override the preset's MLP width")
    p.add_argument("--minutes", type=float, default=5.0, help="training time (the warm start's share of a 20-minute run)")
    p.add_argument("--games", type=int, default=3000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tactic-weight", type=float, default=1.0)
    p.add_argument("--puzzles", type=int, default=0)
    p.add_argument("--puzzle-only", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    # Not the check formats: their answers open with a check, and the probe reads the column at the answer's first
    # tokens.
    p.add_argument("--board", choices=[f for f in BOARD_FORMATS if f not in CHECK_FORMATS], default="rows",
                   help="the board text in the prompts (game.board_format): rows, cells (one word per cell), "
                   "cells_landing (cells, each legal column with the cell it fills) or cells_stack (cells_landing, "
                   "each landing cell with the like stones under it)")
    p.add_argument("--view", choices=BOARD_VIEWS, default="absolute",
                   help="game.board_view: absolute (X moves first) or relative (the agent's stones are always X)")
    p.add_argument("--out", default=str(ROOT / "results" / "imitation_probe.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in {"num_hidden_layers": args.layers, "hidden_size": args.hidden,
                                   "num_attention_heads": args.heads, "intermediate_size": args.intermediate}.items()
                 if v is not None}
    factory.MODEL_PRESETS["probe"] = dataclasses.replace(factory.MODEL_PRESETS[args.preset], **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = protocol_corpus(400, seed=args.seed, board_format=args.board, board_view=args.view)
        model_dir = create_model("probe", Path(tmp) / "model", corpus=corpus, seed=args.seed)
        learner = Learner(model_dir, algo=AlgoConfig(lr=args.lr, micro_batch=args.micro_batch), seed=args.seed)
        encoder = ChatEncoder(learner.tokenizer)
        params = sum(q.numel() for q in learner.model.parameters())
        started = time.perf_counter()
        train = teacher_games(encoder, args.games, 1000, args.tactic_weight, args.board, args.view)
        held = teacher_games(encoder, 300, 10_000_000, 1.0, args.board, args.view)
        kinds = Counter(kind for g in train for kind, _, _ in g["turns"])
        if args.puzzles:
            extra = puzzles(encoder, train, args.puzzles, args.seed + 1, args.tactic_weight, args.board, args.view)
            train = extra if args.puzzle_only else train + extra
        print(f"{params:,} parameters; {len(train)} training conversations, mean "
              f"{sum(len(r['token_ids']) for r in train) / len(train):.0f} tokens; turns {dict(kinds)} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
        centre = centre_only(held)
        print(f"centre-only player: {centre}", flush=True)
        offset, columns = column_offset(learner.tokenizer)
        curve: list[dict[str, Any]] = [{"minute": 0.0, "steps": 0, "accuracy": accuracy(learner.model, held, offset, columns)}]
        rng = random.Random(args.seed)
        steps, start, paused = 0, time.perf_counter(), 0.0  # paused: seconds spent checking, not training
        deadline, next_check = start + args.minutes * 60, start + 60
        while time.perf_counter() < deadline:
            order = list(range(len(train)))
            rng.shuffle(order)
            for k in range(0, len(order), args.batch):
                if time.perf_counter() >= deadline:
                    break
                learner.sft_step([train[i] for i in order[k : k + args.batch]], lr=args.lr)
                steps += 1
                if time.perf_counter() >= next_check:
                    checking = time.perf_counter()
                    training_s = checking - start - paused
                    acc = accuracy(learner.model, held, offset, columns)
                    curve.append({"minute": round(training_s / 60, 2), "steps": steps, "accuracy": acc})
                    print(f"{training_s / 60:5.1f} min  {steps:4d} steps  {acc}", flush=True)
                    # Checking is not training: the deadline and the next check move by the time it took.
                    spent = time.perf_counter() - checking
                    paused += spent
                    deadline += spent
                    next_check = time.perf_counter() + 60
        final = accuracy(learner.model, held, offset, columns)
        print(f"final after {steps} steps: {final}")
    result = {"bench": "imitation_probe", "args": vars(args), "parameters": params, "turn_kinds": dict(kinds),
              "steps": steps, "curve": curve, "final": final, "centre_only": centre,
              "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__}}
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
