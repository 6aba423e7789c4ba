"""selector_bench: the Parallelism Selector against every static layout, on one workload whose context grows.

The workload is one run's worth of real Connect Four conversations (agent protocol, heuristic moves against a
random opponent) from an agent that "thinks" before each answer: its answers carry a filler whose length, and the
context limit, grow from iteration to iteration (by default 512 -> 8192 tokens per game). The same games are then
trained on, iteration after iteration, by fresh trainer workers (the real Ray actors, Learner and LayoutPlanner a
training run uses; experience = old and reference log-probs, train = a PPO/KL step) once per mode:

- every static layout the trainer can run: each TP x DP split of the workers (DP=2 or TP=2 for two workers),
  each micro-batch, activation checkpointing off and on; and
- `parallelism.mode=auto`, which profiles all of them at start-up (switching the split in memory between TP
  degrees, timed), then re-picks each stage's layout before every iteration.

Every mode runs under the same per-worker memory budget: a measured peak over it is counted as an over-budget
event (on a GPU it would have been an out-of-memory failure). Reported per context range and for the whole run:
learner tokens per second per worker, over-budget events, time spent switching and profiling.

The rollout stage (vLLM engine layouts) has its own bench on the same workload: rollout_selector_bench.py.
Not covered: FSDP layouts (static only; bench/fsdp_bench.py measures them).

    .venv/bin/python bench/selector_bench.py [--contexts 512,1024,2048,4096,8192] [--workers 2] [--budget-gib 1.5]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer

from bench_io import write_result
from earl_core import events as ev
from earl_core.agent import protocol
from earl_core.agent.chat import ChatEncoder
from earl_core.agent.episode import Episode
from earl_core.agent.runner import GameSpec, RunnerLimits, play_episodes
from earl_core.agent.teacher import protocol_corpus
from earl_core.config import AlgoConfig, ParallelismConfig
from earl_core.engines.base import Generation
from earl_core.env.opponents import HeuristicOpponent, RandomOpponent
from earl_core.models import create_model
from earl_core.parallel.layout import Layout
from earl_core.parallel.memory import GIB, ModelShape
from earl_core.parallel.planner import LayoutPlanner
from earl_core.ray_exec.cluster import ray_cluster
from earl_core.ray_exec.groups import TrainerGroup

ROOT = Path(__file__).resolve().parent
FILLER = "let me look at each column and the threats on the board before I answer "


def thinking_policy(encoder: ChatEncoder, think_tokens: int, seed: int):  # noqa: ANN201 - a runner Policy
    """Heuristic moves, each answer preceded by ``think_tokens`` tokens of thinking (trained on like any
    agent token, as a thinking agent's would be)."""
    rng = random.Random(seed)
    teacher = HeuristicOpponent()
    filler = encoder.tokenizer.encode(FILLER * (1 + think_tokens // 8), add_special_tokens=False)[:think_tokens]

    def act(episodes: list[Episode]) -> list[Generation]:
        out = []
        for ep in episodes:
            answer = encoder.tokenizer.encode(" " + protocol.answer_text(teacher.choose(ep.board, rng)),
                                              add_special_tokens=False)
            ids = filler + answer + [encoder.im_end]
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        return out

    return act


def workload(model_dir: Path, contexts: list[int], games: int, seed: int) -> list[list[dict[str, Any]]]:
    """One list of game records per iteration; iteration i's games run until the context limit contexts[i]
    (a game stops at the first turn whose answer would not fit; the protocol's first turn alone is ~300
    tokens, so that is the shortest game there is)."""
    encoder = ChatEncoder(AutoTokenizer.from_pretrained(model_dir))
    out = []
    for i, limit in enumerate(contexts):
        think = max(0, limit // 12 - 8)  # long enough that games reach the limit instead of ending early
        specs = [GameSpec(index=g, group=g // 2, agent_side=1 + g % 2, opponent=RandomOpponent(), seed=seed + 1000 * i + g)
                 for g in range(games)]
        limits = RunnerLimits(max_invalid=1, max_context=limit, max_new_tokens=think + 16)
        episodes = play_episodes(specs, thinking_policy(encoder, think, seed + i), encoder, limits=limits)
        out.append([ep.record() for ep in episodes])
    return out


def static_layouts(workers: int, micro_batches: list[int], model_dir: Path) -> list[Layout]:
    """Every layout of the train stage the trainer can run: each TP x DP split of the workers the model allows,
    each micro-batch, activation checkpointing off and on (the experience stage uses the same split and
    micro-batch)."""
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_dir).to_dict())
    planner = LayoutPlanner(ParallelismConfig(mode="auto", micro_batches=",".join(map(str, micro_batches))),
                            shape=shape, workers=workers, default_micro_batch=1, emit=lambda e: None)
    return sorted(planner.candidates("train"), key=lambda c: (c.tp, c.micro_batch, c.checkpointing))


def run_mode(name: str, model_dir: Path, iterations: list[list[dict[str, Any]]], limits: list[int], *,
             parallelism: ParallelismConfig, algo: AlgoConfig, workers: int, threads: int, seed: int) -> dict[str, Any]:
    """Train on the workload once with one mode; per-iteration tokens, times, peaks and decisions."""
    events: list[ev.Event] = []
    hf = AutoConfig.from_pretrained(model_dir).to_dict()
    trainer = TrainerGroup(str(model_dir), workers=workers, algo=asdict(algo), reference_dir=str(model_dir), seed=seed,
                           num_cpus=threads, tp=parallelism.train_tp)
    try:
        planner = LayoutPlanner(parallelism, shape=ModelShape.from_hf_config(hf), workers=workers,
                                default_micro_batch=algo.micro_batch, emit=events.append)
        # Warm-up, untimed and the same for every mode: one step on the first iteration's games, so no mode is
        # charged for first-call costs (thread pools, allocator growth).
        trainer.rl_step(iterations[0], [0.0] * len(iterations[0]))
        t = time.perf_counter()
        planner.start(trainer)
        profile_s = time.perf_counter() - t if parallelism.mode == "auto" else 0.0
        rows = []
        adv_rng = random.Random(seed)
        for it, records in enumerate(iterations):
            before = len(events)
            t0 = time.perf_counter()
            planner.before_iteration(it, records, len(iterations) - it, trainer)
            t1 = time.perf_counter()
            # Advantages: seeded +-1 per game. What is measured is the work of a step, not learning.
            adv = [adv_rng.choice((-1.0, 1.0)) for _ in records]
            metrics = trainer.rl_step(records, adv)
            after = planner.after_iteration(metrics, records)
            new = events[before:]
            lengths = [len(r["token_ids"]) for r in records]
            rows.append({
                "iteration": it,
                "range": limits[it],
                "context_max": max(lengths),
                "context_mean": sum(lengths) / len(lengths),
                "tokens": sum(lengths),
                "experience_s": metrics["perf/experience_s"],
                "train_s": metrics["perf/train_s"],
                "decide_s": t1 - t0,
                "experience_peak_gib": metrics["memory/experience_peak_bytes"] / GIB,
                "train_peak_gib": metrics["memory/train_peak_bytes"] / GIB,
                "over_budget": sum(1 for e in new if isinstance(e, ev.Error)),
                "layouts": {s: planner.current[s].key for s in ("experience", "train")},
                "switched": [e.stage for e in new if isinstance(e, ev.SelectorDecision) and e.switched],
                "selector_micro_batch": {k: v for k, v in after.items() if k.endswith("_micro_batch")},
            })
            print(f"  {name:>16} it {it:2d} ctx {max(lengths):5d} exp {rows[-1]['experience_s']:6.2f}s "
                  f"train {rows[-1]['train_s']:6.2f}s peak {max(rows[-1]['experience_peak_gib'], rows[-1]['train_peak_gib']):.2f} GiB "
                  f"{rows[-1]['layouts']['train']}{' OVER' if rows[-1]['over_budget'] else ''}", flush=True)
        logs = [e.message for e in events if isinstance(e, ev.Log)]
        return {"mode": name, "profile_s": profile_s, "iterations": rows, "logs": logs}
    finally:
        trainer.close()


def summarize(run: dict[str, Any], ranges: list[int], workers: int) -> dict[str, Any]:
    rows = run["iterations"]
    per_range = {}
    for limit in ranges:
        sel = [r for r in rows if r["range"] == limit]
        seconds = sum(r["experience_s"] + r["train_s"] for r in sel)
        per_range[str(limit)] = {
            "tokens_per_s": sum(r["tokens"] for r in sel) / seconds,
            "tokens_per_s_per_worker": sum(r["tokens"] for r in sel) / seconds / workers,
            "over_budget": sum(r["over_budget"] for r in sel),
            "context_max": max(r["context_max"] for r in sel),
            "context_mean": sum(r["context_mean"] for r in sel) / len(sel),
        }
    stage_s = sum(r["experience_s"] + r["train_s"] for r in rows)
    switch_s = sum(r["decide_s"] for r in rows)
    total_s = stage_s + switch_s
    return {
        "per_range": per_range,
        "tokens_per_s": sum(r["tokens"] for r in rows) / total_s,
        "tokens_per_s_per_worker": sum(r["tokens"] for r in rows) / total_s / workers,
        "tokens_per_s_with_profiling": sum(r["tokens"] for r in rows) / (total_s + run["profile_s"]),
        "over_budget": sum(r["over_budget"] for r in rows),
        "switch_s": switch_s,
        "switch_share": switch_s / total_s,
        "profile_s": run["profile_s"],
        "max_peak_gib": max(max(r["experience_peak_gib"], r["train_peak_gib"]) for r in rows),
        "switches": sum(len(r["switched"]) for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="512,1024,2048,4096,8192",
                   help="context limit of each iteration's games, in order (the run's growth)")
    p.add_argument("--repeat", type=int, default=2, help="iterations per context range")
    p.add_argument("--games", type=int, default=8, help="games per iteration")
    p.add_argument("--micro-batches", default="1,2,4,8", help="micro-batch sizes of the static and auto candidates")
    p.add_argument("--profile-contexts", default="256,1024,4096", help="auto mode's profile points")
    p.add_argument("--budget-gib", type=float, default=1.5, help="memory budget per trainer worker")
    p.add_argument("--workers", type=int, default=2, help="trainer workers (ranks); their TP x DP split is chosen")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of each trainer worker")
    p.add_argument("--modes", default="", help="comma-separated subset, e.g. auto,tp1.dp2.mb4,tp2.dp1.mb8+ckpt "
                                               "(default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "results" / "selector_bench.json"))
    args = p.parse_args(argv)

    contexts = [int(c) for c in args.contexts.split(",")]
    micro_batches = [int(m) for m in args.micro_batches.split(",")]
    algo = AlgoConfig(kl_coef=0.05)  # a reference model, so experience = old + reference log-probs
    base = dict(memory_budget_gib=args.budget_gib, micro_batches=args.micro_batches,
                profile_contexts=args.profile_contexts)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(num_cpus=args.threads * args.workers):
        model_dir = create_model("tiny", Path(tmp) / "model", corpus=protocol_corpus(400, seed=args.seed), seed=args.seed)
        modes: dict[str, tuple[ParallelismConfig, AlgoConfig]] = {
            "auto": (ParallelismConfig(mode="auto", **base), algo)}
        for layout in static_layouts(args.workers, micro_batches, model_dir):
            modes[layout.key] = (
                ParallelismConfig(mode="static", train_tp=layout.tp, checkpointing=layout.checkpointing, **base),
                AlgoConfig(**{**asdict(algo), "micro_batch": layout.micro_batch}))
        wanted = [m for m in args.modes.split(",") if m] or list(modes)
        unknown = sorted(set(wanted) - set(modes))
        if unknown:
            p.error(f"--modes: unknown {unknown} (allowed: {', '.join(modes)})")
        t = time.perf_counter()
        schedule = [c for c in contexts for _ in range(args.repeat)]
        iterations = workload(model_dir, schedule, args.games, args.seed)
        print(f"workload: {len(iterations)} iterations x {args.games} games, context max per iteration "
              f"{[max(len(r['token_ids']) for r in recs) for recs in iterations]} ({time.perf_counter() - t:.1f} s)",
              flush=True)
        runs = {}
        for name in wanted:
            parallelism, mode_algo = modes[name]
            print(f"mode {name}", flush=True)
            runs[name] = run_mode(name, model_dir, iterations, schedule, parallelism=parallelism, algo=mode_algo,
                                  workers=args.workers, threads=args.threads, seed=args.seed)

    summary = {name: summarize(run, contexts, args.workers) for name, run in runs.items()}
    statics = [n for n in summary if n != "auto"]
    result: dict[str, Any] = {
        "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__},
        "args": vars(args), "wall_s": time.perf_counter() - t_start, "summary": summary, "runs": runs,
    }
    if "auto" in summary and statics:
        auto = summary["auto"]
        ratios: dict[str, Any] = {"per_range": {}}
        for limit in map(str, contexts):
            within = [n for n in statics if summary[n]["per_range"][limit]["over_budget"] == 0]
            best = max(within, key=lambda n: summary[n]["per_range"][limit]["tokens_per_s"]) if within else None
            ratios["per_range"][limit] = {
                "best_static_within_budget": best,
                "ratio": auto["per_range"][limit]["tokens_per_s"] / summary[best]["per_range"][limit]["tokens_per_s"]
                if best else None,
            }
        clean = [n for n in statics if summary[n]["over_budget"] == 0]
        best_clean = max(clean, key=lambda n: summary[n]["tokens_per_s"]) if clean else None
        best_any = max(statics, key=lambda n: summary[n]["tokens_per_s"])
        ratios["whole_run_vs_best_static_within_budget"] = {
            "layout": best_clean,
            "ratio": auto["tokens_per_s"] / summary[best_clean]["tokens_per_s"] if best_clean else None,
            "ratio_with_profiling": auto["tokens_per_s_with_profiling"] / summary[best_clean]["tokens_per_s"]
            if best_clean else None}
        ratios["whole_run_vs_fastest_static_any"] = {
            "layout": best_any, "over_budget": summary[best_any]["over_budget"],
            "ratio": auto["tokens_per_s"] / summary[best_any]["tokens_per_s"]}
        per_range_ok = all(r["ratio"] is not None and r["ratio"] >= 0.95 for r in ratios["per_range"].values())
        result["ratios"] = ratios
        result["targets"] = {
            "per_range_ge_0.95x_best_static": per_range_ok,
            "whole_run_ge_1.15x_best_static": bool(best_clean) and ratios["whole_run_vs_best_static_within_budget"]["ratio"] >= 1.15,
            "zero_over_budget_while_a_static_has_some": auto["over_budget"] == 0 and any(summary[n]["over_budget"] for n in statics),
            "switching_le_5pct": auto["switch_share"] <= 0.05,
        }

    print()
    header = "mode".ljust(18) + "".join(f"{c:>9}" for c in contexts) + "    whole  over  maxGiB"
    print(f"learner tokens/s of the {args.workers} trainer workers together (divide by {args.workers} for per worker), "
          "by context range")
    print(header)
    for name, s in summary.items():
        cells = "".join(f"{s['per_range'][str(c)]['tokens_per_s']:8.0f}{'!' if s['per_range'][str(c)]['over_budget'] else ' '}"
                        for c in contexts)
        print(f"{name:<18}{cells} {s['tokens_per_s']:8.0f} {s['over_budget']:5d} {s['max_peak_gib']:7.2f}")
    print("(! = a measured peak over the budget of %.2f GiB in that range)" % args.budget_gib)
    if "ratios" in result:
        print(json.dumps({"ratios": result["ratios"], "targets": result["targets"],
                          "auto": {k: summary["auto"][k] for k in ("switch_s", "switch_share", "profile_s", "switches")}},
                         indent=1))
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
