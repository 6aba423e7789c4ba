"""Connect Four env throughput: our Board and BoardBatch against PettingZoo's connect_four_v3, random legal moves."""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from earl_core.env.batch import BoardBatch
from earl_core.env.connect_four import Board
from earl_core.env.solver import solve

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "env_bench.json"


@dataclass
class Measurement:
    """One contender's run: ``moves`` counts single-env steps that placed one stone."""

    name: str
    moves: int
    games: int
    seconds: float

    @property
    def moves_per_s(self) -> float:
        return self.moves / self.seconds


def bench_board(seconds: float, seed: int) -> Measurement:
    """One immutable Board at a time, a new game when one ends."""
    rng = random.Random(seed)
    moves = games = 0
    board = Board()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(256):  # check the clock every 256 moves, not every move
            board = board.drop(rng.choice(board.legal_columns()))
            moves += 1
            if board.is_terminal():
                board = Board()
                games += 1
        if time.perf_counter() >= deadline:
            break
    return Measurement("earl Board (1 game)", moves, games, time.perf_counter() - start)


def bench_batch(seconds: float, seed: int, *, size: int) -> Measurement:
    """``size`` games stepped together; finished games restart at once so every step moves in every game."""
    rng = np.random.default_rng(seed)
    batch = BoardBatch(size)
    moves = games = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        legal = batch.legal_mask()  # (N, 7)
        # A random legal column per game: the largest of uniform draws over the legal ones.
        columns = np.argmax(rng.random(legal.shape) * legal, axis=1)
        result = batch.step(columns)
        assert not result.illegal.any()
        moves += size
        finished = np.flatnonzero(result.done)
        games += finished.size
        batch.reset(finished)
    return Measurement(f"earl BoardBatch (N={size})", moves, games, time.perf_counter() - start)


def bench_pettingzoo(seconds: float, seed: int, *, raw: bool) -> Measurement:
    """PettingZoo AEC loop; only steps that place a stone are counted (the dead-agent steps are skipped)."""
    from pettingzoo.classic import connect_four_v3  # optional dependency: only this contender needs it

    env = connect_four_v3.raw_env() if raw else connect_four_v3.env()
    rng = random.Random(seed)
    env.reset(seed=seed)
    moves = games = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(256):
            observation, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.reset()
                games += 1
                continue
            env.step(int(rng.choice(np.flatnonzero(observation["action_mask"]))))
            moves += 1
        if time.perf_counter() >= deadline:
            break
    label = "PettingZoo connect_four_v3.raw_env" if raw else "PettingZoo connect_four_v3.env"
    return Measurement(label, moves, games, time.perf_counter() - start)


def quiet_position(rng: random.Random, *, empty: int) -> Board:
    """A running game with ``empty`` empty cells, reached by moves that neither win nor hand the opponent a win.

    Plain random play mostly reaches lopsided positions; avoiding immediate tactics keeps them tense, which is
    where the solver works hardest.
    """
    while True:
        board = Board()
        while board.moves_played < 42 - empty and not board.is_terminal():
            columns = board.legal_columns()
            quiet = [c for c in columns if not board.can_win_with(c) and not _gives_a_win(board.drop(c))]
            board = board.drop(rng.choice(quiet or columns))
        if not board.is_terminal():
            return board


def _gives_a_win(board: Board) -> bool:
    return any(board.can_win_with(c) for c in board.legal_columns())


def bench_solver(positions: int, seed: int, *, empty: int) -> dict[str, float | int | str]:
    """Time ``solve`` (fresh transposition table each call) on quiet positions with ``empty`` empty cells."""
    rng = random.Random(seed)
    times = []
    worst_moves = ""
    for _ in range(positions):
        board = quiet_position(rng, empty=empty)
        start = time.perf_counter()
        solve(board)
        times.append(time.perf_counter() - start)
        if times[-1] == max(times):
            worst_moves = board.moves
    return {
        "empty_cells": empty,
        "positions": positions,
        "mean_s": sum(times) / len(times),
        "worst_s": max(times),
        "worst_position": worst_moves,
    }


def merge(parts: list[Measurement]) -> Measurement:
    """Sum one contender's rounds."""
    return Measurement(
        parts[0].name,
        sum(p.moves for p in parts),
        sum(p.games for p in parts),
        sum(p.seconds for p in parts),
    )


def pettingzoo_version() -> str | None:
    try:
        import pettingzoo  # optional dependency
    except ImportError:
        return None
    return pettingzoo.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=6.0, help="time budget per contender (all rounds)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, so load drift hits all alike")
    parser.add_argument("--batch", type=int, default=4096, help="games per BoardBatch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--solver-positions", type=int, default=300, help="positions for the solver timing (0: skip)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON results")
    args = parser.parse_args(argv)

    slice_s = args.seconds / args.rounds
    contenders: list[Callable[[int], Measurement]] = [
        lambda seed: bench_batch(slice_s, seed, size=args.batch),
        lambda seed: bench_board(slice_s, seed),
    ]
    version = pettingzoo_version()
    if version is None:
        print("pettingzoo is not installed (pip install pettingzoo pygame); measuring our env only", file=sys.stderr)
    else:
        contenders += [
            lambda seed: bench_pettingzoo(slice_s, seed, raw=False),
            lambda seed: bench_pettingzoo(slice_s, seed, raw=True),
        ]
    rounds = [[run(args.seed + r) for run in contenders] for r in range(args.rounds)]
    results = [merge(list(per_contender)) for per_contender in zip(*rounds)]

    # Ratios against the faster PettingZoo variant, so the wrappers' cost does not flatter us.
    theirs = max((r.moves_per_s for r in results if r.name.startswith("PettingZoo")), default=None)
    print(f"{'contender':<38} {'moves':>12} {'games':>10} {'seconds':>8} {'moves/s':>14} {'vs PZ':>8}")
    for r in results:
        ratio = f"{r.moves_per_s / theirs:.1f}x" if theirs else "-"
        print(f"{r.name:<38} {r.moves:>12,} {r.games:>10,} {r.seconds:>8.2f} {r.moves_per_s:>14,.0f} {ratio:>8}")

    solver = None
    if args.solver_positions > 0:
        solver = bench_solver(args.solver_positions, args.seed, empty=16)
        print(
            f"solve() on {solver['positions']} quiet positions with 16 empty cells: "
            f"mean {solver['mean_s'] * 1e3:.1f} ms, worst {solver['worst_s'] * 1e3:.1f} ms ({solver['worst_position']})"
        )

    report = {
        "unit": "moves per second (one stone placed in one game = one step)",
        "config": {"seconds": args.seconds, "rounds": args.rounds, "batch": args.batch, "seed": args.seed},
        "results": [asdict(r) | {"moves_per_s": r.moves_per_s} for r in results],
        "ratio_batch_vs_pettingzoo": results[0].moves_per_s / theirs if theirs else None,
        "ratio_board_vs_pettingzoo": results[1].moves_per_s / theirs if theirs else None,
        "solver_16_empty": solver,
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "pettingzoo": version},
        "machine": {"processor": platform.processor() or platform.machine(), "system": platform.system()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
