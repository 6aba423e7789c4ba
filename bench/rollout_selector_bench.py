"""rollout_selector_bench: the Parallelism Selector on the rollout stage against every static engine layout, on the
growing-context workload of selector_bench.

The rollout ranks form ``dp`` vLLM engines of ``tp`` tensor-parallel ranks (two ranks: two engines of one rank,
or one engine of two). Each mode builds real engines (the RolloutGroup a run uses, Ray actors, weights handed
over by object reference) and re-runs the workload's games turn by turn on them (RolloutGroup.replay: every
agent turn's prompt, prefix-cached as in a rollout, and the answer's length decoded). Modes: each static layout
and ``parallelism.mode=auto`` (the RolloutPlanner a run uses: it profiles each layout at start-up, rebuilding the
engines in between, then decides before every iteration from the previous iteration's games; a switch rebuilds
the engines and is charged its measured time). Reported per context range and for the whole run: conversation
tokens advanced per second (per worker: divide by the workers), time spent switching and profiling.

    .venv/bin/python bench/rollout_selector_bench.py [--contexts 512,1024,2048,4096,8192] [--workers 2] [--games 8]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from bench_io import write_result
from earl_core import events as ev
from earl_core.agent.teacher import protocol_corpus
from earl_core.config import ParallelismConfig
from earl_core.loop import turn_tokens
from earl_core.models import create_model
from earl_core.parallel.memory import ModelShape
from earl_core.parallel.rollout_planner import RolloutPlanner
from earl_core.ray_exec.cluster import ray_cluster
from earl_core.ray_exec.groups import RolloutGroup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from selector_workload import workload  # noqa: E402 - the same games as the learner's selector bench

ROOT = Path(__file__).resolve().parent
NEW_TOKENS = 16


def run_mode(name: str, model_dir: Path, iterations: list[list[dict[str, Any]]], schedule: list[int], *,
             parallelism: ParallelismConfig, workers: int, max_context: int, weights: list[ray.ObjectRef]) -> dict[str, Any]:
    """Replay the workload once with one mode; per-iteration tokens, seconds and decisions."""
    events: list[ev.Event] = []
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_dir).to_dict())
    games = len(iterations[0])
    planner = RolloutPlanner(parallelism, shape=shape, workers=workers, games=games, engine="vllm",
                             step_tokens=turn_tokens(str(model_dir)), new_tokens=NEW_TOKENS, max_context=max_context,
                             emit=events.append)
    opts = {"kv_cache_gib": 1, "max_model_len": max_context, "seed": 0}
    t = time.perf_counter()
    group = RolloutGroup(str(model_dir), workers=workers, engine="vllm", engine_opts=opts,
                         tp=planner.profile_order()[0])
    built = time.perf_counter() - t
    try:
        group.load_weights(weights)
        # Warm-up, untimed and the same for every mode (first-call costs), on the engines the mode starts with.
        group.replay(iterations[0])
        t = time.perf_counter()
        planner.start(group, built_s=built, weights=lambda: weights)
        if planner.auto:
            group.load_weights(weights)
        profile_s = time.perf_counter() - t if planner.auto else 0.0
        rows = []
        last: list[dict[str, Any]] = []
        for it, records in enumerate(iterations):
            before = len(events)
            t0 = time.perf_counter()
            planner.before_rollout(it, last, len(iterations) - it, group, lambda: weights)
            t1 = time.perf_counter()
            seconds = group.replay(records)
            after = planner.after_rollout(records, seconds)
            last = records
            new = events[before:]
            lengths = [len(r["token_ids"]) for r in records]
            rows.append({"iteration": it, "range": schedule[it], "context_max": max(lengths),
                         "tokens": sum(lengths), "rollout_s": seconds, "decide_s": t1 - t0,
                         "layout": planner.current.key, "predicted_s": after.get("selector/rollout_predicted_s"),
                         "switched": any(isinstance(e, ev.SelectorDecision) and e.switched for e in new)})
            print(f"  {name:>12} it {it:2d} ctx {max(lengths):5d} rollout {seconds:6.2f}s "
                  f"switch {t1 - t0:5.2f}s {planner.current.key}", flush=True)
        return {"mode": name, "profile_s": profile_s, "iterations": rows,
                "logs": [e.message for e in events if isinstance(e, ev.Log)],
                "rebuild_s": {str(k): v for k, v in planner.rebuild_s.items()}}
    finally:
        group.close()


def summarize(run: dict[str, Any], ranges: list[int]) -> dict[str, Any]:
    rows = run["iterations"]
    per_range = {}
    for limit in ranges:
        sel = [r for r in rows if r["range"] == limit]
        per_range[str(limit)] = {"tokens_per_s": sum(r["tokens"] for r in sel) / sum(r["rollout_s"] + r["decide_s"] for r in sel),
                                 "context_max": max(r["context_max"] for r in sel)}
    stage_s = sum(r["rollout_s"] for r in rows)
    switch_s = sum(r["decide_s"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    return {"per_range": per_range, "tokens_per_s": tokens / (stage_s + switch_s),
            "tokens_per_s_with_profiling": tokens / (stage_s + switch_s + run["profile_s"]),
            "switch_s": switch_s, "switch_share": switch_s / (stage_s + switch_s), "profile_s": run["profile_s"],
            "switches": sum(r["switched"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="512,1024,2048,4096,8192", help="context limit of each iteration's games")
    p.add_argument("--repeat", type=int, default=2, help="iterations per context range")
    p.add_argument("--games", type=int, default=8, help="games per iteration")
    p.add_argument("--profile-contexts", default="256,1024,4096", help="auto mode's profile points")
    p.add_argument("--workers", type=int, default=2, help="rollout ranks (one CPU each); their TP x DP split is chosen")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "results" / "rollout_selector_bench.json"))
    args = p.parse_args(argv)

    contexts = [int(c) for c in args.contexts.split(",")]
    schedule = [c for c in contexts for _ in range(args.repeat)]
    max_context = max(contexts) + 256
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(num_cpus=args.workers):
        model_dir = create_model("tiny", Path(tmp) / "model", corpus=protocol_corpus(400, seed=args.seed), seed=args.seed)
        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_dir).to_dict())
        probe = RolloutPlanner(ParallelismConfig(mode="auto"), shape=shape, workers=args.workers, games=args.games,
                               engine="vllm", step_tokens=1, new_tokens=1, max_context=max_context, emit=lambda e: None)
        modes = {"auto": ParallelismConfig(mode="auto", profile_contexts=args.profile_contexts)}
        for tp in probe.options:
            modes[probe.layout(tp).key] = ParallelismConfig(mode="static", rollout_tp=tp)
        t = time.perf_counter()
        iterations = workload(model_dir, schedule, args.games, args.seed)
        print(f"workload: {len(iterations)} iterations x {args.games} games, context max per iteration "
              f"{[max(len(r['token_ids']) for r in recs) for recs in iterations]} ({time.perf_counter() - t:.1f} s)",
              flush=True)
        weights = [ray.put(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict())]
        runs = {}
        for name, parallelism in modes.items():
            print(f"mode {name}", flush=True)
            runs[name] = run_mode(name, model_dir, iterations, schedule, parallelism=parallelism,
                                  workers=args.workers, max_context=max_context, weights=weights)

    summary = {name: summarize(run, contexts) for name, run in runs.items()}
    statics = [n for n in summary if n != "auto"]
    best = max(statics, key=lambda n: summary[n]["tokens_per_s"])
    auto = summary["auto"]
    per_range = {}
    for c in map(str, contexts):
        top = max(statics, key=lambda n: summary[n]["per_range"][c]["tokens_per_s"])
        per_range[c] = {"best_static": top,
                        "ratio": auto["per_range"][c]["tokens_per_s"] / summary[top]["per_range"][c]["tokens_per_s"]}
    result = {"machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__},
              "args": vars(args), "wall_s": time.perf_counter() - t_start, "summary": summary,
              "ratios": {"per_range": per_range, "whole_run": {"best_static": best,
                                                                "ratio": auto["tokens_per_s"] / summary[best]["tokens_per_s"],
                                                                "ratio_with_profiling": auto["tokens_per_s_with_profiling"]
                                                                / summary[best]["tokens_per_s"]}},
              "runs": runs}
    print()
    print(f"rollout: conversation tokens/s of the {args.workers} rollout workers together, by context range")
    print("mode".ljust(14) + "".join(f"{c:>9}" for c in contexts) + "    whole")
    for name, s in summary.items():
        print(f"{name:<14}" + "".join(f"{s['per_range'][str(c)]['tokens_per_s']:9.0f}" for c in contexts)
              + f" {s['tokens_per_s']:8.0f}")
    print(json.dumps({"ratios": result["ratios"], "auto": {k: auto[k] for k in ("switch_s", "switch_share", "profile_s",
                                                                                 "switches")},
                      "rebuild_s": runs["auto"]["rebuild_s"]}, indent=1))
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
