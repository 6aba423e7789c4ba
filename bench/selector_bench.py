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
event. On a GPU the allocator enforces it (a per-process memory fraction; --budget-gib 0 = the whole device): a
step over it is a real out-of-memory error, counted and shown as `oom`, and that mode did not finish the run.
Reported per context range and for the whole run: learner tokens per second per worker, over-budget events,
time spent switching and profiling.

On the GPU machine (no Ray, no vLLM there): `--in-process --workers 1 --preset qwen2.5-0.5b-shape` runs one
trainer worker in this process on a model of Qwen2.5-0.5B's shape with random weights; see bench/gpu_run.sh.

The rollout stage (vLLM engine layouts) has its own bench on the same workload: rollout_selector_bench.py.
With --fsdp, the FSDP layouts too (static modes sharded over the DP ranks, and candidates of auto mode);
bench/fsdp_bench.py measures FSDP's memory against plain DP on a larger model.

    .venv/bin/python bench/selector_bench.py [--contexts 512,1024,2048,4096,8192] [--workers 2] [--budget-gib 1.5]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from bench_io import write_result
from earl_core import events as ev
from earl_core.agent.teacher import protocol_corpus
from earl_core.config import AlgoConfig, ParallelismConfig
from earl_core.models import MODEL_PRESETS, create_model
from earl_core.parallel.memory import GIB, ModelShape
from earl_core.parallel.planner import LayoutPlanner
from selector_workload import LocalTrainer, compare, print_table, static_layouts, summarize, train_through, workload

ROOT = Path(__file__).resolve().parent


def run_mode(name: str, model_dir: Path, iterations: list[list[dict[str, Any]]], limits: list[int], *,
             parallelism: ParallelismConfig, algo: AlgoConfig, workers: int, threads: int, seed: int,
             in_process: bool) -> dict[str, Any]:
    """Train on the workload once with one mode; per-iteration tokens, times, peaks and decisions."""
    events: list[ev.Event] = []
    hf = AutoConfig.from_pretrained(model_dir).to_dict()
    if in_process:
        trainer: Any = LocalTrainer(model_dir, algo, seed)
    else:
        from earl_core.ray_exec.groups import TrainerGroup  # Ray only where the trainer runs on Ray

        trainer = TrainerGroup(str(model_dir), workers=workers, algo=asdict(algo), reference_dir=str(model_dir),
                               seed=seed, num_cpus=threads, tp=parallelism.train_tp,
                               fsdp=parallelism.train_fsdp and parallelism.mode == "static")
    try:
        planner = LayoutPlanner(parallelism, shape=ModelShape.from_hf_config(hf), workers=workers,
                                default_micro_batch=algo.micro_batch, emit=events.append)
        return train_through(name, trainer, planner, events, iterations, limits, seed=seed)
    finally:
        trainer.close()


def device_budget_gib(requested: float) -> float:
    """On a GPU the budget is enforced by the allocator itself (a per-process memory fraction: going over it
    is a real out-of-memory error); 0 means the whole device. On CPU the requested budget is checked against
    measured peaks."""
    if not torch.cuda.is_available():
        return requested
    total = torch.cuda.get_device_properties(0).total_memory
    budget = requested * GIB if requested > 0 else total * 0.97  # what the CUDA context and allocator leave
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    return budget / GIB


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
    p.add_argument("--preset", default="tiny", choices=sorted(MODEL_PRESETS),
                   help="model shape, built locally with random weights (the GPU run: qwen2.5-0.5b-shape)")
    p.add_argument("--fsdp", action="store_true",
                   help="FSDP layouts too: static modes sharded over the DP ranks, and candidates of auto mode "
                        "(parallelism.train_fsdp); needs --workers >= 2")
    p.add_argument("--in-process", action="store_true",
                   help="one trainer worker in this process, no Ray (the GPU machine has no Ray); --workers 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "results" / "selector_bench.json"))
    args = p.parse_args(argv)
    if args.fsdp and args.workers < 2:
        p.error(f"--fsdp shards over data-parallel ranks: --workers must be >= 2, got {args.workers}")
    if args.in_process and args.workers != 1:
        p.error(f"--in-process runs one worker: --workers must be 1, got {args.workers}")
    if torch.cuda.is_available():
        # TF32 tensor cores for the fp32 learner's matrix products, as GPU training runs them (the learner keeps
        # fp32 weights; full-fp32 products would take most of the device time this bench has).
        torch.set_float32_matmul_precision("high")
    args.budget_gib = device_budget_gib(args.budget_gib)

    contexts = [int(c) for c in args.contexts.split(",")]
    micro_batches = [int(m) for m in args.micro_batches.split(",")]
    algo = AlgoConfig(kl_coef=0.05)  # a reference model, so experience = old + reference log-probs
    base = dict(memory_budget_gib=args.budget_gib, micro_batches=args.micro_batches,
                profile_contexts=args.profile_contexts)
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if not args.in_process:
            from earl_core.ray_exec.cluster import ray_cluster

            stack.enter_context(ray_cluster(num_cpus=args.threads * args.workers))
        t = time.perf_counter()
        model_dir = create_model(args.preset, Path(tmp) / "model", corpus=protocol_corpus(400, seed=args.seed),
                                 seed=args.seed)
        print(f"model {args.preset} built in {time.perf_counter() - t:.1f} s", flush=True)
        modes: dict[str, tuple[ParallelismConfig, AlgoConfig]] = {
            "auto": (ParallelismConfig(mode="auto", train_fsdp=args.fsdp, **base), algo)}
        for layout in static_layouts(args.workers, micro_batches, model_dir, fsdp=args.fsdp):
            modes[layout.key] = (
                ParallelismConfig(mode="static", train_tp=layout.tp, checkpointing=layout.checkpointing,
                                  train_fsdp=layout.shard == "fsdp", **base),
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
                                  workers=args.workers, threads=args.threads, seed=args.seed,
                                  in_process=args.in_process)

    summary = {name: summarize(run, contexts, args.workers) for name, run in runs.items()}
    result: dict[str, Any] = {
        "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "args": vars(args), "wall_s": time.perf_counter() - t_start, "summary": summary, "runs": runs,
    }
    comparison = compare(summary, contexts) if "auto" in summary and len(summary) > 1 else None
    if comparison is not None:
        result.update(comparison)
    print_table(summary, contexts, args.workers, args.budget_gib, comparison)
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
