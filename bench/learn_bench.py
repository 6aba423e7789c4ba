"""learn_bench: does a fresh tiny model learn Connect Four on this machine within the time budget?

Trains with the real pipeline (local Ray, vLLM rollout workers, trainer workers): an SFT warm start, then RL.
Then evaluates, greedily, the warm-started checkpoint and the final one: against random as first and second player,
and against the heuristic. Every intermediate checkpoint is evaluated against the heuristic for the curve. Greedy
play against the heuristic (nearly deterministic) repeats a few games, so both checkpoints also play it sampled at
the training temperature: the lift of the policy RL trains, reported beside the greedy one.
Prints a table and writes JSON.

    .venv/bin/python bench/learn_bench.py [--config bench/configs/learn.yaml] [--random-games 1000]

`--from-warm-start RUN_DIR` compares RL settings on one starting point: it copies an earlier learn_bench run's
fresh model and warm-started checkpoint 0 (`RUN_DIR` is that run's `<output-dir>/<name>`) and resumes from there, so
only RL runs. Its training time then leaves the warm start out, and the time budget is not checked (null).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench_io import write_result
from earl_core.config import AlgoConfig, load_config
from earl_core.agent.runner import RunnerLimits
from earl_core.evaluate import evaluate_checkpoint, run_limits
from earl_core.loop import train
from earl_core.rl.learner import Learner

ROOT = Path(__file__).resolve().parent


def _eval(ckpt: str, opponent: str, games: int, seed: int, limits: RunnerLimits,
          temperature: float = 0.0) -> dict[str, Any]:
    t = time.perf_counter()
    res = evaluate_checkpoint(ckpt, opponent=opponent, games=games, seed=seed, limits=limits, temperature=temperature)
    return {**{k: v.as_dict() for k, v in res.items()}, "seconds": time.perf_counter() - t}


def reference_step_seconds(model_dir: Path, threads: int, *, batch: int = 8, tokens: int = 2048,
                           repeats: int = 5) -> float:
    """Median seconds of one forward + backward pass of the run's fresh model on `batch` x `tokens` random tokens
    with `threads` threads (a warm-start step is about this), timed by the trainer's own profiling pass. The same
    work on every VM, so training times measured on different VMs can be put side by side."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        learner = Learner(model_dir, algo=AlgoConfig(kl_coef=0.0))  # no reference model: only the policy is timed
        # The first pass warms up the kernels and is dropped.
        times = [learner.profile("train", batch, tokens)["seconds"] for _ in range(repeats + 1)][1:]
        return sorted(times)[repeats // 2]
    finally:
        torch.set_num_threads(previous)


def timing(metrics: list[dict[str, Any]], train_s: float, reference_s: float) -> dict[str, Any]:
    """Where the training time went: preparing the warm start's data, its steps, and the RL iterations."""
    sft = [m["values"] for m in metrics if "sft/seconds" in m["values"]]
    rl = [m["values"]["perf/iteration_s"] for m in metrics if "perf/iteration_s" in m["values"]]
    prepare_s = sft[0]["sft/prepare_seconds"] if sft else 0.0
    steps_s = sum(v["sft/seconds"] for v in sft)
    steps = int(sum(v["sft/steps"] for v in sft))
    return {"warm_start_prepare_s": prepare_s, "warm_start_steps_s": steps_s, "warm_start_steps": steps,
            "s_per_warm_start_step": steps_s / steps if steps else None,
            "rl_iterations": len(rl), "rl_iterations_s": sum(rl),
            "s_per_rl_iteration": sum(rl) / len(rl) if rl else None,
            "other_s": train_s - prepare_s - steps_s - sum(rl),  # start-up, weight syncs, checkpoints
            "reference_step_s": reference_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "learn.yaml"))
    p.add_argument("--set", action="append", default=[], help="config override key=value")
    p.add_argument("--output-dir", default="/tmp/earl-learn-bench")
    p.add_argument("--random-games", type=int, default=1000, help="games per side against random")
    p.add_argument("--heuristic-games", type=int, default=500, help="games per side against the heuristic")
    p.add_argument("--curve-games", type=int, default=200, help="games per side for intermediate checkpoints")
    p.add_argument("--sampled-games", type=int, default=500,
                   help="games per side against the heuristic sampled at the training temperature")
    p.add_argument("--budget-min", type=float, default=20.0, help="training wall-time budget (minutes)")
    p.add_argument("--out", default=str(ROOT / "results" / "learn_bench.json"))
    p.add_argument("--from-warm-start", metavar="RUN_DIR",
                   help="resume from this earlier run's checkpoint 0 (its warm start) and run only RL")
    args = p.parse_args(argv)

    cfg = load_config(args.config, [*args.set, f"output_dir={args.output_dir}"])
    if args.from_warm_start:
        source = Path(args.from_warm_start)
        start = source / "checkpoints" / "iter_000000"
        if not (start / "config.json").exists() or not (source / "base_model" / "config.json").exists():
            p.error(f"--from-warm-start: {source} holds no base_model and checkpoints/iter_000000 (a learn_bench "
                    "run folder with a warm start is needed)")
        if cfg.run_dir.exists():
            p.error(f"--from-warm-start: {cfg.run_dir} exists; give a fresh --output-dir")
        shutil.copytree(source / "base_model", cfg.run_dir / "base_model")
        shutil.copytree(start, cfg.run_dir / "checkpoints" / "iter_000000")
    metrics: list[dict[str, Any]] = []

    def sink(envelope: dict[str, Any]) -> None:
        if envelope["type"] == "metrics":
            metrics.append(envelope["data"])
        elif envelope["type"] in ("log", "run.status"):
            print(f"[{envelope['type']}] {envelope['data']}", flush=True)

    t0 = time.perf_counter()
    summary = train(cfg, sink, resume=bool(args.from_warm_start))
    train_s = time.perf_counter() - t0
    ckpts = sorted(str(c) for c in (cfg.run_dir / "checkpoints").glob("iter_*") if not c.name.endswith(".tmp"))
    start_ckpt, final_ckpt = ckpts[0], ckpts[-1]
    limits = run_limits(cfg)
    temperature = cfg.rollout.temperature

    reference_s = reference_step_seconds(cfg.run_dir / "base_model", cfg.trainer_cpus)
    results: dict[str, Any] = {"config": cfg.to_dict(), "train_seconds": train_s, "checkpoints": ckpts,
                               "from_warm_start": args.from_warm_start,
                               "timing": timing(metrics, train_s, reference_s)}
    results["start"] = {"checkpoint": start_ckpt,
                        "vs_random": _eval(start_ckpt, "random", args.random_games, 1, limits),
                        "vs_heuristic": _eval(start_ckpt, "heuristic", args.heuristic_games, 2, limits),
                        "vs_heuristic_sampled": _eval(start_ckpt, "heuristic", args.sampled_games, 4, limits,
                                                      temperature)}
    results["final"] = {"checkpoint": final_ckpt,
                        "vs_random": _eval(final_ckpt, "random", args.random_games, 1, limits),
                        "vs_heuristic": _eval(final_ckpt, "heuristic", args.heuristic_games, 2, limits),
                        "vs_heuristic_sampled": _eval(final_ckpt, "heuristic", args.sampled_games, 4, limits,
                                                      temperature)}
    results["curve"] = [{"checkpoint": c, "vs_heuristic": _eval(c, "heuristic", args.curve_games, 3, limits)} for c in ckpts[1:-1]]
    results["training_metrics"] = metrics

    def both(r: dict[str, Any]) -> float:
        return (r["first"]["wins"] + r["second"]["wins"]) / (r["first"]["games"] + r["second"]["games"])

    start_h, final_h = both(results["start"]["vs_heuristic"]), both(results["final"]["vs_heuristic"])
    start_hs = both(results["start"]["vs_heuristic_sampled"])
    final_hs = both(results["final"]["vs_heuristic_sampled"])
    targets = {
        "train_within_budget": None if args.from_warm_start else train_s <= args.budget_min * 60,
        "vs_random_first_ge_0.95": results["final"]["vs_random"]["first"]["win_rate"] >= 0.95,
        "vs_random_second_ge_0.90": results["final"]["vs_random"]["second"]["win_rate"] >= 0.90,
        "rl_lift_vs_heuristic_ge_20pts_or_ge_0.90": (final_h - start_h) >= 0.20 or final_h >= 0.90,
        "rl_lift_vs_heuristic_sampled_ge_20pts_or_ge_0.90": (final_hs - start_hs) >= 0.20 or final_hs >= 0.90,
    }
    results["vs_heuristic_start"] = start_h
    results["vs_heuristic_final"] = final_h
    results["vs_heuristic_sampled_start"] = start_hs
    results["vs_heuristic_sampled_final"] = final_hs
    results["targets"] = targets

    print(f"\ntraining wall time: {train_s / 60:.1f} min (budget {args.budget_min:.0f} min"
          + (f"; RL only, warm start from {args.from_warm_start}" if args.from_warm_start else "")
          + f"), status {summary.status}")
    t = results["timing"]
    if t["warm_start_steps"]:
        print(f"  warm start: data {t['warm_start_prepare_s'] / 60:.1f} min, {t['warm_start_steps']} steps in"
              f" {t['warm_start_steps_s'] / 60:.1f} min ({t['s_per_warm_start_step']:.2f} s a step)")
    if t["rl_iterations"]:
        print(f"  RL: {t['rl_iterations']} iterations in {t['rl_iterations_s'] / 60:.1f} min"
              f" ({t['s_per_rl_iteration']:.1f} s each); the rest {t['other_s'] / 60:.1f} min")
    print(f"  this machine: {t['reference_step_s']:.2f} s for the reference step (8 x 2,048 tokens, forward +"
          f" backward, {cfg.trainer_cpus} threads)")
    print(f"{'checkpoint':<28}{'opponent':<16}{'first':>8}{'second':>8}   (win rates; greedy unless T is given)")
    for label in ("start", "final"):
        for opp in ("vs_random", "vs_heuristic", "vs_heuristic_sampled"):
            r = results[label][opp]
            print(f"{Path(results[label]['checkpoint']).name + ' (' + label + ')':<28}"
                  f"{opp[3:].replace('heuristic_sampled', f'heuristic, T={temperature:g}'):<16}"
                  f"{r['first']['win_rate']:>8.3f}{r['second']['win_rate']:>8.3f}")
    for point in results["curve"]:
        r = point["vs_heuristic"]
        print(f"{Path(point['checkpoint']).name:<28}{'heuristic':<16}{r['first']['win_rate']:>8.3f}{r['second']['win_rate']:>8.3f}")
    print("\nwhy the final checkpoint lost:")
    for opp in ("vs_random", "vs_heuristic", "vs_heuristic_sampled"):
        for side in ("first", "second"):
            causes = results["final"][opp][side]["loss_causes"]
            print(f"  {opp[3:]:<20}{side:<7}" + (", ".join(f"{n} {c}" for c, n in causes.items()) or "no losses"))
    print("\nRL iterations (training opponent, sampled play):")
    for m in metrics:
        v = m["values"]
        if "rollout/win_rate" in v:
            print(f"  iter {m['iteration']:3d}  win {v['rollout/win_rate']:.3f}  reward {v['rollout/reward_mean']:+.3f}"
                  f"  invalid {v['rollout/invalid_rate']:.3f}  ctx mean {v.get('context/mean', 0):.0f}"
                  f"  iter_s {v['perf/iteration_s']:.1f}")
    print("\ntargets:", json.dumps(targets, indent=2))
    write_result(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
