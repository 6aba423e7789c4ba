"""check_probe: where a `cells_checks` agent goes wrong -- in its check of the board, or in reading its move off it.

With `game.board_format: cells_checks` (or `cells_stack_checks`) every answer opens with a check: the landing cell
of each legal column, marked win / block / gift (`earl_core.agent.protocol.check_text`). This plays a checkpoint
greedily against an opponent (the checkpoint's own protocol limits, vLLM), keeps every answer with the board it
answered, and compares the check the model wrote with the true one (`protocol.read_check` against
`protocol.check_mark`):

- `check_exact`: the share of answers whose check is the true one, word for word in its marks;
- per kind (`win`: a column wins now; `block`: none wins, and the opponent wins in some column):
  `turns` of that kind, `marked` (the model's check gives a true column that mark: recall), `played` (its
  column is one of the true ones), and over the answers whose own check gives some column that mark (for block:
  and none win): `own_marks`, `own_true` (every column it marked so is one: precision), `follows` (it played a column
  it marked so).

`follows` near 1 with `marked` low says the move is read off the check well and the check itself is what fails.

    .venv/bin/python bench/check_probe.py RUN_DIR/checkpoints/iter_000000 [more checkpoints] --games 300
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from bench_io import write_result
from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import engine_policy
from earl_core.config import CHECK_FORMATS
from earl_core.engines.base import Generation, SamplingSpec, make_engine
from earl_core.env.connect_four import Board
from earl_core.evaluate import checkpoint_limits, evaluate_policy

ROOT = Path(__file__).resolve().parent


def score_answers(answers: list[tuple[Board, str]]) -> dict[str, Any]:
    """The model's checks against the true ones, and its columns against its own checks (see the module doc)."""
    c: Counter[str] = Counter()
    for board, text in answers:
        truth = {col: protocol.check_mark(board, col) for col in board.legal_columns()}
        own = protocol.read_check(text)
        column = protocol.parse_answer(text, board).column
        c["answers"] += 1
        c["check_exact"] += own == truth
        kind = "win" if "win" in truth.values() else "block" if "block" in truth.values() else None
        if kind:
            right = {col for col, m in truth.items() if m == kind}
            c[f"{kind}_turns"] += 1
            c[f"{kind}_marked"] += any(own.get(col) == kind for col in right)
            c[f"{kind}_played"] += column in right
        for mark in ("win", "block"):
            mine = {col for col, m in own.items() if m == mark}
            if mine and (mark == "win" or "win" not in own.values()):
                c[f"{mark}_own_marks"] += 1
                c[f"{mark}_own_true"] += all(truth.get(col) == mark for col in mine)
                c[f"{mark}_follows"] += column in mine
    n = max(c["answers"], 1)
    out: dict[str, Any] = {"answers": c["answers"], "check_exact": round(c["check_exact"] / n, 3)}
    for kind in ("win", "block"):
        turns, own = c[f"{kind}_turns"], c[f"{kind}_own_marks"]
        out[kind] = {"turns": turns, "marked": round(c[f"{kind}_marked"] / max(turns, 1), 3),
                     "played": round(c[f"{kind}_played"] / max(turns, 1), 3), "own_marks": own,
                     "own_true": round(c[f"{kind}_own_true"] / max(own, 1), 3),
                     "follows": round(c[f"{kind}_follows"] / max(own, 1), 3)}
    return out


def probe(checkpoint: str, *, opponent: str, games: int, seed: int) -> dict[str, Any]:
    """Play `games` games per side greedily and score every answer (retries included)."""
    limits = checkpoint_limits(checkpoint)
    if limits.board_format not in CHECK_FORMATS:
        raise SystemExit(f"{checkpoint}: game.board_format is {limits.board_format!r}; this probe reads the check "
                         f"of {' / '.join(CHECK_FORMATS)} answers")
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(checkpoint))
    engine = make_engine("vllm", checkpoint)
    answers: list[tuple[Board, str]] = []
    try:
        inner = engine_policy(engine, SamplingSpec(max_new_tokens=limits.max_new_tokens, temperature=0.0,
                                                   stop_token_ids=(encoder.im_end,)))

        def policy(episodes: list[Episode]) -> list[Generation]:
            generations = inner(episodes)
            for ep, gen in zip(episodes, generations):
                answers.append((ep.board, encoder.tokenizer.decode(gen.token_ids).replace("<|im_end|>", "")))
            return generations

        started = time.perf_counter()
        results = evaluate_policy(policy, encoder, opponent=opponent, games=games, seed=seed, limits=limits)
    finally:
        engine.close()
    return {"checkpoint": checkpoint, "games": {k: v.as_dict() for k, v in results.items()},
            "seconds": round(time.perf_counter() - started, 1), **score_answers(answers)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", help="checkpoint folders of a cells_checks run")
    p.add_argument("--opponent", default="random")
    p.add_argument("--games", type=int, default=300, help="games per side")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=str(ROOT / "results" / "check_probe.json"))
    args = p.parse_args(argv)
    rows = [probe(c, opponent=args.opponent, games=args.games, seed=args.seed) for c in args.checkpoints]
    print(f"{'checkpoint':<40} {'wins 1st/2nd':>12} {'exact':>6}  win: marked played own_true follows"
          "  block: marked played own_true follows")
    for r in rows:
        w, b = r["win"], r["block"]
        wins = f"{r['games']['first']['win_rate']:.3f}/{r['games']['second']['win_rate']:.3f}"
        print(f"{Path(r['checkpoint']).name:<40} {wins:>12} {r['check_exact']:>6.3f}  "
              f"{w['marked']:>11.3f} {w['played']:>6.3f} {w['own_true']:>8.3f} {w['follows']:>7.3f}"
              f"  {b['marked']:>13.3f} {b['played']:>6.3f} {b['own_true']:>8.3f} {b['follows']:>7.3f}")
    write_result({"bench": "check_probe", "args": vars(args), "rows": rows,
                  "machine": {"platform": platform.platform()}}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
