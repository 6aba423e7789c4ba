"""sft_batch_bench: what cutting the warm start's batches by length saves, side by side in one run.

The warm start's own data for a config (`earl_core.loop.warm_start_data`: the teacher's games and the packed one-turn
positions, here --games and --positions of them) goes through one pass of warm-start steps twice, from the same
fresh model and seed: once cut into shuffled batches (`sft.batching: shuffled`, every run before the thirteenth
session) and once into batches of similar length (`by_length`, the default). Each step is the trainer's own
(`Learner.sft_step`, with the trainer's threads), and a batch is padded to its longest conversation, so the gap is
the compute spent on padding.
Reported per mode and per kind (games, positions): seconds, steps, real and padded tokens, the mean loss (the same
data is learnt either way), and the shuffled / by_length time ratios.

    .venv/bin/python bench/sft_batch_bench.py --set game.board_format=cells_stack_checks \\
        --set game.board_view=relative --set sft.mistake_rate=0.3 --set rollout.max_new_tokens=32 --games 200 \\
        --positions 6400
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from bench_io import write_result
from earl_core.agent.chat import ChatEncoder
from earl_core.config import SFT_BATCHINGS, AlgoConfig, load_config
from earl_core.loop import base_model_dir, warm_start_data
from earl_core.rl.batch import sft_batches
from earl_core.rl.learner import Learner

ROOT = Path(__file__).resolve().parent


def one_pass(model_dir: str, items: list[dict[str, Any]], batching: str, *, batch: int, lr: float, seed: int,
             threads: int) -> dict[str, Any]:
    """One pass of warm-start steps over `items` from the fresh model, cut by `batching`."""
    if not items:
        return {"steps": 0, "seconds": 0.0, "real_tokens": 0, "padded_tokens": 0, "mean_loss": None}
    torch.manual_seed(seed)
    learner = Learner(model_dir, algo=AlgoConfig(kl_coef=0.0), seed=seed)
    batches = sft_batches(items, batch, random.Random(seed), batching=batching)
    random.Random(seed).shuffle(batches)  # as the warm start does: kinds and lengths come in mixed order
    torch.set_num_threads(threads)
    losses, started = [], time.perf_counter()
    for chunk in batches:
        losses.append(learner.sft_step(chunk, lr=lr)["sft/loss"])
    seconds = time.perf_counter() - started
    return {"steps": len(batches), "seconds": seconds,
            "real_tokens": sum(len(c["token_ids"]) for c in items),
            "padded_tokens": sum(len(b) * max(len(c["token_ids"]) for c in b) for b in batches),
            "mean_loss": sum(losses) / len(losses)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "learn.yaml"))
    p.add_argument("--set", action="append", default=[], help="config override key=value")
    p.add_argument("--games", type=int, default=200, help="teacher games (sft.games)")
    p.add_argument("--positions", type=int, default=6400, help="one-turn positions (sft.positions)")
    p.add_argument("--output-dir", default="/tmp/earl-sft-batch-bench")
    p.add_argument("--out", default=str(ROOT / "results" / "sft_batch_bench.json"))
    args = p.parse_args(argv)
    if args.games < 1 or args.positions < 0:
        p.error("--games must be >= 1 and --positions >= 0")

    cfg = load_config(args.config, [*args.set, f"sft.games={args.games}", f"sft.positions={args.positions}",
                                    f"output_dir={args.output_dir}"])
    model_dir = base_model_dir(cfg)
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(model_dir))
    started = time.perf_counter()
    games, positions = warm_start_data(cfg, encoder)
    print(f"{len(games)} games and {len(positions)} position conversations prepared in "
          f"{time.perf_counter() - started:.0f} s", flush=True)

    modes: dict[str, dict[str, Any]] = {}
    for batching in SFT_BATCHINGS:
        modes[batching] = {kind: one_pass(model_dir, items, batching, batch=cfg.sft.batch, lr=cfg.sft.lr,
                                          seed=cfg.seed, threads=cfg.trainer_cpus)
                           for kind, items in (("games", games), ("positions", positions))}
        for kind, row in modes[batching].items():
            if row["steps"]:
                print(f"{batching:>9} {kind:>9}: {row['steps']} steps in {row['seconds']:.1f} s, padded / real "
                      f"tokens {row['padded_tokens'] / row['real_tokens']:.2f}, mean loss {row['mean_loss']:.3f}",
                      flush=True)

    def ratio(kind: str | None) -> float | None:
        kinds = [kind] if kind else ["games", "positions"]
        fast = sum(modes["by_length"][k]["seconds"] for k in kinds)
        return sum(modes["shuffled"][k]["seconds"] for k in kinds) / fast if fast else None

    ratios = {"games": ratio("games"), "positions": ratio("positions"), "all": ratio(None)}
    print("shuffled / by_length time: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v), flush=True)
    write_result({"bench": "sft_batch_bench", "args": vars(args), "batch": cfg.sft.batch,
                  "threads": cfg.trainer_cpus, "board_format": cfg.game.board_format, "modes": modes,
                  "shuffled_over_by_length": ratios, "machine": platform.processor() or platform.machine(),
                  "python": sys.version.split()[0], "torch": torch.__version__}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
